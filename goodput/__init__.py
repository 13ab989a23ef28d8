"""The goodput twin: what predictive snapshot-and-migrate saves a long training job, in effective
training time, against periodic checkpointing alone. docs/goodput.md explains the model."""
