"""A `DistributedSampler` that remembers where it is in the epoch, so a resumed job reads the very next
sample instead of starting the epoch over (or skipping the rest of it).

The position is the number of indices this rank's sampler has handed out in the current epoch. With
`num_workers=0` (the loader fetches indices only when the loop asks for a batch) that is exactly what
the loop consumed. With worker processes the loader prefetches `prefetch_factor * num_workers` batches,
so the count runs ahead of the loop by those; such a loop should record the position itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler[int]):
    """`state_dict()` gives {"epoch", "offset"}; after `load_state_dict()` the next iteration of that
    epoch starts at the offset. `set_epoch` to a different epoch forgets a pending offset."""

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        """DistributedSampler's arguments, unchanged; `dataset` needs only a length (indices are drawn
        from range(len(dataset)))."""
        # torch annotates `dataset` as a Dataset, yet reads only its len().
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last)  # type: ignore[arg-type]
        self.offset = 0  # indices handed out in this epoch
        self._resume_at = 0

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler's (the shuffle's seed); a different epoch than the current one also
        drops the offset, so a resumed epoch is not resumed again in the next."""
        if epoch != self.epoch:
            self._resume_at = self.offset = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self._resume_at = self._resume_at, 0
        self.offset = start
        for index in indices[start:]:
            self.offset += 1
            yield index

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "offset"}: the epoch and how many of its indices this rank has handed out."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume `state`'s epoch at its offset on the next iteration; ValueError for an offset outside
        this rank's share of the epoch."""
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not 0 <= offset <= self.num_samples:
            raise ValueError(f"sampler offset {offset} outside this epoch's {self.num_samples} samples")
        self.epoch = epoch
        self._resume_at = self.offset = offset
