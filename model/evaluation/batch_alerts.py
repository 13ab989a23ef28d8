"""Scoring a data directory with a model: the alerts it would have raised, and what followed them.

`score` runs the model over every node of the data (after a warm-up that fills the feature
windows, as `faultcast evaluate` does) through the service's own alert state machine
(model/incidents.py) at the model's threshold, so each row is one incident as an operator would
have seen it: one alert per GPU, or per node for a node-level mode. Each carries what the service's
alert would say when it opened (model/alert_content.py: the likely mode, the risk within 5, 15 and
30 minutes, the time to failure as p10/p50/p90, the recommended action and the three features that
pushed the risk up most), from its highest-risk GPU, and, when the data has a failure log, what
followed it under the prediction-period convention of `faultcast evaluate` (model/evaluation/outcomes.py):
true, late, premature or false, with the failure it points at and the lead.
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

from faultcast.alert_text import times_threshold
from faultcast.model.alert_content import AlertContent, describe
from faultcast.model.artifact import TTF_BUCKETS_S, FaultModel, load
from faultcast.model.evaluation.evaluate import WARMUP_S, score_period
from faultcast.model.evaluation.outcomes import DEFAULT_PERIODS, Outcome, PredictionPeriods, incidents, judge
from faultcast.model.features.offline import DataError, Dataset, Step, open_dataset, replay
from faultcast.model.incidents import Incident
from faultcast.modes import NODE_LEVEL_MODES

log = logging.getLogger(__name__)

TOP_FEATURES = 3
CSV_FIELDS: tuple[str, ...] = (
    "time", "node", "gpu", "gpus", "risk", "mode", "mode_probability",
    *(f"risk_{int(s // 60)}min" for s in TTF_BUCKETS_S),
    "ttf_p10_min", "ttf_p50_min", "ttf_p90_min", "action",
    *(f"feature_{i + 1}" for i in range(TOP_FEATURES)),
    "outcome", "failure_time", "failure_gpu", "failure_mode", "lead_min",
    "threshold", "risk_x_threshold",  # added after the rest: readers of the older columns still read them
)  # fmt: skip  # the CSV's columns packed as they read


@dataclass(frozen=True, slots=True)
class FollowingFailure:
    """The first failure the alert points at (its GPU, or its node for a node-level alert) within a
    day after it opened."""

    time_s: float  # unix seconds
    gpu: int  # -1: the whole node
    mode: str
    lead_s: float  # failure time minus alert time


@dataclass(frozen=True, slots=True)
class ScoredAlert:
    """One incident the model would have raised."""

    time_s: float  # unix seconds of the grid step the alert opened in
    node: str
    gpu: int  # -1: a node-level alert
    gpus: tuple[int, ...]  # the GPUs that opened it in that step
    gpus_per_node: int
    content: AlertContent  # what the alert said, from its highest-risk GPU
    outcome: Outcome | None  # None: the data has no failure log
    failure: FollowingFailure | None
    threshold: float = math.nan  # the model's alert threshold the risk crossed (NaN: not known)

    @property
    def time(self) -> str:
        """When it opened, ISO 8601 UTC."""
        return _iso(self.time_s)

    @property
    def node_level(self) -> bool:
        """A node-level alert (no one GPU)."""
        return self.gpu < 0

    @property
    def risk(self) -> float:
        """The risk when it opened, from its highest-risk GPU."""
        return self.content.risk

    @property
    def mode(self) -> str:
        """The likely failure mode when it opened."""
        return self.content.mode

    @property
    def gpu_text(self) -> str:
        """The GPU index, or "node" for a node-level alert."""
        return "node" if self.node_level else str(self.gpu)


def _iso(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def score(
    model_dir: Path,
    data_dir: Path,
    *,
    warmup_s: float = WARMUP_S,
    periods: PredictionPeriods = DEFAULT_PERIODS,
) -> list[ScoredAlert]:
    """Load the model and the data, and list the alerts the model would have raised (sorted by time,
    node, GPU). Raises ModelError or DataError saying what is wrong."""
    return score_dataset(load(model_dir), open_dataset(data_dir), warmup_s=warmup_s, periods=periods)


def score_dataset(
    model: FaultModel,
    dataset: Dataset,
    *,
    warmup_s: float = WARMUP_S,
    periods: PredictionPeriods = DEFAULT_PERIODS,
) -> list[ScoredAlert]:
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
    risk = period.scores["model"]
    found = incidents(period, "model", [model.threshold], model.policy, NODE_LEVEL_MODES)[0]
    if not found:
        return []
    cadence = model.feature_config.cadence_s
    features = _features_at(dataset, model, start, found, period.times_s)
    g = dataset.gpus_per_node  # the data's node size, whatever the model was trained on
    failure_log = bool(dataset.manifest.get("failure_log", True))
    judged = {j.incident.key: j for j in judge(period, dataset.failures, found, periods)}
    alerts = []
    for incident in found:
        step, node = incident.opened_step, period.nodes[incident.node]
        t = float(period.times_s[step])
        gpus = sorted(slot % g for slot in incident.slots_at_open)
        slots = [period.slot_of(node, gpu) for gpu in gpus]
        best = gpus[int(np.argmax(risk[step, slots]))]
        row = features[(_grid_index(dataset, t, cadence), node)][best][None, :]
        scored = float(risk[step, period.slot_of(node, best)])
        (content,) = describe(model, row, top=TOP_FEATURES)
        if not math.isclose(content.risk, scored, rel_tol=1e-6, abs_tol=1e-9):
            log.warning(
                "feature replay differs at %s on %s: risk %.6f, scored %.6f",
                _iso(t),
                dataset.nodes[node],
                content.risk,
                scored,
            )
        j = judged[incident.key]
        f = j.failure
        alerts.append(
            ScoredAlert(
                time_s=t,
                node=dataset.nodes[node],
                gpu=incident.gpu,
                gpus=tuple(gpus),
                gpus_per_node=g,
                content=content,
                outcome=j.outcome if failure_log else None,
                failure=FollowingFailure(f.time_s, f.gpu, f.mode, f.time_s - t)
                if f and failure_log
                else None,
                threshold=model.threshold,
            )
        )
    return sorted(alerts, key=lambda a: (a.time_s, a.node, a.gpu))


def _grid_index(dataset: Dataset, time_s: float, cadence: float) -> int:
    return round((time_s - dataset.start_s) / cadence)


def _features_at(
    dataset: Dataset,
    model: FaultModel,
    start: float,
    found: Sequence[Incident],
    times_s: np.ndarray,
) -> dict[tuple[int, int], np.ndarray]:
    """(grid index, node) -> (gpus_per_node, features) at each incident, from a second replay of only
    the alerted nodes. It starts where score_period's did, so the features are the ones scored."""
    cadence = model.feature_config.cadence_s
    g = dataset.gpus_per_node  # the data's node size, whatever the model was trained on
    places = [(_grid_index(dataset, float(times_s[i.opened_step]), cadence), i.node) for i in found]
    nodes = sorted({node for _, node in places})
    local = {node: i for i, node in enumerate(nodes)}
    wanted: dict[int, list[int]] = {}
    for index, node in places:
        wanted.setdefault(index, []).append(node)
    kept: dict[tuple[int, int], np.ndarray] = {}

    def sink(step: Step) -> None:
        for node in wanted.get(step.index, ()):
            base = local[node] * g
            kept[(step.index, node)] = step.features[base : base + g].copy()

    last = max(float(times_s[i.opened_step]) for i in found)
    replay(dataset, model.feature_config, sink, nodes=nodes, start_s=start - WARMUP_S, end_s=last + cadence)
    return kept


def _feature_text(feature: tuple[str, float, float]) -> str:
    name, value, contribution = feature
    return f"{name}={value:.4g} ({contribution:+.2f})"


def _minutes(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 60:.1f}"


def _rows(alerts: Sequence[ScoredAlert]) -> list[dict[str, str]]:
    rows = []
    for a in alerts:
        c = a.content
        row = {
            "time": a.time,
            "node": a.node,
            "gpu": str(a.gpu),
            "gpus": " ".join(str(g) for g in a.gpus),
            "risk": f"{c.risk:.4f}",
            "mode": c.mode,
            "mode_probability": f"{c.mode_probability:.3f}",
        }
        for seconds, value in zip(TTF_BUCKETS_S, c.risk_within, strict=True):
            row[f"risk_{int(seconds // 60)}min"] = f"{value:.4f}"
        quantiles: tuple[float | None, ...] = c.ttf_s or (None, None, None)
        for name, quantile in zip(("ttf_p10_min", "ttf_p50_min", "ttf_p90_min"), quantiles, strict=True):
            row[name] = _minutes(quantile)
        row["action"] = c.action.name.lower()
        for i in range(TOP_FEATURES):
            row[f"feature_{i + 1}"] = _feature_text(c.top_features[i]) if i < len(c.top_features) else ""
        f = a.failure
        row["outcome"] = "" if a.outcome is None else a.outcome.value
        row["failure_time"] = _iso(f.time_s) if f else ""
        row["failure_gpu"] = ("node" if f.gpu < 0 else str(f.gpu)) if f else ""
        row["failure_mode"] = f.mode if f else ""
        row["lead_min"] = _minutes(f.lead_s) if f else ""
        ratio = times_threshold(c.risk, a.threshold)
        row["threshold"] = "" if math.isnan(a.threshold) else f"{a.threshold:.6g}"
        row["risk_x_threshold"] = "" if ratio is None else f"{ratio:.3f}"
        rows.append(row)
    return rows


def write_csv(alerts: Sequence[ScoredAlert], path: Path) -> None:
    """One row per alert, CSV_FIELDS columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(_rows(alerts))


def _outcome_text(a: ScoredAlert) -> str:
    if a.outcome is None:
        return "(no failure log)"
    f = a.failure
    if f is None:
        return "false alarm: no failure of it within a day"
    where = "the node" if f.gpu < 0 else f"GPU {f.gpu}"
    return f"{a.outcome.value}: {f.mode} on {where} after {f.lead_s / 60:.1f} min"


def render_table(alerts: Sequence[ScoredAlert]) -> str:
    """A Markdown table of the alerts, readable in a terminal: when the failure is expected first,
    then the risk with how many times the threshold it stands (a calibrated risk of 0.03 is far above
    a healthy GPU's), before the rest."""
    buckets = "/".join(str(int(s // 60)) for s in TTF_BUCKETS_S)
    lines = [
        "| time | node | GPU | time to failure p50 (p10-p90), min | risk | x threshold | likely mode "
        f"| risk within {buckets} min | action | top features | outcome |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a in alerts:
        c = a.content
        within = " / ".join(f"{v:.2f}" for v in c.risk_within)
        ttf = f"{c.ttf_s[1] / 60:.0f} ({c.ttf_s[0] / 60:.0f}-{c.ttf_s[2] / 60:.0f})" if c.ttf_s else "-"
        ratio = times_threshold(c.risk, a.threshold)
        times = "-" if ratio is None else f"{ratio:.1f}x"
        features = "; ".join(_feature_text(f) for f in c.top_features)
        lines.append(
            f"| {a.time} | {a.node} | {a.gpu_text} | {ttf} | {c.risk:.3f} | {times} "
            f"| {c.mode} ({c.mode_probability:.0%}) | {within} | {c.action.name.lower()} | {features} "
            f"| {_outcome_text(a)} |"
        )
    return "\n".join(lines)


def summary(alerts: Sequence[ScoredAlert], periods: PredictionPeriods = DEFAULT_PERIODS) -> str:
    """One line: how many alerts, and (with a failure log) how many were true, late, premature or false."""
    if not alerts:
        return "no alerts"
    text = f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}"
    threshold = alerts[0].threshold
    if not math.isnan(threshold):
        text += (
            f" at threshold {threshold:.3g} (risk: the chance of failing within the model's horizon at the "
            f"real failure rate; x threshold: how far above it the alert opened)"
        )
    if alerts[0].outcome is not None:
        counts = {o: sum(1 for a in alerts if a.outcome is o) for o in Outcome}
        text += (
            f": {counts[Outcome.TRUE]} true (their failure came {periods.warning_s / 60:.0f} min to "
            f"{periods.period_s / 3600:g} h after), {counts[Outcome.LATE]} late, {counts[Outcome.PREMATURE]} "
            f"premature, {counts[Outcome.FALSE]} false"
        )
    return text
