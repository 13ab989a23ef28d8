"""faultcast in the training job: the Guard that turns alerts into snapshots, and the training-loop
hook (`protect`) that takes them on every rank at the same step and resumes from them exactly.

The Guard alone needs only grpcio; everything else needs PyTorch (`pip install faultcast[train]`)."""

from typing import TYPE_CHECKING

from faultcast.client.guard import Guard

if TYPE_CHECKING:
    from faultcast.client.protection import Protection, protect
    from faultcast.client.sampler import ResumableDistributedSampler
    from faultcast.client.train_state import TrainState

__all__ = ["Guard", "Protection", "ResumableDistributedSampler", "TrainState", "protect"]


def __getattr__(name: str) -> object:
    # PyTorch is imported only when its parts are asked for: a Guard-only user need not install it.
    if name in ("Protection", "protect"):
        from faultcast.client import protection

        return getattr(protection, name)
    if name == "TrainState":
        from faultcast.client.train_state import TrainState

        return TrainState
    if name == "ResumableDistributedSampler":
        from faultcast.client.sampler import ResumableDistributedSampler

        return ResumableDistributedSampler
    raise AttributeError(f"module 'faultcast.client' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy names too: what `__all__` offers is listed whether or not it was loaded yet.
    return sorted({*globals(), *__all__})
