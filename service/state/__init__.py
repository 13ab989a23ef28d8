"""The service's durable state in `--state-dir`: one SQLite database, one module per concern, and the
sample journal."""
