"""Feature drift over time, in the service: how far the fleet's feature rows sit from the model's
training rows (faultcast.model.evaluation.drift), exported per feature group as
`faultcast_feature_drift_psi{group}`, with `faultcast_calibration_timestamp_seconds` (when
`faultcast calibrate --apply` chose the threshold that serves; 0 when it did not).

The monitor keeps a bounded sample of the rows it is shown, by event time: one reservoir of at most
`capacity / buckets` rows per `every_s` of event time, over the last `window_s` (6 h by default: 72
buckets of 5 minutes, 8,192 rows in all, 11 MB at 342 features). Each time event time enters a new
bucket it computes PSI per group over the window's rows against the reference and sets the gauges,
once the window holds `min_rows`. A model without reference.json (or one built for other features)
exports no drift series, and says why once in the log.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from prometheus_client import Gauge

from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation import drift
from faultcast.model.training.calibrate import read_basis
from faultcast.service.scoring import ScoredStep

log = logging.getLogger(__name__)


class _Reservoir:
    """A uniform sample of at most `size` of the rows offered (algorithm R, vectorised)."""

    def __init__(self, size: int, features: int, rng: np.random.Generator) -> None:
        self.rows = np.empty((0, features), dtype=np.float32)
        self.size = size
        self.seen = 0
        self.rng = rng

    def offer(self, x: np.ndarray) -> None:
        take = x[: max(0, self.size - len(self.rows))]
        if len(take):
            self.rows = np.concatenate([self.rows, take.astype(np.float32)])
            self.seen += len(take)
            x = x[len(take) :]
        if len(x):
            slot = self.rng.integers(0, self.seen + 1 + np.arange(len(x)))
            kept = slot < self.size
            self.rows[slot[kept]] = x[kept]
            self.seen += len(x)


class DriftMonitor:
    """Samples scored feature rows by event time and exports PSI per feature group; `use` on start
    and on every reload (the reference and the calibration time are the model directory's)."""

    def __init__(
        self,
        psi: Gauge,
        calibrated: Gauge,
        *,
        window_s: float = 6 * 3600.0,
        every_s: float = 300.0,
        capacity: int = 8192,
        min_rows: int = 500,
        seed: int = 0,
    ) -> None:
        self.psi = psi
        self.calibrated = calibrated
        self.window_s = window_s
        self.every_s = every_s
        self.buckets = max(1, math.ceil(window_s / every_s))
        self.per_bucket = max(1, capacity // self.buckets)
        self.min_rows = min_rows
        self.rng = np.random.default_rng(seed)
        self.reference: drift.FeatureReference | None = None
        self._window: OrderedDict[int, _Reservoir] = OrderedDict()
        self._exported: set[str] = set()
        self.last: dict[str, float] = {}  # the latest PSI per group (what the gauges show)
        self._lock = threading.Lock()  # `use` runs on a reload's thread, `observe` on the scoring thread

    def use(self, model_dir: Path, model: FaultModel) -> None:
        """Read the reference and the calibration time of the model now serving from `model_dir`;
        the sample starts over (rows of other features, or of a model with other inputs, differ)."""
        try:
            reference = drift.load_reference(model_dir)
        except drift.DriftReferenceError as exc:
            log.warning("feature drift is not exported: %s", exc)
            reference = None
        if reference is None:
            log.info("feature drift is not exported: %s has no %s", model_dir, drift.FILE)
        elif reference.names != model.feature_names:
            log.warning("feature drift is not exported: %s/%s is for other features", model_dir, drift.FILE)
            reference = None
        with self._lock:
            self.reference = reference
            self._window.clear()
            self._clear()
        choice = model.threshold_choice
        when = read_basis(choice.basis) if choice is not None else None
        self.calibrated.set(when if when is not None else 0.0)

    def observe(self, scored: Sequence[ScoredStep]) -> None:
        """Sample the present rows of `scored`; compute and export PSI when event time enters a new
        bucket (every `every_s`)."""
        with self._lock:
            self._observe(scored)

    def _observe(self, scored: Sequence[ScoredStep]) -> None:
        if self.reference is None or not scored:
            return
        newest = max(self._window, default=None)
        for s in scored:
            rows = s.features[s.present]
            if not len(rows):
                continue
            bucket = int(s.time_s // self.every_s)
            if newest is not None and bucket <= newest - self.buckets:
                continue  # older than the window (a late node)
            reservoir = self._window.get(bucket)
            if reservoir is None:
                reservoir = _Reservoir(self.per_bucket, rows.shape[1], self.rng)
                self._window[bucket] = reservoir
            reservoir.offer(rows)
        latest = max(self._window, default=None)
        if latest is None or latest == newest:
            return
        for old in [b for b in self._window if b <= latest - self.buckets]:
            del self._window[old]
        self._update()

    def rows(self) -> int:
        """Rows in the window's sample now."""
        return sum(len(r.rows) for r in list(self._window.values()))

    def update(self) -> dict[str, float]:
        """Compute PSI per group over the window's sample and set the gauges (nothing below
        `min_rows` rows); returns what was exported."""
        with self._lock:
            return self._update()

    def _update(self) -> dict[str, float]:
        if self.reference is None or self.rows() < self.min_rows:
            return {}
        x = np.concatenate([r.rows for r in self._window.values()])
        by_group = drift.psi_by_group(self.reference, x)
        for group in self._exported - set(by_group):
            self.psi.remove(group)
        for group, value in by_group.items():
            self.psi.labels(group).set(value)
        self._exported = set(by_group)
        self.last = by_group
        return by_group

    def _clear(self) -> None:
        for group in self._exported:
            self.psi.remove(group)
        self._exported = set()
        self.last = {}
