"""The shadow: a challenger scored beside the serving model on the same samples, alerting nothing
(docs/model.md, "The shadow").

Its own `Scorer` takes each sample after the serving scorer took it; after each serving batch has gone
through the alert book, `observe` scores the challenger's completed steps and keeps, per node and step,
each model's highest GPU risk in the state database (`shadow_steps`), for the window the comparison
(service/shadow_compare.py) judges. Nothing here may stop the serving path: a refused sample is only
not shadowed, a failed write is logged and the steps are lost to the comparison.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np

from faultcast.model.artifact import FaultModel
from faultcast.readings import NodeSnapshot
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.rpc.validation import SampleRejected
from faultcast.service.scoring import HistorySource, ScoredStep, Scorer
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.models import ShadowSteps

log = logging.getLogger(__name__)

WINDOW_S = 14 * 86400.0  # the steps kept for the comparison


class Shadow:
    """One challenger (`model_id` in the registry) scored beside the serving model."""

    def __init__(
        self,
        model_id: str,
        model: FaultModel,
        steps: ShadowSteps,
        metrics: ServiceMetrics,
        *,
        lateness_steps: int = 1,
        max_nodes: int = 100_000,
        window_s: float = WINDOW_S,
        history: HistorySource | None = None,
    ) -> None:
        self.model_id = model_id
        self.scorer = Scorer(model, lateness_steps=lateness_steps, max_nodes=max_nodes, history=history)
        self.steps, self.metrics = steps, metrics
        self.keep_ns = int(window_s * 1e9)
        self._lock = threading.Lock()  # one observe at a time
        self._failing = False

    @property
    def model(self) -> FaultModel:
        """The challenger."""
        return self.scorer.model

    def add(self, snapshot: NodeSnapshot, arrival_s: float) -> None:
        """Lay a sample the serving scorer took on the challenger's grid (refused: not shadowed)."""
        with contextlib.suppress(SampleRejected):
            self.scorer.add(snapshot, arrival_s)

    def observe(self, serving: list[ScoredStep], serving_threshold: float) -> None:
        """Keep the serving model's scored steps and score and keep the challenger's completed ones."""
        with self._lock:
            challenger = self.scorer.score_pending()
            rows = {"serving": _highest(serving), "challenger": _highest(challenger)}
            for column, threshold in (("serving", serving_threshold), ("challenger", self.model.threshold)):
                self.metrics.shadow_steps.labels(column).inc(len(rows[column]))
                over = sum(1 for _, _, risk in rows[column] if risk >= threshold)
                self.metrics.shadow_over_threshold.labels(column).inc(over)
            try:
                for column, risks in rows.items():
                    self.steps.record(self.model_id, column, risks, self.keep_ns)
            except StateWriteError as exc:
                if not self._failing:
                    log.error("the shadow's steps are not kept (%s); the comparison misses them", exc)
                self._failing = True
                return
            self._failing = False


def _highest(steps: list[ScoredStep]) -> list[tuple[str, int, float]]:
    """(node, step time, the highest GPU risk) of each step with a GPU scored."""
    out = []
    for s in steps:
        risk = s.risk[~np.isnan(s.risk)] if len(s.risk) else s.risk
        if len(risk):
            out.append((s.node, round(s.time_s * 1e9), float(risk.max())))
    return out
