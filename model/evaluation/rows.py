"""One line of the evaluation: a method at one operating point, measured on a scored period, with a
bootstrap interval by node for every figure (model/evaluation/intervals.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultcast.model.evaluation.intervals import (
    FIGURES,
    RESAMPLES,
    SEED,
    NodeTallies,
    bootstrap,
    point,
    zero_events_upper_95,
)
from faultcast.model.evaluation.matching import MARGIN, Setting
from faultcast.model.evaluation.outcomes import (
    ModeTally,
    PredictionPeriods,
    ScoredPeriod,
    events,
    incidents,
    metrics_of,
    mode_report,
    mode_tallies,
    node_tallies,
    recall_by_mode,
)
from faultcast.model.features.offline import FailureLog
from faultcast.model.incidents import Incident
from faultcast.modes import NODE_LEVEL_MODES


@dataclass(frozen=True)
class Row:
    """A method at an operating point: its report key, its label in the table, how it is scored,
    whether on the inputs dcgm-exporter's defaults carry, and what the report says of its setting."""

    key: str
    label: str
    setting: Setting
    masked: bool = False
    about: dict[str, Any] = field(default_factory=dict)  # e.g. the rules' scale, what it was matched to

    def found(self, period: ScoredPeriod) -> list[Incident]:
        """Its incidents over the period."""
        at = self.setting
        return incidents(period, at.method, [at.threshold], at.policy, NODE_LEVEL_MODES)[0]


@dataclass(frozen=True)
class Measured:
    """A row's figures on one period: the report's metrics, and the per-node tallies behind them."""

    metrics: dict[str, Any]
    tallies: NodeTallies
    by_mode: dict[str, ModeTally]


def _score(period: ScoredPeriod, at: Setting) -> np.ndarray:
    """The row's score for PR-AUC: the rules at a scale fire (1) or not (0), like the shipped ones."""
    score = period.scores[at.method]
    if at.method != MARGIN:
        return score
    return np.where(np.isnan(score), np.nan, (score >= at.threshold).astype(np.float64))


def measure(
    row: Row,
    period: ScoredPeriod,
    failures: FailureLog,
    periods: PredictionPeriods,
    found: Sequence[Incident] | None = None,
) -> Measured:
    """The row's metrics on the period (its incidents `found`, when already tracked)."""
    judged = events(period, failures, row.found(period) if found is None else found, periods)
    metrics = metrics_of(period, judged, periods, _score(period, row.setting))
    return Measured(
        metrics, node_tallies(period, judged, periods), mode_tallies(judged.caught, periods.warning_s)
    )


def intervals(tallies: NodeTallies, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The figures' intervals as the report writes them: "ci95" {figure: [lo, hi]}, and the Poisson
    upper bound on the false-alarm rate when none was seen (a bootstrap of zeros is [0, 0])."""
    ci = bootstrap(tallies, resamples, seed)
    false = float(tallies.premature_alarms.sum() + tallies.false_only_alarms.sum())
    return {
        "ci95": {name: list(ci[name]) for name in FIGURES},
        "false_alarms_upper95_per_1000_gpu_days": zero_events_upper_95(false, float(tallies.gpu_days.sum())),
    }


def pooled(parts: Sequence[Measured], resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """A row over several periods as one: counts summed, figures of the summed counts, intervals by
    resampling the nodes of every period."""
    tallies = NodeTallies.concat([p.tallies for p in parts])
    by_mode = pooled_modes(parts)
    counts = {
        "failures": int(tallies.failures.sum()),
        "failures_caught": int(tallies.caught.sum()),
        "failures_precursor_unknown": int(tallies.precursor_unknown.sum()),
        "alerts": int(tallies.alerts.sum()),
        "true_alarms": int(tallies.true_alarms.sum()),
        "premature_alarms": int(tallies.premature_alarms.sum()),
        "false_only_alarms": int(tallies.false_only_alarms.sum()),
        "false_alarms": int(tallies.premature_alarms.sum() + tallies.false_only_alarms.sum()),
        "gpu_days": float(tallies.gpu_days.sum()),
    }
    # Every incident is true, late, premature or false.
    counts["late_alarms"] = counts["alerts"] - counts["true_alarms"] - counts["false_alarms"]
    return {
        **point(tallies),
        **counts,
        "recall_by_mode": recall_by_mode(by_mode),
        "by_mode": mode_report(by_mode),
        **intervals(tallies, resamples, seed),
    }


def pooled_modes(parts: Sequence[Measured]) -> dict[str, ModeTally]:
    """The parts' per-mode tallies summed."""
    out: dict[str, ModeTally] = {}
    for p in parts:
        for mode, tally in p.by_mode.items():
            out[mode] = out.get(mode, ModeTally()) + tally
    return out


def false_alarm_figures(tallies: NodeTallies, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The false-alarm figures alone (for data that measures only those), with their intervals."""
    names = ("false_alarms_per_1000_gpu_days", "premature_alarms_per_1000_gpu_days",
             "false_only_alarms_per_1000_gpu_days")  # fmt: skip
    values, spread = point(tallies), intervals(tallies, resamples, seed)
    gpu_days = float(tallies.gpu_days.sum())
    return {
        **{n: values[n] for n in names},
        "alerts": int(tallies.alerts.sum()),
        "false_alarms": int(tallies.premature_alarms.sum() + tallies.false_only_alarms.sum()),
        "gpu_days": gpu_days,
        "nodes": tallies.nodes,
        "ci95": {n: spread["ci95"][n] for n in names},
        "false_alarms_upper95_per_1000_gpu_days": spread["false_alarms_upper95_per_1000_gpu_days"],
    }
