"""Confidence intervals for the evaluation's figures: a bootstrap over nodes.

Failures and alarms of one node are not independent (a bad node fails and alarms repeatedly), so the
node is the unit resampled. Each figure is a ratio of sums over nodes (caught over failures, alarms
over GPU-days, true alarms over alarms) or the median of the nodes' leads, so a resample is a vector
of per-node counts (how often each node was drawn) applied to the per-node tallies: no alert is
re-tracked and no failure re-judged, and 1,000 resamples take milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

RESAMPLES = 1000
SEED = 0
# Percentile interval bounds, in percent.
LOW, HIGH = 2.5, 97.5
# No event in T GPU-days: the rate is below -ln(0.05) / T with 95% confidence (one-sided, Poisson).
ZERO_EVENTS_UPPER_95 = -math.log(0.05)


@dataclass(frozen=True)
class NodeTallies:
    """One method's counts per node of one evaluated period (every array: one entry per node)."""

    failures: np.ndarray
    caught: np.ndarray  # warned at least the minimal warning time ahead, within the prediction period
    caught_1min: np.ndarray
    predictable: np.ndarray  # failures the log says carried a precursor (precursor_s > 0)
    predictable_caught: np.ndarray
    precursor_unknown: np.ndarray  # failures the log does not say a precursor for
    alerts: np.ndarray
    true_alarms: np.ndarray
    premature_alarms: np.ndarray
    false_only_alarms: np.ndarray
    gpu_days: np.ndarray
    leads_min: np.ndarray  # (caught failures,) their leads
    lead_node: np.ndarray  # (caught failures,) the node of each lead

    @property
    def nodes(self) -> int:
        """How many nodes the tallies cover."""
        return len(self.gpu_days)

    @staticmethod
    def concat(parts: Sequence[NodeTallies]) -> NodeTallies:
        """The tallies of several periods side by side (their nodes are distinct units)."""
        offsets = np.cumsum([0, *(p.nodes for p in parts)])[:-1]
        columns: dict[str, np.ndarray] = {}
        for f in fields(NodeTallies):
            arrays = [getattr(p, f.name) for p in parts]
            if f.name == "lead_node":
                arrays = [a + off for a, off in zip(arrays, offsets, strict=True)]
            columns[f.name] = np.concatenate(arrays) if arrays else np.zeros(0)
        return NodeTallies(**columns)


FIGURES = (
    "recall_5min",
    "recall_5min_predictable",
    "recall_1min",
    "false_alarms_per_1000_gpu_days",
    "premature_alarms_per_1000_gpu_days",
    "false_only_alarms_per_1000_gpu_days",
    "alert_precision",
    "median_lead_min",
)


def _ratio(num: np.ndarray, den: np.ndarray, scale: float = 1.0) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, scale * num / np.where(den > 0, den, 1.0), np.nan)


def _weighted_median(values: np.ndarray, owner: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per row of `weights` (resamples, nodes): the median of `values` with each value repeated as
    often as its owner node was drawn, as np.percentile(..., 50) gives it (the two middle values
    averaged when their count is even); NaN when no value was drawn."""
    out = np.full(weights.shape[0], np.nan)
    if values.size == 0:
        return out
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    cum = np.cumsum(weights[:, owner[order]], axis=1)
    total = cum[:, -1]
    drawn = total > 0
    lower, upper = np.floor((total - 1) / 2.0), np.ceil((total - 1) / 2.0)
    # The value at 0-based position p of the expanded sample is the first whose running count exceeds p.
    at_lower = (cum <= lower[:, None]).sum(axis=1)
    at_upper = (cum <= upper[:, None]).sum(axis=1)
    last = len(ranked) - 1
    middle = (ranked[np.minimum(at_lower, last)] + ranked[np.minimum(at_upper, last)]) / 2.0
    out[drawn] = middle[drawn]
    return out


def weighted_figures(t: NodeTallies, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Every figure (FIGURES) for each row of `weights` (rows, nodes): how many times each node counts."""

    def total(column: np.ndarray) -> np.ndarray:
        return np.asarray(weights @ column.astype(np.float64))

    failures, predictable = total(t.failures), total(t.predictable)
    gpu_days, alerts = total(t.gpu_days), total(t.alerts)
    premature, false_only = total(t.premature_alarms), total(t.false_only_alarms)
    # Which failures carried a precursor must be known for all of them, or the share is unknown.
    known = total(t.precursor_unknown) == 0
    return {
        "recall_5min": _ratio(total(t.caught), failures),
        "recall_5min_predictable": np.where(known, _ratio(total(t.predictable_caught), predictable), np.nan),
        "recall_1min": _ratio(total(t.caught_1min), failures),
        "false_alarms_per_1000_gpu_days": _ratio(premature + false_only, gpu_days, 1000.0),
        "premature_alarms_per_1000_gpu_days": _ratio(premature, gpu_days, 1000.0),
        "false_only_alarms_per_1000_gpu_days": _ratio(false_only, gpu_days, 1000.0),
        "alert_precision": _ratio(total(t.true_alarms), alerts),
        "median_lead_min": _weighted_median(t.leads_min, t.lead_node, weights),
    }


def point(t: NodeTallies) -> dict[str, float]:
    """Every figure on the tallies as they are (each node once)."""
    return {k: float(v[0]) for k, v in weighted_figures(t, np.ones((1, t.nodes))).items()}


def resample_weights(nodes: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, nodes) how many times each node was drawn, drawing `nodes` with replacement."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, nodes, size=(resamples, nodes))
    flat = (np.arange(resamples)[:, None] * nodes + drawn).ravel()
    return np.bincount(flat, minlength=resamples * nodes).reshape(resamples, nodes).astype(np.float64)


def bootstrap(t: NodeTallies, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, tuple[float, float]]:
    """Percentile 95% intervals of every figure, resampling nodes with replacement; (NaN, NaN) for a
    figure no resample could compute (no failure, no alarm, no node)."""
    nan = (math.nan, math.nan)
    if t.nodes == 0:
        return dict.fromkeys(FIGURES, nan)
    figures = weighted_figures(t, resample_weights(t.nodes, resamples, seed))
    out: dict[str, tuple[float, float]] = {}
    for name, values in figures.items():
        finite = values[np.isfinite(values)]
        # A resample without failures (or alarms) has no ratio: the interval is over those that have one.
        out[name] = (
            (float(np.percentile(finite, LOW)), float(np.percentile(finite, HIGH))) if finite.size else nan
        )
    return out


def zero_events_upper_95(count: float, gpu_days: float) -> float | None:
    """The one-sided 95% Poisson upper bound per 1,000 GPU-days when no event was seen; None otherwise."""
    if count > 0 or gpu_days <= 0:
        return None
    return 1000.0 * ZERO_EVENTS_UPPER_95 / gpu_days
