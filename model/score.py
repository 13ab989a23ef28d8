"""Scoring a data directory with a model: the alerts it would have raised, and what followed them.

`score` runs the model over every node of the data (after a warm-up that fills the feature
windows, as `faultcast evaluate` does), applies the model's own threshold and alert policy, and
groups the alerts into incidents the way an operator sees them (the GPUs of one node opening in
the same step are one incident). Each incident carries the most likely failure mode, the risk
within 5, 15 and 30 minutes and the three features that pushed the risk up most, all from its
highest-risk GPU, and, when the data has a failure log, the failure that followed within the
horizon and the lead time.
"""

from __future__ import annotations

import csv
import datetime as dt
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from faultcast.model.alerting import alert_starts, incidents
from faultcast.model.artifact import TTF_BUCKETS_S, FaultModel, load
from faultcast.model.dataset import DataError, Dataset, Step, open_dataset, replay
from faultcast.model.evaluate import WARMUP_S, score_period

log = logging.getLogger(__name__)

TOP_FEATURES = 3
CSV_FIELDS: tuple[str, ...] = (
    "time", "node", "gpus", "risk", "mode", "mode_probability",
    *(f"risk_{int(s // 60)}min" for s in TTF_BUCKETS_S),
    *(f"feature_{i + 1}" for i in range(TOP_FEATURES)),
    "followed_by_failure", "failure_time", "failure_gpu", "failure_mode", "lead_min",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FollowingFailure:
    """The first failure in the log, of an alerted GPU or its node, within the horizon after an alert."""

    time_s: float  # unix seconds
    gpu: int  # -1: the whole node
    mode: str
    lead_s: float  # failure time minus alert time


@dataclass(frozen=True, slots=True)
class ScoredAlert:
    """One incident the model would have raised."""

    time_s: float  # unix seconds of the grid step the alert opened in
    node: str
    gpus: tuple[int, ...]
    gpus_per_node: int
    risk: float  # calibrated risk of failing within the horizon (the highest of the incident's GPUs)
    mode: str  # most likely failure mode
    mode_probability: float
    risk_within: tuple[float, ...]  # risk of failing within each of TTF_BUCKETS_S
    top_features: tuple[tuple[str, float, float], ...]  # (feature, value, contribution to the raw score)
    failure: FollowingFailure | None
    failure_log: bool  # False: the data has no failure log, so `failure` says nothing

    @property
    def time(self) -> str:
        return _iso(self.time_s)

    @property
    def node_level(self) -> bool:
        """Every GPU of the node alerted at once: a node-level signal."""
        return len(self.gpus) == self.gpus_per_node > 1

    @property
    def followed(self) -> bool | None:
        """Whether a failure followed within the horizon; None without a failure log."""
        return (self.failure is not None) if self.failure_log else None

    @property
    def gpu_text(self) -> str:
        return "all" if self.node_level else " ".join(str(g) for g in self.gpus)


def _iso(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def score(model_dir: Path, data_dir: Path, *, warmup_s: float = WARMUP_S) -> list[ScoredAlert]:
    """Load the model and the data, and list the alerts the model would have raised (sorted by time,
    node, GPUs). Raises ModelError or DataError saying what is wrong."""
    return score_dataset(load(model_dir), open_dataset(data_dir), warmup_s=warmup_s)


def score_dataset(model: FaultModel, dataset: Dataset, *, warmup_s: float = WARMUP_S) -> list[ScoredAlert]:
    """`score` for a loaded model and data set. Alerts start after `warmup_s` of data."""
    start = dataset.start_s + warmup_s
    if start >= dataset.end_s:
        raise DataError(
            f"{dataset.path}: the data covers {dataset.days * 24:.1f} h, and scoring starts after "
            f"{warmup_s / 3600:.1f} h of warm-up that fills the feature windows"
        )
    nodes = list(range(len(dataset.nodes)))
    period = score_period(dataset, model, nodes, start, dataset.end_s)
    if len(period.times_s) == 0:
        return []
    cadence = model.feature_config.cadence_s
    risk = period.scores["model"]
    starts = alert_starts(risk, period.present, [model.threshold], model.policy, cadence)[0]
    found = incidents(period, starts)
    if not found:
        return []
    features = _features_at(dataset, model, start, found, period.times_s)
    g = model.feature_config.gpus_per_node
    failure_log = bool(dataset.manifest.get("failure_log", True))
    alerts = []
    for step, node, gpus in found:
        t = float(period.times_s[step])
        slots = [period.slot_of(node, gpu) for gpu in gpus]
        best = int(np.argmax(risk[step, slots]))
        row = features[(_grid_index(dataset, t, cadence), node)][gpus[best]][None, :]
        recomputed = float(model.risk(row)[0])
        if not math.isclose(recomputed, float(risk[step, slots[best]]), rel_tol=1e-6, abs_tol=1e-9):
            log.warning("feature replay differs at %s on %s: risk %.6f, scored %.6f", _iso(t),
                        dataset.nodes[node], recomputed, risk[step, slots[best]])  # fmt: skip
        modes = model.mode_probabilities(row)[0]
        likely = int(np.argmax(modes))
        alerts.append(
            ScoredAlert(
                time_s=t,
                node=dataset.nodes[node],
                gpus=tuple(sorted(gpus)),
                gpus_per_node=g,
                risk=float(risk[step, slots[best]]),
                mode=model.modes[likely] if model.modes else "unknown",
                mode_probability=float(modes[likely]) if len(modes) else float("nan"),
                risk_within=tuple(float(v) for v in model.risk_within(row)[0]),
                top_features=tuple(model.contributions(row, top=TOP_FEATURES)[0]),
                failure=_following(dataset, node, gpus, t, model.horizon_s) if failure_log else None,
                failure_log=failure_log,
            )
        )
    return sorted(alerts, key=lambda a: (a.time_s, a.node, a.gpus))


def _grid_index(dataset: Dataset, time_s: float, cadence: float) -> int:
    return round((time_s - dataset.start_s) / cadence)


def _features_at(
    dataset: Dataset,
    model: FaultModel,
    start: float,
    found: list[tuple[int, int, tuple[int, ...]]],
    times_s: np.ndarray,
) -> dict[tuple[int, int], np.ndarray]:
    """(grid index, node) -> (gpus_per_node, features) at each incident, from a second replay of only
    the alerted nodes. It starts where score_period's did, so the features are the ones scored."""
    cadence = model.feature_config.cadence_s
    g = model.feature_config.gpus_per_node
    nodes = sorted({node for _, node, _ in found})
    local = {node: i for i, node in enumerate(nodes)}
    wanted: dict[int, list[int]] = {}
    for step, node, _ in found:
        wanted.setdefault(_grid_index(dataset, float(times_s[step]), cadence), []).append(node)
    kept: dict[tuple[int, int], np.ndarray] = {}

    def sink(step: Step) -> None:
        for node in wanted.get(step.index, ()):
            base = local[node] * g
            kept[(step.index, node)] = step.features[base : base + g].copy()

    last = max(float(times_s[step]) for step, _, _ in found)
    replay(dataset, model.feature_config, sink, nodes=nodes, start_s=start - WARMUP_S, end_s=last + cadence)
    return kept


def _following(
    dataset: Dataset, node: int, gpus: Sequence[int], time_s: float, horizon_s: float
) -> FollowingFailure | None:
    for failure in dataset.failures.between(time_s, time_s + horizon_s, [node]):  # in time order
        if failure.gpu < 0 or failure.gpu in gpus:
            return FollowingFailure(failure.time_s, failure.gpu, failure.mode, failure.time_s - time_s)
    return None


def _feature_text(feature: tuple[str, float, float]) -> str:
    name, value, contribution = feature
    return f"{name}={value:.4g} ({contribution:+.2f})"


def _rows(alerts: Sequence[ScoredAlert]) -> list[dict[str, str]]:
    rows = []
    for a in alerts:
        row = {
            "time": a.time,
            "node": a.node,
            "gpus": a.gpu_text,
            "risk": f"{a.risk:.4f}",
            "mode": a.mode,
            "mode_probability": f"{a.mode_probability:.3f}",
        }
        for seconds, value in zip(TTF_BUCKETS_S, a.risk_within, strict=True):
            row[f"risk_{int(seconds // 60)}min"] = f"{value:.4f}"
        for i in range(TOP_FEATURES):
            row[f"feature_{i + 1}"] = _feature_text(a.top_features[i]) if i < len(a.top_features) else ""
        f = a.failure
        row["followed_by_failure"] = "" if a.followed is None else str(a.followed).lower()
        row["failure_time"] = _iso(f.time_s) if f else ""
        row["failure_gpu"] = ("all" if f.gpu < 0 else str(f.gpu)) if f else ""
        row["failure_mode"] = f.mode if f else ""
        row["lead_min"] = f"{f.lead_s / 60:.1f}" if f else ""
        rows.append(row)
    return rows


def write_csv(alerts: Sequence[ScoredAlert], path: Path) -> None:
    """One row per alert, CSV_FIELDS columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(_rows(alerts))


def render_table(alerts: Sequence[ScoredAlert]) -> str:
    """A Markdown table of the alerts, readable in a terminal."""
    buckets = "/".join(str(int(s // 60)) for s in TTF_BUCKETS_S)
    lines = [
        f"| time | node | GPU | risk | likely mode | risk within {buckets} min | top features | followed by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, row in zip(alerts, _rows(alerts), strict=True):
        within = " / ".join(f"{v:.2f}" for v in a.risk_within)
        features = "; ".join(_feature_text(f) for f in a.top_features)
        if a.followed is None:
            outcome = "(no failure log)"
        elif a.failure is None:
            outcome = "nothing (false alarm)"
        else:
            outcome = f"{a.failure.mode} on GPU {row['failure_gpu']} after {row['lead_min']} min"
        lines.append(
            f"| {a.time} | {a.node} | {a.gpu_text} | {a.risk:.3f} | {a.mode} ({a.mode_probability:.0%}) "
            f"| {within} | {features} | {outcome} |"
        )
    return "\n".join(lines)


def summary(alerts: Sequence[ScoredAlert]) -> str:
    if not alerts:
        return "no alerts"
    text = f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}"
    if alerts[0].failure_log:
        followed = sum(1 for a in alerts if a.failure is not None)
        text += f", {followed} followed by a failure within the horizon"
    return text
