"""Runnable examples of faultcast in training jobs (see each file's docstring for how to run it)."""
