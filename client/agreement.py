"""Every rank snapshots the same step: at agreement steps each rank puts in what its node's guard
knows (snapshot requested? migration coming? a warning open and a replica due?) and one all-reduce
(MAX over three int64s) tells all.

Only one process per node holds a Guard; the others vote zero. A job without torch.distributed (one
process) agrees with itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Vote:
    """What one rank puts in, and what the agreement gives back (True if any rank said True)."""

    snapshot: bool = False
    migrate: bool = False  # the alert asks for snapshot-and-migrate: the node is about to be drained
    protect: bool = False  # a warning is open and the protect tier's replica interval has passed


class Agreement:
    """One all-reduce (MAX) of a Vote over `group` (None: the default group). A CUDA tensor under
    NCCL, else CPU; the device is chosen at construction."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.calls = 0
        self.seconds = 0.0  # time spent agreeing, for the overhead figure
        self._device = _collective_device(group)

    def agree(self, mine: Vote) -> Vote:
        """Collective: every rank of the group must call it at the same step. Without torch.distributed
        initialised, returns `mine`."""
        if not dist.is_initialized():
            return mine
        start = time.perf_counter()
        flags = torch.tensor(
            [int(mine.snapshot), int(mine.migrate), int(mine.protect)], dtype=torch.int64, device=self._device
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        snapshot, migrate, protect = (bool(v) for v in flags.tolist())
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return Vote(snapshot, migrate, protect)


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """NCCL reduces only CUDA tensors; gloo and the rest take CPU ones."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
