"""faultcast: predict GPU and network faults in training clusters and act on each prediction."""

__version__ = "0.1.0"
