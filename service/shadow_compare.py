"""The shadow's verdict: the serving model and the challenger judged on the fleet's own labels over the
steps both scored (docs/model.md, "The shadow").

Per node, at a threshold: a failure is caught when some step in the horizon before it reached the
threshold; an alarm is a run of consecutive steps at or over the threshold, false when no failure of its
node comes within the horizon after its start, neither when it starts in a censored span (acted on,
never settled). The challenger is better only when it catches more failures with no more false alarms,
each model at its own threshold (what promotion would serve). The difference in catches comes with a
90% interval from a paired bootstrap over the failures (a fixed seed: the same data, the same interval),
and, for reference, the challenger's catches at the threshold where its false alarms match the serving
model's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.service.state.models import ShadowStep

_RESAMPLES = 2000
_SEED = 0
_INTERVAL = (5.0, 95.0)  # percentiles: a 90% interval


@dataclass(frozen=True, slots=True)
class Span:
    """Hours of a node nobody can label (service/training_labels.py's censored spans, per node)."""

    node: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One model at one threshold over the window."""

    threshold: float
    caught: int
    false_alarms: int


@dataclass(frozen=True, slots=True)
class Comparison:
    """The two models over the shadow window; `better` is the promotion rule."""

    steps: int  # node steps both models scored
    node_days: float
    failures: int  # failures of nodes with scored steps, within the window
    serving: Outcome
    challenger: Outcome
    matched: (
        Outcome  # the challenger at the lowest threshold whose false alarms are the serving model's or fewer
    )
    extra_caught_low: float  # the 90% interval of challenger.caught - serving.caught
    extra_caught_high: float
    better: bool

    def summary(self) -> str:
        """One line for a refusal or a log."""
        return (
            f"over {self.steps} node steps ({self.node_days:.1f} node-days) and {self.failures} failures: "
            f"serving catches {self.serving.caught} with {self.serving.false_alarms} false alarms, the "
            f"challenger {self.challenger.caught} with {self.challenger.false_alarms} (difference 90% interval "
            f"{self.extra_caught_low:+.0f} to {self.extra_caught_high:+.0f}); at the serving model's false "
            f"alarms the challenger catches {self.matched.caught} (threshold {self.matched.threshold:.4g})"
        )


def compare(
    steps: Sequence[ShadowStep],
    failures: Sequence[tuple[str, int]],
    censored: Sequence[Span],
    *,
    serving_threshold: float,
    challenger_threshold: float,
    horizon_s: float,
    cadence_s: float,
) -> Comparison:
    """Judge both models on the steps both scored; `failures`: (node, time_ns) of each failure."""
    both = [s for s in steps if s.serving_risk is not None and s.challenger_risk is not None]
    by_node: dict[str, list[ShadowStep]] = defaultdict(list)
    for s in both:
        by_node[s.node].append(s)
    for rows in by_node.values():
        rows.sort(key=lambda s: s.time_ns)
    horizon_ns = int(horizon_s * 1e9)
    first = min((s.time_ns for s in both), default=0)
    last = max((s.time_ns for s in both), default=0)
    seen = [
        (node, t) for node, t in failures if node in by_node and first <= t <= last + horizon_ns
    ]  # a failure whose horizon the window does not reach is no test of either model
    spans: dict[str, list[Span]] = defaultdict(list)
    for span in censored:
        spans[span.node].append(span)
    judge = _Judge(by_node, seen, spans, horizon_ns, int(cadence_s * 1e9))
    serving_hits, serving_false = judge.at(serving_threshold, challenger=False)
    challenger_hits, challenger_false = judge.at(challenger_threshold, challenger=True)
    matched = _matched(judge, serving_false, both)
    low, high = _interval(challenger_hits, serving_hits)
    serving = Outcome(serving_threshold, int(serving_hits.sum()), serving_false)
    challenger = Outcome(challenger_threshold, int(challenger_hits.sum()), challenger_false)
    return Comparison(
        steps=len(both),
        node_days=len(both) * cadence_s / 86400.0,
        failures=len(seen),
        serving=serving,
        challenger=challenger,
        matched=matched,
        extra_caught_low=low,
        extra_caught_high=high,
        better=challenger.caught > serving.caught and challenger.false_alarms <= serving.false_alarms,
    )


class _Judge:
    """Catches (one flag per failure) and false alarms of either model at a threshold."""

    def __init__(
        self,
        by_node: dict[str, list[ShadowStep]],
        failures: list[tuple[str, int]],
        spans: dict[str, list[Span]],
        horizon_ns: int,
        cadence_ns: int,
    ) -> None:
        self.failures = failures
        self.horizon_ns = horizon_ns
        failures_of: dict[str, list[int]] = defaultdict(list)
        for node, t in failures:
            failures_of[node].append(t)
        # Per node: step times, each model's risk (NaN: not scored), where a run may start (a gap before
        # it) and whether an alarm starting there would be settled (a failure follows, or censored).
        self.nodes: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for node, rows in by_node.items():
            times = np.array([r.time_ns for r in rows], dtype=np.int64)
            serving = np.array([_value(r.serving_risk) for r in rows])
            challenger = np.array([_value(r.challenger_risk) for r in rows])
            gap = np.ones(len(rows), dtype=bool)
            gap[1:] = np.diff(times) > cadence_ns * 3 // 2
            settled = np.zeros(len(rows), dtype=bool)
            for t in failures_of[node]:
                settled |= (times <= t) & (t <= times + horizon_ns)
            for span in spans[node]:
                settled |= (span.start_ns <= times) & (times <= span.end_ns)
            self.nodes[node] = (times, serving, challenger, gap, settled)

    def at(self, threshold: float, *, challenger: bool) -> tuple[np.ndarray, int]:
        """(caught per failure, false alarms) with each step's risk of one model."""
        hits = np.zeros(len(self.failures), dtype=bool)
        for i, (node, t) in enumerate(self.failures):
            times, serving, other, _, _ = self.nodes[node]
            risk = other if challenger else serving
            before = (t - self.horizon_ns <= times) & (times < t)
            hits[i] = bool(np.any(risk[before] >= threshold))
        false_alarms = 0
        for _times, serving, other, gap, settled in self.nodes.values():
            over = (other if challenger else serving) >= threshold
            starts = over.copy()
            starts[1:] &= ~over[:-1] | gap[1:]  # a run starts after a step under it, or after a gap
            false_alarms += int(np.count_nonzero(starts & ~settled))
        return hits, false_alarms


def _value(risk: float | None) -> float:
    return math.nan if risk is None else risk


def _matched(judge: _Judge, budget: int, steps: list[ShadowStep]) -> Outcome:
    """The challenger at the lowest of its own risks whose false alarms are `budget` or fewer (a
    binary search: false alarms fall as the threshold rises, but for runs that split)."""
    candidates = sorted({s.challenger_risk for s in steps if s.challenger_risk is not None})
    low, high = 0, len(candidates)  # the answer is in [low, high]; high: none qualifies
    while low < high:
        middle = (low + high) // 2
        if judge.at(candidates[middle], challenger=True)[1] <= budget:
            high = middle
        else:
            low = middle + 1
    if low == len(candidates):
        return Outcome(math.inf, 0, 0)
    hits, false_alarms = judge.at(candidates[low], challenger=True)
    return Outcome(candidates[low], int(hits.sum()), false_alarms)


def _interval(challenger: np.ndarray, serving: np.ndarray) -> tuple[float, float]:
    """The 90% paired bootstrap interval of the difference in catches (0 to 0 without failures)."""
    if len(serving) == 0:
        return 0.0, 0.0
    diff = challenger.astype(np.int64) - serving.astype(np.int64)
    rng = np.random.default_rng(_SEED)
    draws = rng.integers(0, len(diff), size=(_RESAMPLES, len(diff)))
    totals = diff[draws].sum(axis=1)
    low, high = np.percentile(totals, _INTERVAL)
    return float(low), float(high)
