"""The model replayed on twin telemetry it never trained on: at each alert threshold, what each
failure's alert was (lead or miss) and how often healthy nodes were alerted.

The service's own alert state machine (model/incidents.py, as in `faultcast evaluate`) opens the
incidents, at every threshold in one pass. The goodput twin then judges them by their consequences,
not by `faultcast evaluate`'s prediction period: an alert drains its whole node, and a drained node
stays out until inspection finds it healthy (`drain_s`) or it fails. So a failure is foreseen when
an incident on its node opened within `drain_s` before it (its lead is from the earliest one): the
job had moved away. An incident whose node does not fail within `drain_s` is a false alarm that
took a healthy node out for inspection; incidents on a node already out change nothing. An alert
that `faultcast evaluate` calls premature (its failure came more than the 2-hour prediction period
later) therefore still saves the job when it came within `drain_s`; one it calls true but that
named another GPU of the failing node saves it too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.goodput.process import AlertSample
from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.outcomes import (
    ScoredPeriod,
    incidents,
)
from faultcast.model.features.offline import Dataset, FailureLog
from faultcast.model.incidents import AlertPolicy
from faultcast.modes import NODE_LEVEL_MODES

log = logging.getLogger(__name__)

# What the replay's matching is, for its cache: a cached replay made by other rules is not reused.
REPLAY_RULES = "state-machine-incidents/node-drain-window"
# Thresholds swept besides the model's own: calibrated risks from 1% to 95%.
SWEEP = tuple(float(x) for x in np.geomspace(0.01, 0.95, 28))


@dataclass(frozen=True)
class Replay:
    """Alert samples at every swept threshold, and where they came from."""

    samples: tuple[AlertSample, ...]  # ascending threshold
    model_threshold: float
    failures: int
    failures_by_mode: dict[str, int]
    gpu_days: float
    source: dict[str, object]  # the model's digest, the twin's configuration, drain_s

    def at(self, threshold: float) -> AlertSample:
        """The sample at the swept threshold nearest `threshold`."""
        return min(self.samples, key=lambda s: abs(s.threshold - threshold))

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict; from_json(json.loads(json.dumps(...))) gives an equal Replay back."""
        return {
            "samples": [
                {
                    "threshold": s.threshold,
                    "false_alarms_per_gpu_day": s.false_alarms_per_gpu_day,
                    "leads_s": {m: list(v) for m, v in s.leads_s.items()},
                }
                for s in self.samples
            ],
            "model_threshold": self.model_threshold,
            "failures": self.failures,
            "failures_by_mode": self.failures_by_mode,
            "gpu_days": self.gpu_days,
            "source": self.source,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Replay:
        """The inverse of to_json; KeyError, ValueError or TypeError for a dict of another shape."""
        return Replay(
            samples=tuple(
                AlertSample(
                    float(s["threshold"]),
                    {m: tuple(v) for m, v in s["leads_s"].items()},
                    float(s["false_alarms_per_gpu_day"]),
                )
                for s in data["samples"]
            ),
            model_threshold=float(data["model_threshold"]),
            failures=int(data["failures"]),
            failures_by_mode={str(k): int(v) for k, v in data["failures_by_mode"].items()},
            gpu_days=float(data["gpu_days"]),
            source=dict(data["source"]),
        )


def model_digest(model: FaultModel) -> str:
    """The model's identity: the SHA-256 of its booster file, as its manifest records it."""
    return model.card.files["model.txt"]


def samples_at(
    period: ScoredPeriod,
    failures: FailureLog,
    thresholds: Sequence[float],
    policy: AlertPolicy,
    drain_s: float,
) -> list[AlertSample]:
    """One AlertSample per threshold, from a single pass of the state machine over the scores."""
    found = incidents(period, "model", thresholds, policy, NODE_LEVEL_MODES)
    rows = failures.between(float(period.times_s[0]), float(period.times_s[-1]), period.nodes)
    failures_by_node: dict[int, list[float]] = {}
    for f in sorted(rows, key=lambda f: f.time_s):
        failures_by_node.setdefault(f.node, []).append(f.time_s)
    out = []
    for threshold, these in zip(thresholds, found, strict=True):
        by_node: dict[int, list[float]] = {}
        for incident in these:
            by_node.setdefault(period.nodes[incident.node], []).append(
                float(period.times_s[incident.opened_step])
            )
        leads: dict[str, list[float | None]] = {}
        for f in rows:
            opened = [t for t in by_node.get(f.node, []) if f.time_s - drain_s <= t < f.time_s]
            leads.setdefault(f.mode, []).append(f.time_s - min(opened) if opened else None)
        false = 0
        for node, times in by_node.items():
            node_failures = failures_by_node.get(node, [])
            out_until = -math.inf
            for t in sorted(times):
                if t < out_until:
                    continue  # the node is out already: this alert changes nothing
                coming = [ft for ft in node_failures if t < ft <= t + drain_s]
                if coming:
                    out_until = coming[0] + drain_s  # failed, then repaired at least this long
                else:
                    false += 1
                    out_until = t + drain_s
        out.append(AlertSample(float(threshold), leads, false / max(period.gpu_days, 1e-9)))
    return out


def replay(
    model: FaultModel,
    dataset: Dataset,
    nodes: Sequence[int],
    start_s: float,
    drain_s: float,
    source: dict[str, object],
) -> Replay:
    """Score `nodes` of `dataset` from `start_s` with the model and sweep the thresholds."""
    from faultcast.model.evaluation.evaluate import score_period

    period = score_period(dataset, model, nodes, start_s, dataset.end_s)
    trained = trained_threshold(model)
    thresholds = sorted({*SWEEP, trained})
    samples = samples_at(period, dataset.failures, thresholds, model.policy, drain_s)
    rows = dataset.failures.between(float(period.times_s[0]), float(period.times_s[-1]), period.nodes)
    by_mode: dict[str, int] = {}
    for f in rows:
        by_mode[f.mode] = by_mode.get(f.mode, 0) + 1
    return Replay(tuple(samples), trained, len(rows), by_mode, period.gpu_days, source)


def trained_threshold(model: FaultModel) -> float:
    """The threshold training chose (a threshold file may serve another)."""
    return model.card.threshold


def cache_key(source: dict[str, object]) -> str:
    """16 hex digits of the SHA-256 of `source` as sorted JSON: equal sources, equal keys."""
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]


def load_cached(path: Path, source: dict[str, object]) -> Replay | None:
    """A replay saved for exactly this source; None when absent or unreadable (said in the log)."""
    if not path.is_file():
        return None
    try:
        found = Replay.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable replay cache %s: %s", path, exc)
        return None
    return found if found.source == source else None


def save(path: Path, result: Replay) -> None:
    """Write `result` as JSON to `path` atomically (a temporary file, then a rename), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True))
    tmp.replace(path)
