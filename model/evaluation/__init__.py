"""Evaluation: held-out figures with intervals and baselines at the model's false-alarm rate, the
ceiling, drift and what a model can see of a fleet's data."""
