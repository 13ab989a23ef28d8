"""Training jobs the harnesses launch under torchrun (scripts, run by path)."""
