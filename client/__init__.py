"""faultcast in the training job: the Guard that turns alerts into snapshots."""

from faultcast.client.guard import Guard

__all__ = ["Guard"]
