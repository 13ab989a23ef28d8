"""Node-history features: what a GPU's and its node's own past failures say of its risk now.

Real fleets' faults concentrate and recur (docs/fault-trace.md: a tenth of the servers carry two fifths
of the faults, a quarter of faults are followed by another on the same server within 7 days, two thirds
of those within a day). A row at time t of (node, GPU) reads the failure log, using ONLY failures that
started strictly before t (a failure at t or later is the label's business, never the features'):

- failures of this GPU in the last 7 and 30 days (failures naming the GPU; a node-level one does not);
- failures of this node in the last 1, 7 and 30 days (every failure on it, of any GPU or the node);
- hours since this GPU's and this node's last failure, capped at NO_FAILURE_HOURS (30 days): "none
  within 30 days" and "never" read alike, the cap, so that a fleet's first month and its tenth mean the
  same.

A failure counts from its start: a node back from a 20-hour repair sees its failure 20 hours ago (the
repair gap is part of the history, not a reset). History follows the slot (node, GPU index), not the
card: a replaced GPU inherits its slot's record, as the label log names slots.

One implementation for every driver: the offline replay hands each step's block to the engine
(`FailureHistory.at`), the service fills the columns of the steps it scores from its label log
(`FailureHistory.rows`, faultcast.service.node_history). Both are a few sorted searches per row: the log
is sorted once by (entity, time) and every query is one `np.searchsorted` over int64 keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DAY_S = 86_400.0
NO_FAILURE_HOURS = 720.0  # the cap of the hours-since features, and their value when none is known
_GPU_WINDOWS_D = (7.0, 30.0)
_NODE_WINDOWS_D = (1.0, 7.0, 30.0)
HISTORY_NAMES: tuple[str, ...] = (
    *(f"history_gpu_failures_{d:g}d" for d in _GPU_WINDOWS_D),
    *(f"history_node_failures_{d:g}d" for d in _NODE_WINDOWS_D),
    "history_gpu_hours_since_failure",
    "history_node_hours_since_failure",
)
# (rows, features) of a row that knows no failure: every count 0, every time since at the cap.
NO_HISTORY: np.ndarray = np.array(
    [0.0] * (len(_GPU_WINDOWS_D) + len(_NODE_WINDOWS_D)) + [NO_FAILURE_HOURS] * 2
)
NO_HISTORY.setflags(write=False)

# Keys: entity * _SPAN + milliseconds since the log's origin, exact in int64. 2^41 ms is 69 years
# (queries further out are clipped, which changes no answer) and leaves 2^22 entities.
_SPAN = np.int64(1 << 41)
_MS = 1000.0


def has_history(names: Sequence[str]) -> bool:
    """Whether a model's feature names end with the history features (what the service must fill)."""
    k = len(HISTORY_NAMES)
    return len(names) >= k and tuple(names[-k:]) == HISTORY_NAMES


@dataclass(frozen=True)
class _Index:
    """Failure start times sorted by (entity, time), as int64 keys."""

    keys: np.ndarray  # (failures,) int64, sorted
    time_s: np.ndarray  # (failures,) float64, in the keys' order

    @staticmethod
    def of(entity: np.ndarray, time_s: np.ndarray, origin_s: float) -> _Index:
        keys = _keys(entity, time_s, origin_s)
        order = np.argsort(keys, kind="stable")
        return _Index(keys[order], time_s[order])

    def _at(self, entity: np.ndarray, time_s: np.ndarray, origin_s: float) -> np.ndarray:
        """(rows,) the position of (entity, time) in the keys: all failures before it, this entity's
        last ones just before (keys of one entity are contiguous, and the clipped times stay within)."""
        return np.searchsorted(self.keys, _keys(entity, time_s, origin_s), side="left")

    def counts(
        self, entity: np.ndarray, time_s: np.ndarray, origin_s: float, windows_s: Sequence[float]
    ) -> list[np.ndarray]:
        """Per window w, (rows,) the entity's failures that started in [t - w, t)."""
        now = self._at(entity, time_s, origin_s)
        return [now - self._at(entity, time_s - w, origin_s) for w in windows_s]

    def hours_since(self, entity: np.ndarray, time_s: np.ndarray, origin_s: float) -> np.ndarray:
        """(rows,) hours since the entity's last failure that started before t, capped."""
        if not len(self.keys):
            return np.full(len(time_s), NO_FAILURE_HOURS)
        at = self._at(entity, time_s, origin_s) - 1
        start = np.searchsorted(self.keys, entity.astype(np.int64) * _SPAN, side="left")
        known = at >= start  # the failure just before the key is this entity's
        last = self.time_s[np.maximum(at, 0)]
        hours = np.where(known, (time_s - last) / 3600.0, NO_FAILURE_HOURS)
        return np.asarray(np.minimum(hours, NO_FAILURE_HOURS))


def _keys(entity: np.ndarray, time_s: np.ndarray, origin_s: float) -> np.ndarray:
    """Exact int64 keys; the time is floored to the millisecond (a failure less than a millisecond
    before t may be missed, one at or after t is never counted: flooring keeps the order)."""
    ms = np.floor((np.asarray(time_s, dtype=np.float64) - origin_s) * _MS)
    ms = np.clip(ms, 0, float(_SPAN - 1)).astype(np.int64)
    return np.asarray(entity, dtype=np.int64) * _SPAN + ms


class FailureHistory:
    """A failure log indexed for the history features. `node` are integer node ids (a dataset's node
    indices, or the service's own numbering of names); `gpu` -1 for a node-level failure.

    `rows` computes HISTORY_NAMES for any rows at once; `at` for every slot of some nodes at one time
    (a replay's step)."""

    def __init__(self, time_s: np.ndarray, node: np.ndarray, gpu: np.ndarray, gpus_per_node: int) -> None:
        time_s = np.asarray(time_s, dtype=np.float64)
        node, gpu = np.asarray(node, dtype=np.int64), np.asarray(gpu, dtype=np.int64)
        if not (len(time_s) == len(node) == len(gpu)):
            raise ValueError(
                f"{len(time_s)} times, {len(node)} nodes and {len(gpu)} GPUs: one each per failure"
            )
        self.gpus_per_node = gpus_per_node
        self._origin = float(time_s.min()) - 31 * DAY_S if len(time_s) else 0.0
        self._nodes = _Index.of(node, time_s, self._origin)
        on_gpu = (gpu >= 0) & (gpu < gpus_per_node)  # a GPU the nodes lack names no slot
        self._gpus = _Index.of(node[on_gpu] * gpus_per_node + gpu[on_gpu], time_s[on_gpu], self._origin)
        self.failures = len(time_s)

    def rows(self, time_s: np.ndarray, node: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        """(rows, len(HISTORY_NAMES)) for rows at `time_s` of (`node`, `gpu`), from the failures that
        started strictly before each row's time."""
        time_s = np.asarray(time_s, dtype=np.float64)
        node, gpu = np.asarray(node, dtype=np.int64), np.asarray(gpu, dtype=np.int64)
        out = np.empty((len(time_s), len(HISTORY_NAMES)))
        out[:] = NO_HISTORY
        if self.failures == 0:
            return out
        # A row whose node had no failure in the longest window reads NO_HISTORY exactly (its counts are
        # 0 and its hours at least the cap): most rows, found with two searches; the rest computed.
        (month,) = self._nodes.counts(node, time_s, self._origin, [_NODE_WINDOWS_D[-1] * DAY_S])
        active = np.flatnonzero(month > 0)
        if len(active):
            out[active] = self._computed(time_s[active], node[active], gpu[active])
        return out

    def _computed(self, time_s: np.ndarray, node: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        slot = node * self.gpus_per_node + gpu
        o = self._origin
        columns = [
            *self._gpus.counts(slot, time_s, o, [d * DAY_S for d in _GPU_WINDOWS_D]),
            *self._nodes.counts(node, time_s, o, [d * DAY_S for d in _NODE_WINDOWS_D]),
            self._gpus.hours_since(slot, time_s, o),
            self._nodes.hours_since(node, time_s, o),
        ]
        return np.stack(columns, axis=1).astype(np.float64)

    def at(self, time_s: float, nodes: Sequence[int] | np.ndarray) -> np.ndarray:
        """(len(nodes) * gpus_per_node, len(HISTORY_NAMES)): every slot of `nodes` (slot = local node *
        gpus_per_node + GPU) at `time_s`; the same numbers as `rows`, the quiet nodes found per node."""
        g, nodes = self.gpus_per_node, np.asarray(nodes, dtype=np.int64)
        out = np.empty((len(nodes) * g, len(HISTORY_NAMES)))
        out[:] = NO_HISTORY
        if self.failures == 0 or not len(nodes):
            return out
        times = np.full(len(nodes), time_s)
        (month,) = self._nodes.counts(nodes, times, self._origin, [_NODE_WINDOWS_D[-1] * DAY_S])
        active = np.flatnonzero(month > 0)
        if len(active):
            slots = (active[:, None] * g + np.arange(g)).ravel()
            gpus = np.tile(np.arange(g, dtype=np.int64), len(active))
            out[slots] = self._computed(np.full(len(slots), time_s), np.repeat(nodes[active], g), gpus)
        return out
