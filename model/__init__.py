"""Streaming features and the failure-prediction model (issue: failure-prediction model)."""
