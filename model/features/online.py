"""Online features: node snapshots in, one `FeatureEngine.update` per grid step out.

The service receives samples one node at a time, at any cadence, possibly a little out of step
across nodes. This adapter lays them on the model's grid exactly as `dataset.replay` lays a table
(the last sample of a GPU within a step wins; a new UUID in a slot restarts its history; a
node's devices roll up with `faultcast.rollup`) and advances the engine when a step is complete:
once a sample `lateness_steps` steps newer has arrived. Event time throughout.

A step in which no sample arrived is stepped through like any other (its GPUs absent), but only the
first `empty_steps` of a run of them: the rest of the run is skipped in one move
(`FeatureEngine.skip`), which leaves the engine exactly as stepping through would, and is not
handed out. So a sample that jumps ahead in time (a clock set wrong, or a caller's choice: one stamped
at the epoch and the next one now is ~3e7 steps) costs a few steps of work, not one per step of the
gap; the features of the next sample are the same either way.

A model with the node-history features (`FeatureConfig.node_history`) gets them as "no failure known"
here: they come from the fleet's label log, not from samples, and the service's scorer fills them in
for each step it scores (faultcast.service.scoring; replay fills them from the data's failure log).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.offline import Step
from faultcast.model.incidents import AlertPolicy
from faultcast.readings import GpuReading, NodeSnapshot
from faultcast.rollup import rollup_network
from faultcast.step_summary import SUMMARISED, SUMMARISED_INDEX

_GPU_COLUMNS = np.array([index_of(Scope.GPU)[name] for name in GPU_INPUTS])
_SCOPES = (Scope.IB_PORT, Scope.INTERFACE, Scope.PEER)
# The most steps without a sample handed out in a row (the rest of the run is skipped). The alert
# policy counts them to see a GPU go dark (its dark_steps, 3 by default; the scorer hands out that
# many); past 64 (an hour of minutes) a jump's work would no longer be small.
MAX_EMPTY_STEPS = 64


class LateSample(ValueError):  # noqa: N818 (a reason for a reject counter, not a programming error)
    """A sample for a grid step the engine has already advanced past."""


class OnlineFeatures:
    """The service's feature engine over a fixed list of nodes (see the module docstring).

    Callers may rely on: `add` returns the grid steps a sample completed, in order, with the
    features `dataset.replay` computes from the same samples (a parity test guards this); a sample
    for a step already handed out raises LateSample before anything is kept; an unknown node raises
    KeyError; `flush` hands out the steps still pending; `next_step` is the first step not yet handed
    out; `skipped` counts the empty steps skipped, never handed out."""

    def __init__(
        self,
        config: FeatureConfig,
        nodes: Sequence[str],
        start_s: float,
        *,
        lateness_steps: int = 1,
        first_step: int = 0,
        empty_steps: int = AlertPolicy().dark_steps,
    ) -> None:
        """`empty_steps`: how many steps without a sample in a row are handed out (at least 1,
        at most MAX_EMPTY_STEPS); the rest of such a run is skipped, not handed out."""
        if not 1 <= empty_steps <= MAX_EMPTY_STEPS:
            raise ValueError(f"empty_steps is {empty_steps}, it must be from 1 to {MAX_EMPTY_STEPS}")
        self.empty_steps = empty_steps
        self.config = config
        self.nodes = list(nodes)
        self._node_index = {name: i for i, name in enumerate(self.nodes)}
        self.start_s = start_s
        self.lateness = lateness_steps
        self.engine = FeatureEngine(config, len(self.nodes))
        self._g = config.gpus_per_node
        # step -> (slot -> the GPU's last reading in the step, node -> its last sample with devices).
        # Kept as readings and turned into arrays once, when the step is complete: at 1 s samples
        # and a 60 s grid, 59 of 60 samples are overwritten before they matter (but for their part
        # in the step's summary, which `_summaries` keeps running).
        self._pending: dict[int, tuple[dict[int, GpuReading], dict[int, NodeSnapshot]]] = {}
        self._summaries: dict[int, _StepSummaries] = {}
        self._last_uuid: list[str | None] = [None] * self.engine.slots
        self._is_h100 = np.zeros(self.engine.slots)
        self.next_step = first_step  # the first step not yet handed to the engine
        self._empty_run = 0  # steps without a sample handed out since the last step with one
        self.skipped = 0  # steps skipped in all, never handed out

    def step_of(self, time_unix_nano: int) -> int:
        """The grid step a sample time falls in."""
        return int((time_unix_nano / 1e9 - self.start_s) // self.config.cadence_s)

    def add(self, snapshot: NodeSnapshot) -> list[Step]:
        """Take one node's sample; returns the steps it completed (often none, sometimes several)."""
        node = self._node_index.get(snapshot.node)
        if node is None:
            raise KeyError(f"unknown node {snapshot.node!r}")
        step = self.step_of(snapshot.time_unix_nano)
        if step < self.next_step:
            raise LateSample(
                f"sample of {snapshot.node} for step {step} arrived after step {self.next_step - 1} was scored"
            )
        gpus, nets = self._pending.setdefault(step, ({}, {}))
        summaries = self._summaries.setdefault(step, _StepSummaries(self.engine.slots))
        base = node * self._g
        for reading in snapshot.gpus:
            slot = base + reading.index
            if slot in gpus and gpus[slot].uuid != reading.uuid:
                summaries.forget(slot)  # another GPU in the slot: the step is its alone
            gpus[slot] = reading
            summaries.add(slot, reading)
        if snapshot.devices:
            nets[node] = snapshot
        # A sample that closes a collector's window ending with this step is the node's last of it.
        closes = snapshot.window_s > 0 and self._window_ends_step(snapshot, step)
        return self._advance(step if closes and len(self.nodes) == 1 else step - self.lateness)

    def _window_ends_step(self, snapshot: NodeSnapshot, step: int) -> bool:
        t, w = snapshot.time_unix_nano / 1e9, snapshot.window_s
        window_end = (math.floor(t / w) + 1) * w
        return abs(window_end - (self.start_s + (step + 1) * self.config.cadence_s)) < 1e-6

    def flush(self) -> list[Step]:
        """Score every step still waiting (at the end of a replay)."""
        return self._advance(max(self._pending, default=self.next_step - 1))

    def _advance(self, through: int) -> list[Step]:
        """Hand out the steps up to `through`: at most len(pending) + empty_steps + 1 engine steps
        (the pending ones are at most lateness + 1), whatever the span."""
        out = []
        while self.next_step <= through:
            step = self.next_step
            if step not in self._pending:
                if self._empty_run >= self.empty_steps:
                    # The rest of this run without samples: up to the next pending step, or past `through`.
                    end = min((s for s in self._pending if s <= through), default=through + 1)
                    self.engine.skip(step, end - step)
                    self.skipped += end - step
                    self.next_step = end
                    continue
                self._empty_run += 1
            else:
                self._empty_run = 0
            gpus, nets = self._pending.pop(step, ({}, {}))
            summaries = self._summaries.pop(step, None)
            summary = summaries.array() if summaries is not None else None
            gpu, net = self._empty()
            changed = []
            for slot, reading in sorted(gpus.items()):
                gpu[slot] = np.asarray(reading.values)[_GPU_COLUMNS]
                self._is_h100[slot] = 1.0 if "H100" in reading.model_name else 0.0
                if self._last_uuid[slot] is not None and self._last_uuid[slot] != reading.uuid:
                    changed.append(slot)
                self._last_uuid[slot] = reading.uuid
            for node, snapshot in nets.items():
                net[node] = self._node_values(snapshot)
            self.engine.reset_slots(np.array(changed, dtype=np.int64))
            features = self.engine.update(step, gpu, net, self._is_h100, summary)
            out.append(
                Step(step, self.start_s + step * self.config.cadence_s, self.engine.present.copy(), features)
            )
            self.next_step += 1
        return out

    def _empty(self) -> tuple[np.ndarray, np.ndarray]:
        gpu = np.full((self.engine.slots, len(GPU_INPUTS)), np.nan)
        return gpu, np.full((len(self.nodes), len(NODE_INPUTS)), np.nan)

    @staticmethod
    def _node_values(snapshot: NodeSnapshot) -> np.ndarray:
        by_scope = {s: [d.values for d in snapshot.devices if d.scope is s] for s in _SCOPES}
        arrays = [
            np.array(by_scope[s]) if by_scope[s] else np.full((1, len(metrics_for(s))), np.nan)
            for s in _SCOPES
        ]
        rolled = rollup_network(arrays[0], arrays[1], arrays[2], np.asarray(snapshot.host))
        return np.array([float(rolled[name]) for name in NODE_INPUTS])


class _StepSummaries:
    """One step's running summaries of the SUMMARISED gauges per slot, as `step_summary.combine` would
    combine its samples (a sample without a summary is a summary of its own scrape); kept as running
    minima, maxima and weighted sums, so a sample costs a few small array operations."""

    def __init__(self, slots: int) -> None:
        k = len(SUMMARISED)
        self.scrapes = np.zeros(slots)
        self.low = np.full((slots, k), math.nan)
        self.high = np.full((slots, k), math.nan)
        self.total = np.zeros((slots, k))
        self.weight = np.zeros((slots, k))

    def forget(self, slot: int) -> None:
        self.scrapes[slot] = 0.0
        self.low[slot] = self.high[slot] = math.nan
        self.total[slot] = self.weight[slot] = 0.0

    def add(self, slot: int, reading: GpuReading) -> None:
        summary = reading.summary
        if summary is None:
            scrapes = 1
            low = high = mean = np.asarray(reading.values)[SUMMARISED_INDEX]
        else:
            scrapes = summary.scrapes
            low, high, mean = (
                np.asarray(a)[SUMMARISED_INDEX] for a in (summary.minimum, summary.maximum, summary.mean)
            )
        self.scrapes[slot] += scrapes
        self.low[slot] = np.fmin(self.low[slot], low)
        self.high[slot] = np.fmax(self.high[slot], high)
        seen = ~np.isnan(mean)
        self.total[slot] += np.where(seen, mean, 0.0) * scrapes
        self.weight[slot] += seen * scrapes

    def array(self) -> np.ndarray:
        """(slots, feature_steps.WIDTH): scrapes, then SUMMARY_COLUMNS' values."""
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(
                self.weight > 0, self.total / np.where(self.weight > 0, self.weight, 1.0), math.nan
            )
        stats = np.stack([self.low, self.high, mean], axis=2).reshape(len(self.scrapes), -1)
        return np.concatenate([self.scrapes[:, None], stats], axis=1)
