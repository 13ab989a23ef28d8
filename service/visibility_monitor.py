"""What the serving model can see of the samples it receives: per feature group
(faultcast.model.evaluation.visibility), the share of the group's features whose inputs arrive non-missing,
exported as `faultcast_model_feature_group_visible{group}`: 1 the group sees, 0 it is blind (every
group starts at 0, before any sample). `faultcast calibrate` and `faultcast score` print the same
groups for a data directory, with the exporter lines that would add what is missing.

Ingest is the hot path: `observe` costs a clock read, a comparison and a note of the sample's time
per sample. One sample in `every_s` seconds of the service's clock is looked at: its GPUs' values and
its devices say which inputs arrived (an input arrives when any GPU, port, peer or the host carries a
value for it). An input counts as arriving for `window_s` after a look last saw it, so a collector
that stops sending a metric shows as blind within `window_s`. The step summary arrives when the
sample's step holds MIN_SCRAPES scrapes or more, reckoned from the sample: the scrapes it summarises
(one without a summary) over the time since its node's previous sample (its window without one),
scaled to the model's step: a collector summarising its steps, or plain samples every 10 s or faster
at a 60 s step. The gauges are set at each look.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np
from prometheus_client import Gauge

from faultcast.catalogue import Scope, by_name, index_of
from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.visibility import FeatureMap
from faultcast.model.features.groups import input_group
from faultcast.readings import NodeSnapshot
from faultcast.step_summary import MIN_SCRAPES, SCRAPES_COLUMN


class VisibilityMonitor:
    """Looks at a sampled view of the incoming samples and sets the visibility gauges; `use` on start
    and on every reload (the groups and inputs are the model's)."""

    def __init__(
        self,
        visible: Gauge,
        *,
        every_s: float = 10.0,
        window_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.visible = visible
        self.every_s = every_s
        self.window_s = window_s
        self.clock = clock
        self.last: dict[str, float] = {}  # the latest share per group (what the gauges show)
        self._lock = threading.Lock()
        self._map: FeatureMap | None = None
        self._cadence_s = 60.0
        self._gpu: list[tuple[str, int]] = []  # GPU inputs and their places in a GPU's values
        self._node: list[tuple[str, Scope, int]] = []  # node inputs, their scope and place
        self._summary: list[tuple[str, str]] = []  # summary columns and the gauge each summarises
        self._seen: dict[str, float] = {}  # input -> when a look last saw it
        self._next_look = -math.inf
        self._previous: dict[str, int] = {}  # node -> its last sample's time (ns)
        self._exported: set[str] = set()

    def use(self, model: FaultModel) -> None:
        """Serve `model`'s groups; what was seen starts over and every group shows blind until a look."""
        fmap = FeatureMap.of(tuple(model.feature_names))
        gpu_index = index_of(Scope.GPU)
        with self._lock:
            self._map = fmap
            self._cadence_s = model.feature_config.cadence_s
            self._gpu = [(name, gpu_index[name]) for name in fmap.inputs if name in gpu_index]
            self._node = []
            self._summary = []
            for name in fmap.inputs:
                if input_group(name) == "step summaries":
                    if name != SCRAPES_COLUMN:
                        self._summary.append((name, name.rsplit("_step_", 1)[0]))
                elif name not in gpu_index:
                    scope = by_name(name).scope
                    self._node.append((name, scope, index_of(scope)[name]))
            self._seen.clear()
            self._previous.clear()
            self._next_look = -math.inf
            for group in self._exported - set(fmap.group_names()):
                self.visible.remove(group)
            self._publish(self.clock())

    def observe(self, snapshot: NodeSnapshot) -> None:
        """Take note of one accepted sample (ingest's path: cheap unless a look is due)."""
        previous = self._previous.get(snapshot.node)
        self._previous[snapshot.node] = snapshot.time_unix_nano
        now = self.clock()
        if now < self._next_look:
            return
        with self._lock:
            if now >= self._next_look:
                self._look(snapshot, previous, now)

    def _step_scrapes(self, snapshot: NodeSnapshot, previous: int | None) -> float:
        """The scrapes a model step of this node's samples summarises, reckoned from one sample."""
        summary = snapshot.gpus[0].summary
        scrapes = summary.scrapes if summary is not None else 1
        if previous is not None and snapshot.time_unix_nano > previous:
            span = (snapshot.time_unix_nano - previous) / 1e9
        elif snapshot.window_s > 0:
            span = snapshot.window_s
        else:
            return 0.0  # the node's first sample, summarising nothing said: unknown yet
        return scrapes * self._cadence_s / max(span, 1e-9)

    def _look(self, snapshot: NodeSnapshot, previous: int | None, now: float) -> None:
        self._next_look = now + self.every_s
        if self._map is None:
            return
        if snapshot.gpus:
            values = np.array([gpu.values for gpu in snapshot.gpus], dtype=np.float64)
            columns = np.array([i for _, i in self._gpu], dtype=np.int64)
            arrived = np.asarray(~np.isnan(values[:, columns]).all(axis=0), dtype=bool)
            for k, (name, _) in enumerate(self._gpu):
                if arrived[k]:
                    self._seen[name] = now
        for name, scope, i in self._node:
            if scope is Scope.HOST:
                found = len(snapshot.host) > i and not math.isnan(snapshot.host[i])
            else:
                found = any(d.scope is scope and not math.isnan(d.values[i]) for d in snapshot.devices)
            if found:
                self._seen[name] = now
        if snapshot.gpus and self._step_scrapes(snapshot, previous) >= MIN_SCRAPES:
            self._seen[SCRAPES_COLUMN] = now
        self._publish(now)

    def _publish(self, now: float) -> None:
        """Set every group's gauge from the inputs seen within the window (the lock held)."""
        if self._map is None:
            return
        fresh = {name for name, when in self._seen.items() if now - when <= self.window_s}
        if SCRAPES_COLUMN in fresh:
            fresh |= {name for name, gauge in self._summary if gauge in fresh}
        shares = self._map.visible_share(fresh)
        for group, share in shares.items():
            self.visible.labels(group).set(share)
        self._exported = set(shares)
        self.last = shares
