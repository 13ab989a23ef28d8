"""The service's rolling archive of what it scored, in the training data format (writer.py)."""
