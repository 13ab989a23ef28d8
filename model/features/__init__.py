"""The one feature implementation, offline over tables and online per sample: rolling windows,
relative and in-step features, and the groups the visibility report names."""
