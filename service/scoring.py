"""Online scoring: node samples in, calibrated risks out, through the training code's features.

Each node has its own `OnlineFeatures` on the model's grid (its cadence, epoch-aligned steps), so
incoming 1 s samples are resampled exactly as training laid its table, and one node's clock running
ahead never makes another node's samples late. A node's grid step is complete once a sample of a
later step arrives; completed steps wait in a queue and `score_pending` scores all their GPUs in one
LightGBM call (the risk, the mode head and the time-to-failure head). What the heads say of a row near
an alert (model/alert_content.py's `Heads`) goes with its step, so that the alert book words an
alert from it and runs no head again.

A node whose samples jump ahead in event time (a clock set wrong, or a caller stamping samples as it
likes) costs a few steps of work, not one per step of the gap: the first steps without a sample are
scored (the alert policy's dark_steps of them, so that its GPUs go dark as always) and the rest are
skipped in one move that leaves its features exactly as stepping through would (`OnlineFeatures`).

A model trained with node history (faultcast.model.features.history) has its history columns filled
here, at scoring, from the scorer's `history` source (the label log: faultcast.service.node_history)
for each step's time: the failures the log holds that started before the step. Without a source they
read "no failure known"; a model without them costs nothing.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from faultcast.model.alert_content import TTF_QUANTILES, Heads, read_heads
from faultcast.model.artifact import FaultModel
from faultcast.model.features.history import HISTORY_NAMES, has_history
from faultcast.model.features.online import MAX_EMPTY_STEPS, LateSample, OnlineFeatures
from faultcast.readings import NodeSnapshot
from faultcast.service.rpc.validation import SampleRejected
from faultcast.service.state.cursors import SPOOLS_PER_NODE

log = logging.getLogger(__name__)

# Rows scored at least this share of the threshold get the mode and time-to-failure heads too: at or
# under the hold level of the shipped policy, so that every score that holds an alert open has them.
NEAR_THRESHOLD = 0.5


def model_version(model: FaultModel) -> str:
    """What names the model in alerts and metrics: its creation time, the code's revision and the
    threshold it serves (two models that alert differently never share a name)."""
    created = model.card.created_at or "unknown"
    revision = (model.card.git_revision or "unknown")[:12]
    protect = f"/protect@{model.protect_threshold!r}" if model.protect_threshold is not None else ""
    return f"{created}/{revision}@{model.threshold!r}{protect}"


class HistorySource(Protocol):
    """Where the node-history features come from (faultcast.service.node_history.LabelHistory)."""

    def rows(self, nodes: Sequence[str], time_s: np.ndarray, gpus_per_node: int) -> np.ndarray:
        """(len(nodes) * gpus_per_node, len(HISTORY_NAMES)): each GPU of nodes[i] at time_s[i]."""
        ...


@dataclass
class ScoredStep:
    """One node's grid step, scored."""

    node: str
    step: int  # epoch-aligned grid step: time // cadence
    time_s: float
    arrival_s: float  # when the sample that completed the step arrived (the service's clock)
    present: np.ndarray  # (gpus,) bool
    features: np.ndarray  # (gpus, features)
    uuids: tuple[str, ...]
    risk: np.ndarray = field(default_factory=lambda: np.zeros(0))  # NaN where absent
    mode: list[str] = field(default_factory=list)
    ttf_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the median; NaN where not near
    # GPU -> what the model's heads said of its row, for the rows near an alert: an alert's content.
    heads: dict[int, Heads] = field(default_factory=dict)


@dataclass
class _Node:
    online: OnlineFeatures
    uuids: list[str]
    jumped: bool = False  # a gap longer than its windows was logged
    cursors: dict[int, int] = field(default_factory=dict)  # spool id -> the last sequence taken
    unsaved_steps: int = 0  # steps completed since its state was last saved


@dataclass
class NodeScoringState:
    """A node's whole scoring state at one moment: its features (the windows, baselines and the
    step being filled), its GPUs' UUIDs, the last sample taken from each of its spools, and its steps
    completed but not yet through the alert book. A copy: nothing in it is shared with the scorer."""

    online: OnlineFeatures
    uuids: list[str]
    jumped: bool
    cursors: dict[int, int]
    queued: list[ScoredStep]


def _empty_steps(model: FaultModel) -> int:
    """Steps without a sample scored in a row: what the policy needs to see a GPU go dark, capped
    (a policy asking more than MAX_EMPTY_STEPS sees at most that many per gap)."""
    return min(model.policy.dark_steps, MAX_EMPTY_STEPS)


class Scorer:
    """Turns node samples into scored grid steps: per-node streaming features, and all completed
    steps scored in one LightGBM call. `add` from any thread; `score_pending` from the scoring thread."""

    def __init__(
        self,
        model: FaultModel,
        *,
        lateness_steps: int = 1,
        max_nodes: int = 100_000,
        history: HistorySource | None = None,
    ) -> None:
        """`history`: the node-history features' source, read only for a model that has them."""
        self.model = model
        self.history = history
        self.lateness_steps = lateness_steps
        self.max_nodes = max_nodes
        self._nodes: dict[str, _Node] = {}
        self._queue: list[ScoredStep] = []
        self._lock = threading.Lock()
        self.unscorable = 0  # steps the model could not score, dropped one by one

    def backlog(self) -> int:
        """Completed steps waiting to be scored (ingest holds collectors back past a bound)."""
        return len(self._queue)

    def nodes(self) -> list[str]:
        """The nodes with feature state, in the order they were first seen."""
        with self._lock:
            return list(self._nodes)

    def add(self, snapshot: NodeSnapshot, arrival_s: float) -> int:
        """Lay one sample on its node's grid; returns how many steps it completed. Raises
        SampleRejected when the sample is for a step already scored or the node table is full."""
        with self._lock:
            node = self._nodes.get(snapshot.node)
            if node is None:
                if len(self._nodes) >= self.max_nodes:
                    raise SampleRejected(
                        "too_many_nodes",
                        f"node {snapshot.node!r} is past the service's {self.max_nodes} nodes",
                    )
                node = self._new_node(snapshot)
                self._nodes[snapshot.node] = node
            for gpu in snapshot.gpus:
                node.uuids[gpu.index] = gpu.uuid
            before = node.online.skipped
            try:
                steps = node.online.add(snapshot)
            except LateSample as exc:
                raise SampleRejected("late", str(exc)) from exc
            skipped = node.online.skipped - before
            if skipped and not node.jumped and skipped >= max(self.model.feature_config.window_steps()):
                # Past the longest window the node's windows restart empty, as after a restart of
                # the service: worth a line (once per node) since its scores lose their history.
                node.jumped = True
                log.warning(
                    "node %r: no sample for %d model steps of its event time (an outage, or its clock "
                    "jumped: this sample is stamped %d s); past the first %d, they were skipped unscored, "
                    "its features as if stepped through: its windows start empty. Logged once per node",
                    snapshot.node,
                    skipped + node.online.empty_steps,
                    snapshot.time_unix_nano // 1_000_000_000,
                    node.online.empty_steps,
                )
            if snapshot.sequence:
                cursors = node.cursors  # most recently used spool last; as many as the service keeps
                cursors[snapshot.spool_id] = max(cursors.pop(snapshot.spool_id, 0), snapshot.sequence)
                while len(cursors) > SPOOLS_PER_NODE:
                    del cursors[next(iter(cursors))]
            node.unsaved_steps += len(steps)
            uuids = tuple(node.uuids)
            for s in steps:
                g = self.model.feature_config.gpus_per_node
                self._queue.append(
                    ScoredStep(
                        snapshot.node, s.index, s.time_s, arrival_s, s.present[:g], s.features[:g], uuids
                    )
                )
            return len(steps)

    def _new_node(self, snapshot: NodeSnapshot) -> _Node:
        config = self.model.feature_config
        step = int(snapshot.time_unix_nano / 1e9 // config.cadence_s)
        online = OnlineFeatures(
            config,
            [snapshot.node],
            0.0,
            lateness_steps=self.lateness_steps,
            first_step=step,
            empty_steps=_empty_steps(self.model),
        )
        return _Node(online, [""] * config.gpus_per_node)

    def node_state(self, name: str) -> NodeScoringState | None:
        """A copy of the node's scoring state (None for a node never seen), for saving; its count of
        steps since the last save starts again. Taken at a moment when every step it completed is
        either scored or in `queued`: a restored copy goes on exactly from here."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            node.unsaved_steps = 0
            queued = [s for s in self._queue if s.node == name]
            return copy.deepcopy(NodeScoringState(node.online, node.uuids, node.jumped, node.cursors, queued))

    def restore_node(self, name: str, state: NodeScoringState) -> None:
        """Take a saved state back (before any sample of the node arrived since the start): its
        completed steps are queued to be scored again, in order, ahead of what comes next."""
        with self._lock:
            if name in self._nodes:
                raise ValueError(f"node {name!r} has scoring state already; restore before any sample")
            state.online.empty_steps = _empty_steps(self.model)
            self._nodes[name] = _Node(state.online, list(state.uuids), state.jumped, dict(state.cursors))
            self._queue.extend(state.queued)

    def completed_through(self, name: str) -> float | None:
        """The event time (seconds) of the node's last completed step (scored or queued); None for
        a node that completed none."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None or node.online.next_step <= 0:
                return None
            online = node.online
            return online.start_s + (online.next_step - 1) * online.config.cadence_s

    def due_for_saving(self, names: set[str], every: int) -> set[str]:
        """Those of `names` that completed at least `every` steps since their state was last saved."""
        with self._lock:
            return {
                n for n in names if (node := self._nodes.get(n)) is not None and node.unsaved_steps >= every
            }

    def cursors(self) -> dict[tuple[str, int], int]:
        """The last sequence taken per (node, spool id)."""
        with self._lock:
            return {
                (name, spool): seq
                for name, node in self._nodes.items()
                for spool, seq in node.cursors.items()
            }

    def score_pending(self) -> list[ScoredStep]:
        """Score every completed step waiting, in one call per head; oldest first. A batch the model
        cannot score is scored again step by step, so that one bad step (a planted state, a shape a
        bug let through) loses itself alone, logged and counted in `unscorable`, not every node's."""
        with self._lock:
            batch, self._queue = self._queue, []
            model = self.model
        if not batch:
            return []
        if self.history is not None and has_history(model.feature_names):
            _fill_history(batch, model, self.history)
        try:
            return _score(batch, model)
        except Exception:
            if len(batch) == 1:
                self.unscorable += 1
                raise
            log.exception("scoring %d steps at once failed; scoring them one by one", len(batch))
        scored = []
        for step in batch:
            try:
                scored += _score([step], model)
            except Exception:
                self.unscorable += 1
                log.exception("step %d of node %s cannot be scored; it is dropped", step.step, step.node)
        return scored

    def swap_model(self, model: FaultModel) -> bool:
        """Serve `model` from the next score on; True when the nodes' feature state carries over
        (same features and cadence), False when it had to restart (a warm-up follows)."""
        with self._lock:
            same = (
                model.feature_names == self.model.feature_names
                and model.feature_config == self.model.feature_config
            )
            self.model = model
            if not same:
                self._nodes.clear()
                self._queue.clear()
            empty_steps = _empty_steps(model)
            for node in self._nodes.values():
                node.online.empty_steps = empty_steps
            return same


def _fill_history(batch: list[ScoredStep], model: FaultModel, source: HistorySource) -> None:
    """Each step's history columns (the last ones) from `source` at the step's time, in one call."""
    g = model.feature_config.gpus_per_node
    rows = source.rows([s.node for s in batch], np.array([s.time_s for s in batch]), g)
    k = len(HISTORY_NAMES)
    for i, s in enumerate(batch):
        s.features[:, -k:] = rows[i * g : (i + 1) * g]


def _score(batch: list[ScoredStep], model: FaultModel) -> list[ScoredStep]:
    """Score the steps in one call per head: each step's risk, and the mode, time and top heads of
    its rows near an alert."""
    present = np.concatenate([s.present for s in batch])
    x = np.concatenate([s.features for s in batch])[present]
    risk = np.full(len(present), np.nan)
    ttf = np.full(len(present), np.nan)
    modes = np.full(len(present), "", dtype=object)
    near_heads: list[tuple[int, Heads]] = []  # (batch row, its heads) for the rows near an alert
    if len(x):
        r = model.risk(x)
        risk[present] = r
        # The mode and time heads are many more trees than the risk: they run only for rows
        # near an alert (half the threshold and up); the others are labelled "none".
        near = r >= NEAR_THRESHOLD * model.open_threshold
        rows = np.nonzero(present)[0]
        modes[rows] = "none"
        if near.any():
            heads = read_heads(model, x[near], r[near])
            ttf[rows[near]] = heads.ttf_s[:, TTF_QUANTILES.index(0.5)]
            if model.modes:
                modes[rows[near]] = np.asarray(model.modes, dtype=object)[
                    np.argmax(heads.mode_probabilities, axis=1)
                ]
            near_heads = [(int(row), heads.row(i)) for i, row in enumerate(rows[near])]
    g = model.feature_config.gpus_per_node
    for i, s in enumerate(batch):
        s.risk, s.ttf_s, s.mode = (
            risk[i * g : (i + 1) * g],
            ttf[i * g : (i + 1) * g],
            list(modes[i * g : (i + 1) * g]),
        )
        s.heads = {}
    for row, heads_of_row in near_heads:
        batch[row // g].heads[row % g] = heads_of_row
    return batch
