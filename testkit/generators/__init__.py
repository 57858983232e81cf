"""Generators of Flight Recorder dumps for the tests and benchmarks: real Gloo runs, simulated NCCL jobs, synthetic sets at scale."""
