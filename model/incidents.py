"""The alert lifecycle: one state machine for the service and for every offline figure.

Per GPU (a slot), with hysteresis: an alert opens when the risk has been at or above the threshold
for `k` consecutive scores, stays open while the risk stays at or above the lower hold level
(threshold x `hold_ratio`), and clears once it has been under the hold level for `clear_steps`
consecutive scores, or once the GPU has been absent for `dark_steps` steps. Nothing else ends an
alert: no horizon expiry, so one incident is one alert however long its precursor lasts.

Incidents group slots: a GPU whose likely mode is GPU-level opens an incident of its own; one whose
likely mode is node-level (a network failure) joins the node's open node-level incident, or opens
it (gpu -1). An incident ends when the last of its slots clears.

`IncidentTracker` runs any number of thresholds side by side (the slot runs are arrays of
thresholds x slots), so choosing a threshold is one pass over the scores; the service runs it with
one. `track` is the batch path: a loop over a scored period through the same tracker.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class AlertPolicy:
    """When an alert opens and clears (see the module docstring)."""

    k: int = 2
    clear_steps: int = 10
    hold_ratio: float = 0.5
    dark_steps: int = 3

    def hold(self, threshold: float) -> float:
        """The level an open alert must stay at or above."""
        return threshold * self.hold_ratio


class CloseReason(enum.Enum):
    """Why an incident closed."""

    RISK_FELL = "risk below the hold level"
    GPU_DARK = "gpu dark"
    NODE_SILENT = "node silent"


@dataclass(eq=False)
class Incident:
    """One alert as an operator sees it: a GPU, or a node for a node-level mode."""

    key: int  # the tracker's own number, increasing from 1
    node: int  # slot // gpus_per_node
    gpu: int  # -1: node-level
    opened_step: int
    mode: str  # the likely mode when it opened
    slots: set[int] = field(default_factory=set)  # the slots holding it open
    slots_at_open: list[int] = field(default_factory=list)  # the slots that opened it, in its first step
    closed_step: int = -1
    reason: CloseReason | None = None

    @property
    def node_level(self) -> bool:
        """An incident of the node (a node-level mode), not of one GPU."""
        return self.gpu < 0


@dataclass(frozen=True, slots=True)
class Changes:
    """What one update did at one threshold."""

    opened: tuple[Incident, ...]
    closed: tuple[Incident, ...]


_NO_CHANGE = Changes((), ())


class IncidentTracker:
    """The state machine over slots `node * gpus_per_node + gpu`, at each of `thresholds`."""

    def __init__(
        self,
        policy: AlertPolicy,
        thresholds: Sequence[float],
        gpus_per_node: int,
        node_level_modes: frozenset[str],
    ) -> None:
        self.policy, self.g, self.node_level_modes = policy, gpus_per_node, node_level_modes
        self.thresholds = np.asarray(thresholds, dtype=np.float64)
        self._open_at = self.thresholds[:, None]
        self._hold_at = np.asarray([policy.hold(t) for t in thresholds], dtype=np.float64)[:, None]
        c = len(self.thresholds)
        self.above = np.zeros((c, 0), dtype=np.int64)  # consecutive present scores >= threshold
        self.below = np.zeros((c, 0), dtype=np.int64)  # consecutive present scores < hold level
        self.dark = np.zeros((c, 0), dtype=np.int64)  # consecutive absent steps
        self.is_open = np.zeros((c, 0), dtype=bool)
        self.by_slot: list[dict[int, Incident]] = [{} for _ in range(c)]
        self.node_incident: list[dict[int, Incident]] = [{} for _ in range(c)]
        self._keys = 0

    def grow(self, slots: int) -> None:
        """Make room for slots up to `slots` (exclusive)."""
        extra = slots - self.above.shape[1]
        if extra <= 0:
            return
        c = len(self.thresholds)
        self.above = np.concatenate([self.above, np.zeros((c, extra), dtype=np.int64)], axis=1)
        self.below = np.concatenate([self.below, np.zeros((c, extra), dtype=np.int64)], axis=1)
        self.dark = np.concatenate([self.dark, np.zeros((c, extra), dtype=np.int64)], axis=1)
        self.is_open = np.concatenate([self.is_open, np.zeros((c, extra), dtype=bool)], axis=1)

    def update(
        self,
        step: int,
        slots: np.ndarray,
        risk: np.ndarray,
        present: np.ndarray,
        modes: Sequence[str] | np.ndarray,
    ) -> list[Changes]:
        """One grid step of `slots` (their risk, whether present, their likely mode): per threshold,
        the incidents that opened and closed. `modes` is read only where a slot opens."""
        if len(slots) == 0:
            return [_NO_CHANGE] * len(self.thresholds)
        self.grow(int(slots.max()) + 1)
        r = np.where(np.isnan(risk), -np.inf, risk)[None, :]
        here = present[None, :]
        above = (r >= self._open_at) & here
        holding = (r >= self._hold_at) & here
        a = np.where(here, np.where(above, self.above[:, slots] + 1, 0), self.above[:, slots])
        b = np.where(here, np.where(holding, 0, self.below[:, slots] + 1), self.below[:, slots])
        d = np.where(here, 0, self.dark[:, slots] + 1)
        was_open = self.is_open[:, slots]
        low = was_open & here & (b >= self.policy.clear_steps)
        gone = was_open & ~here & (d >= self.policy.dark_steps)
        close = low | gone
        still = was_open & ~close
        new = ~still & (a >= self.policy.k) & here
        self.above[:, slots], self.below[:, slots], self.dark[:, slots] = a, b, d
        self.is_open[:, slots] = still | new
        out = [_NO_CHANGE] * len(self.thresholds)
        eventful = np.nonzero((close | new).any(axis=1))[0]
        for ci in eventful.tolist():
            closed = self._close(ci, step, slots[close[ci]], np.where(gone[ci], 1, 0)[close[ci]])
            opened = self._open(ci, step, slots, np.nonzero(new[ci])[0], modes)
            out[ci] = Changes(tuple(opened), tuple(closed))
        return out

    def _close(self, ci: int, step: int, slots: np.ndarray, dark: np.ndarray) -> list[Incident]:
        closed = []
        for slot, was_dark in zip(slots.tolist(), dark.tolist(), strict=True):
            incident = self.by_slot[ci].pop(slot, None)
            if incident is None:
                continue
            incident.slots.discard(slot)
            if not incident.slots:
                reason = CloseReason.GPU_DARK if was_dark else CloseReason.RISK_FELL
                closed.append(self._end(ci, incident, step, reason))
        return closed

    def _end(self, ci: int, incident: Incident, step: int, reason: CloseReason) -> Incident:
        incident.closed_step, incident.reason = step, reason
        if incident.node_level and self.node_incident[ci].get(incident.node) is incident:
            del self.node_incident[ci][incident.node]
        return incident

    def _open(
        self, ci: int, step: int, slots: np.ndarray, where: np.ndarray, modes: Sequence[str] | np.ndarray
    ) -> list[Incident]:
        opened = []
        for i in where.tolist():
            slot = int(slots[i])
            mode = str(modes[i]) or "unknown"
            node = slot // self.g
            if mode in self.node_level_modes:
                incident = self.node_incident[ci].get(node)
                if incident is None:
                    incident = self._new(node, -1, step, mode)
                    self.node_incident[ci][node] = incident
                    opened.append(incident)
            else:
                incident = self._new(node, slot % self.g, step, mode)
                opened.append(incident)
            incident.slots.add(slot)
            if incident.opened_step == step:
                incident.slots_at_open.append(slot)
            self.by_slot[ci][slot] = incident
        return opened

    def _new(self, node: int, gpu: int, step: int, mode: str) -> Incident:
        self._keys += 1
        return Incident(self._keys, node, gpu, step, mode)

    def open_incidents(self, ci: int = 0) -> list[Incident]:
        """The incidents open at threshold `ci`, oldest first."""
        unique = {incident.key: incident for incident in self.by_slot[ci].values()}
        return [unique[k] for k in sorted(unique)]

    def close_node(self, node: int, step: int, reason: CloseReason) -> list[Changes]:
        """End every open incident of `node` (it went silent) and reset its slots' runs."""
        base = node * self.g
        self.grow(base + self.g)
        cols = slice(base, base + self.g)
        self.above[:, cols] = self.below[:, cols] = self.dark[:, cols] = 0
        self.is_open[:, cols] = False
        out = []
        for ci in range(len(self.thresholds)):
            ended: dict[int, Incident] = {}
            for slot in range(base, base + self.g):
                incident = self.by_slot[ci].pop(slot, None)
                if incident is not None:
                    incident.slots.discard(slot)
                    ended[incident.key] = incident
            out.append(Changes((), tuple(self._end(ci, i, step, reason) for _, i in sorted(ended.items()))))
        return out

    def restore(
        self, node: int, gpu: int, slots: Sequence[int], opened_step: int, mode: str
    ) -> Incident | None:
        """Re-open an incident a previous run left open (threshold 0) on those of `slots` no other
        incident holds: they start open, with fresh runs, so that the next scores decide whether it
        holds. None when every slot is taken."""
        free = [slot for slot in slots if slot not in self.by_slot[0]]
        if not free:
            return None
        self.grow(max(free) + 1)
        incident = self._new(node, gpu, opened_step, mode)
        incident.slots_at_open.extend(free)
        for slot in free:
            self.is_open[0, slot] = True
            self.above[0, slot] = self.below[0, slot] = self.dark[0, slot] = 0
            incident.slots.add(slot)
            self.by_slot[0][slot] = incident
        if gpu < 0:
            self.node_incident[0].setdefault(node, incident)
        return incident

    def runs(self, slots: Sequence[int]) -> np.ndarray:
        """The runs of `slots` at threshold 0 (rows: above, below, dark, open), to save a node's
        state: `set_runs` and `adopt` take it back exactly."""
        self.grow(max(slots) + 1)
        cols = list(slots)
        return np.stack(
            [
                self.above[0, cols],
                self.below[0, cols],
                self.dark[0, cols],
                self.is_open[0, cols].astype(np.int64),
            ]
        )

    def set_runs(self, slots: Sequence[int], runs: np.ndarray) -> None:
        """Put back runs `runs` saved for `slots` (threshold 0)."""
        self.grow(max(slots) + 1)
        cols = list(slots)
        self.above[0, cols], self.below[0, cols], self.dark[0, cols] = runs[0], runs[1], runs[2]
        self.is_open[0, cols] = runs[3].astype(bool)

    def adopt(
        self,
        node: int,
        gpu: int,
        slots: Sequence[int],
        opened_step: int,
        mode: str,
        slots_at_open: Sequence[int],
    ) -> Incident:
        """Take back an incident exactly as it was saved (threshold 0; its slots' runs are put
        back by `set_runs`): a new key, the same slots, opening step and mode."""
        incident = self._new(node, gpu, opened_step, mode)
        incident.slots_at_open.extend(slots_at_open)
        for slot in slots:
            incident.slots.add(slot)
            self.by_slot[0][slot] = incident
        if gpu < 0:
            self.node_incident[0][node] = incident
        return incident

    def carry_over(self, old: IncidentTracker) -> None:
        """Take `old`'s state (a new model with the same features; threshold 0 only)."""
        self.grow(old.above.shape[1])
        n = old.above.shape[1]
        self.above[0, :n], self.below[0, :n], self.dark[0, :n] = old.above[0], old.below[0], old.dark[0]
        self.is_open[0, :n] = old.is_open[0]
        self.by_slot[0], self.node_incident[0] = dict(old.by_slot[0]), dict(old.node_incident[0])
        self._keys = old._keys


def track(
    risk: np.ndarray,
    present: np.ndarray,
    modes: np.ndarray,
    thresholds: Sequence[float],
    policy: AlertPolicy,
    gpus_per_node: int,
    node_level_modes: frozenset[str],
    skip_quiet: bool = True,
) -> list[list[Incident]]:
    """The batch path: every incident that opens over (steps, slots) scores, per threshold, in
    opening order (closed ones with their close step). `modes` (steps, slots) is each row's likely
    mode ("" where unknown); slots are `node * gpus_per_node + gpu`.

    Each step updates only the slots that can change an outcome: those scoring at or above the
    lowest hold level, and those open or part-way to opening at some threshold. A slot that is none
    of these is quiet: its above-run stays 0 whatever it scores under every threshold, and its
    below- and dark-runs are read only while it is open, and restart when it opens (the opening
    score is at or above the hold level, the slot present). So leaving quiet slots out gives the
    same incidents, and choosing among hundreds of thresholds costs the top of the scores, not all
    of them (measured: bench/threshold_search.py). `skip_quiet=False` updates every slot at every
    step, as the service does: the reference the skipping is tested and timed against."""
    tracker = IncidentTracker(policy, thresholds, gpus_per_node, node_level_modes)
    steps, width = risk.shape
    tracker.grow(width)
    found: list[list[Incident]] = [[] for _ in thresholds]
    if not len(thresholds):
        return found
    lowest = min(min(thresholds), min(policy.hold(t) for t in thresholds))
    # A hold level over the threshold (refused by the manifest) would make the runs at opening
    # matter: then every slot is updated at every step, as the service does.
    skip_quiet = skip_quiet and policy.hold_ratio <= 1.0
    with np.errstate(invalid="ignore"):
        hot = present & (risk >= lowest) if skip_quiet else np.ones(risk.shape, dtype=bool)
    live = np.zeros(width, dtype=bool)
    for t in range(steps):
        slots = np.nonzero(hot[t] | live)[0]
        if not len(slots):
            continue
        for ci, changes in enumerate(
            tracker.update(t, slots, risk[t, slots], present[t, slots], modes[t, slots])
        ):
            found[ci].extend(changes.opened)
        live[slots] = tracker.is_open[:, slots].any(axis=0) | (tracker.above[:, slots] > 0).any(axis=0)
    return found
