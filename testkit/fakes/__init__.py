"""Stand-ins for services that cannot run here: a Kubernetes API server, NVML, a loopback PKI."""
