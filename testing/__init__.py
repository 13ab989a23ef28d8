"""Test doubles and harnesses for the suite and the benchmarks, never imported by the product: a
fake NVML at the pynvml boundary, a local Slurm cluster, hand-over and elastic job flows, system
parts and ports."""
