"""Acting on alerts: when to take a node out, the actuators that do it (Slurm, Kubernetes, webhook)
and the spares readied before it."""
