"""The per-node collector: sources (NVML, network, simulated), the Prometheus exporter and gRPC shipping."""
