"""What a snapshot holds, so that a resumed job continues bit for bit: model and optimizer (through
`torch.distributed.checkpoint.state_dict`, which understands DDP and FSDP), and per rank the step, the
scheduler, the data position and every random number generator the step may draw from.

The per-rank part is pickled and signed with the job's key (client/rank_part.py): it is unpickled
only once its signature verifies, or, written unsigned by an older faultcast, only as plain data."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, NotRequired, Protocol, TypedDict

import numpy as np
import numpy.typing as npt
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from faultcast.client import rank_part

StateDict = dict[str, Any]
"""What torch.distributed.checkpoint saves and loads (its own StateDict is dict[str, Any]):
tensors, nested dicts of them, and the bytes of RANK_KEY."""

RANK_KEY = "faultcast/rank{rank}"  # one sealed blob per rank: its RNGs and data position differ
"""The state-dict key of a rank's sealed part (RNGs, step, data position); format it with rank=."""


class Stateful(Protocol):
    """Anything with torch's state_dict/load_state_dict pair (a scheduler, a sampler, a stateful loader).
    Its state is pickled into the rank's part of the snapshot."""

    def state_dict(self) -> object:
        """The state to save; load_state_dict gets it back unchanged."""
        ...

    # Any: each implementation takes its own state's type, which a parameter of `object` would refuse.
    def load_state_dict(self, state: Any, /) -> object:
        """Put back what state_dict returned."""
        ...


class RngState(TypedDict):
    """Every random number generator a training step may draw from, as its own get-state call gives it."""

    python: tuple[object, ...]  # random.getstate()
    numpy: dict[str, object] | tuple[str, npt.NDArray[np.uint32], int, int, float]  # np.random.get_state()
    torch: torch.Tensor  # torch.get_rng_state()
    cuda: NotRequired[list[torch.Tensor]]  # every device's, when CUDA is in use


class _RankState(TypedDict):
    """The per-rank part of a snapshot, pickled under RANK_KEY."""

    step: int
    rng: RngState
    stateful: dict[str, object]  # TrainState._stateful()'s names to their state_dict()


@dataclass
class TrainState:
    """The training job's state. `data` is anything with state_dict/load_state_dict (a
    `ResumableDistributedSampler`, a stateful loader); `extra` holds further such objects by name."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Stateful | None = None
    data: Stateful | None = None
    extra: dict[str, Stateful] = field(default_factory=dict)

    def to_save(self, step: int, rank: int, key: bytes) -> StateDict:
        """The state dict handed to `torch.distributed.checkpoint.save`: "model", "optimizer" (when
        there is one) and this rank's part under RANK_KEY, sealed with the job's `key`."""
        out = self._model_and_optimizer()
        name = RANK_KEY.format(rank=rank)
        out[name] = rank_part.seal(self._rank_state(step), key, name)
        return out

    def to_load(self, rank: int | None) -> StateDict:
        """A state dict of the right shapes for `torch.distributed.checkpoint.load` to fill; without
        a rank, the per-rank part is not asked for (the snapshot came from another world size)."""
        out = self._model_and_optimizer()
        if rank is not None:
            out[RANK_KEY.format(rank=rank)] = b""
        return out

    def _model_and_optimizer(self) -> StateDict:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optimizer": optim_sd}
        return {"model": get_model_state_dict(self.model)}

    def restore(self, loaded: StateDict, rank: int | None, key: bytes) -> int | None:
        """Put loaded state back; returns the step from the per-rank part (None without it). The part
        is unpickled once it verifies with the job's `key` (an unsigned one only as plain data):
        RankPartError, before anything is put back, when it does not."""
        part: _RankState | None = None
        if rank is not None:
            part_key = RANK_KEY.format(rank=rank)
            part = _as_rank_state(rank_part.unseal(loaded[part_key], key, part_key), part_key)
        if self.optimizer is not None:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=loaded["model"],
                optim_state_dict=loaded["optimizer"],
            )
        else:
            set_model_state_dict(self.model, loaded["model"])
        if part is None:
            return None
        _restore_rng(part["rng"])
        for name, target in self._stateful().items():
            if name in part["stateful"]:
                target.load_state_dict(part["stateful"][name])
        return int(part["step"])

    def _stateful(self) -> dict[str, Stateful]:
        named: dict[str, Stateful | None] = {"scheduler": self.scheduler, "data": self.data}
        named.update({f"extra/{k}": v for k, v in self.extra.items()})
        return {k: v for k, v in named.items() if v is not None}

    def _rank_state(self, step: int) -> _RankState:
        return {
            "step": step,
            "rng": capture_rng(),
            "stateful": {name: obj.state_dict() for name, obj in self._stateful().items()},
        }


def _as_rank_state(value: object, name: str) -> _RankState:
    """`value` as a per-rank part; RankPartError when it is not shaped like one."""
    if not (isinstance(value, dict) and {"step", "rng", "stateful"} <= value.keys()):
        raise rank_part.RankPartError(f"the snapshot's part {name} is not a per-rank part")
    return value  # type: ignore[return-value]  # checked above, as far as restore relies on it


def capture_rng() -> RngState:
    """The state of Python's, NumPy's and torch's global generators (and CUDA's, once initialised)."""
    rng: RngState = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _restore_rng(rng: RngState) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng:
        torch.cuda.set_rng_state_all(rng["cuda"])
