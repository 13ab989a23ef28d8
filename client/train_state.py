"""What a snapshot holds, so that a resumed job continues bit for bit: model and optimizer (through
`torch.distributed.checkpoint.state_dict`, which understands DDP and FSDP), and per rank the step, the
scheduler, the data position and every random number generator the step may draw from."""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

RANK_KEY = "faultcast/rank{rank}"  # one pickled blob per rank: its RNGs and data position differ


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


@dataclass
class TrainState:
    """The training job's state. `data` is anything with state_dict/load_state_dict (a
    `ResumableDistributedSampler`, a stateful loader); `extra` holds further such objects by name."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Stateful | None = None
    data: Stateful | None = None
    extra: dict[str, Stateful] = field(default_factory=dict)

    def to_save(self, step: int, rank: int) -> dict[str, Any]:
        """The state dict handed to `torch.distributed.checkpoint.save`."""
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            out: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
        else:
            out = {"model": get_model_state_dict(self.model)}
        out[RANK_KEY.format(rank=rank)] = pickle.dumps(self._rank_state(step))
        return out

    def to_load(self, rank: int | None) -> dict[str, Any]:
        """A state dict of the right shapes for `torch.distributed.checkpoint.load` to fill; without
        a rank, the per-rank part is not asked for (the snapshot came from another world size)."""
        out = self.to_save(0, 0)
        del out[RANK_KEY.format(rank=0)]
        if rank is not None:
            out[RANK_KEY.format(rank=rank)] = b""
        return out

    def restore(self, loaded: dict[str, Any], rank: int | None) -> int | None:
        """Put loaded state back; returns the step from the per-rank part (None without it)."""
        if self.optimizer is not None:
            set_state_dict(
                self.model, self.optimizer,
                model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"],
            )  # fmt: skip
        else:
            set_model_state_dict(self.model, loaded["model"])
        if rank is None:
            return None
        # Our own file, written by this job: trusted like any checkpoint torch.load would read.
        part: dict[str, Any] = pickle.loads(loaded[RANK_KEY.format(rank=rank)])  # noqa: S301
        _restore_rng(part["rng"])
        for name, target in self._stateful().items():
            if name in part["stateful"]:
                target.load_state_dict(part["stateful"][name])
        return int(part["step"])

    def _stateful(self) -> dict[str, Stateful]:
        named: dict[str, Stateful | None] = {"scheduler": self.scheduler, "data": self.data}
        named.update({f"extra/{k}": v for k, v in self.extra.items()})
        return {k: v for k, v in named.items() if v is not None}

    def _rank_state(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "rng": capture_rng(),
            "stateful": {name: obj.state_dict() for name, obj in self._stateful().items()},
        }


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _restore_rng(rng: dict[str, Any]) -> None:
    setters: dict[str, Callable[[Any], None]] = {
        "python": random.setstate,
        "numpy": np.random.set_state,
        "torch": torch.set_rng_state,
        "cuda": torch.cuda.set_rng_state_all,
    }
    for name, state in rng.items():
        setters[name](state)
