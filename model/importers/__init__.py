"""Real history in: Prometheus range-query exports and running servers, failure logs from kernel logs
and Slurm, laid on the time grid the features read."""
