"""The feature engine as it was before its vectorised rewrite (commit 69914e7), frozen: the reference the
fast engine is compared with, bit for bit (tests/test_features_speed.py), and the "before" of
bench/feature_path.py. Not used by faultcast itself; never edit it to follow the engine."""
