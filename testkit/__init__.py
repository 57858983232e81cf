"""Denpex's test kit: what the tests, the benchmarks and the demo run against, kept out of the
shipped package.

- ``testkit.generators``: programs that write Flight Recorder dumps, real ones from Gloo processes
  (``gloo_scenarios``, ``gloo_cases``) and NCCL-format ones from a simulation (``nccl_fixtures``,
  ``nccl_moe``), and synthetic sets at scale (``expansion``);
- ``testkit.services``: real services on loopback ports, each started and stopped by the caller:
  the Slurm lab (``slurm``), ``prefect server start`` (``prefect``), PostgreSQL (``postgres``),
  moto's S3 (``s3``), ``denpex serve-api`` (``ingest``), a fault-injecting TCP proxy
  (``tcp_proxy``), and the port and HTTP helpers they share (``net``);
- ``testkit.fakes``: stand-ins where a real service cannot run here: a Kubernetes API server
  (``k8s_api``), NVML (``pynvml``), a loopback PKI (``tls_certs``).

It is not shipped: ``pip install .`` packages ``denpex*`` only. Like ``flows/``, ``tasks/`` and
``blocks/`` it is imported from the repository root (pyproject.toml's pytest ``pythonpath`` puts the
root on ``sys.path``; the benchmarks and ``scripts/demo.py`` do the same), and a child process that runs
a generator (``python -m testkit.generators.gloo_worker``) is given the root on ``PYTHONPATH``.
"""
