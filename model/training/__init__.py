"""Training: labelled rows from failure logs, the booster, calibration and fleet thresholds."""
