"""Attacks and faults from an adversarial probe, each reproduced as described: what a
caller sends, what a disk or a crash does, must never silence alerting. `make test` runs them with
the rest; `pytest tests/attacks` runs them alone."""
