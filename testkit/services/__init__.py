"""Real services on loopback ports for the tests, the benchmarks and the demo."""
