"""Spares: the replacement readied while the doomed node still works (Slurm, Kubernetes, webhook)."""
