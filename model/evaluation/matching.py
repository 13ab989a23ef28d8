"""Baselines at the model's false-alarm rate: each method at its own threshold compares recalls bought
with different numbers of false alarms, so the evaluation also sets each baseline where it raises no
more false alarms than the model did on the same period (a matched operating point).

Logistic regression gets a threshold from a grid of its own scores; the rules, which score 0 or 1,
get a scale on their thresholds (`RulesBaseline(names, scale=k)`) from SCALES. Of the candidates,
the one with the most false alarms not above the model's wins (the lowest setting among equals);
false alarms need not fall monotonically with the threshold (hysteresis, node-level grouping), so
every candidate is judged rather than bisected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.model.evaluation.outcomes import Outcome, PredictionPeriods, ScoredPeriod, incidents, judge
from faultcast.model.features.offline import FailureLog
from faultcast.model.incidents import AlertPolicy, Incident

SCALES = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1e3, 1e4)
COARSE = 40  # thresholds in the first pass over a score's upper tail
FINE = 32  # thresholds between the winner and the next lower candidate, second pass
MARGIN = "rules_margin"  # the score column of RulesBaseline.margin (model/evaluation/evaluate.py fills it)


@dataclass(frozen=True)
class Candidate:
    """A setting (a threshold, or the rules' scale) and what it raised on the period."""

    setting: float
    found: list[Incident]
    false_alarms: int  # premature + false


@dataclass(frozen=True)
class Setting:
    """How to score a method at a setting through `incidents`: which score column, at which
    threshold, under which policy."""

    method: str
    threshold: float
    policy: AlertPolicy


def false_alarms(
    period: ScoredPeriod, failures: FailureLog, found: Sequence[Incident], periods: PredictionPeriods
) -> int:
    """Incidents not followed by their failure within the prediction period (premature + false)."""
    late = (Outcome.PREMATURE, Outcome.FALSE)
    return sum(1 for j in judge(period, failures, found, periods) if j.outcome in late)


def pick(candidates: Sequence[Candidate], target: int) -> tuple[Candidate, bool]:
    """The candidate with the most false alarms not above `target`, the lowest setting among equals;
    when none is within the target, the one with the fewest. The flag says whether it is within."""
    within = [c for c in candidates if c.false_alarms <= target]
    if within:
        return min(within, key=lambda c: (-c.false_alarms, c.setting)), True
    return min(candidates, key=lambda c: (c.false_alarms, c.setting)), False


def _judged(
    period: ScoredPeriod,
    failures: FailureLog,
    method: str,
    thresholds: Sequence[float],
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
    periods: PredictionPeriods,
) -> list[Candidate]:
    found = incidents(period, method, list(thresholds), policy, node_level_modes)
    return [
        Candidate(float(t), these, false_alarms(period, failures, these, periods))
        for t, these in zip(thresholds, found, strict=True)
    ]


def matched_threshold(
    period: ScoredPeriod,
    failures: FailureLog,
    method: str,
    target: int,
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
    periods: PredictionPeriods,
    floor: float = 0.0,
) -> tuple[Candidate, bool]:
    """`method`'s threshold (not under `floor`) at `target` false alarms on the period (see `pick`).
    A threshold above every score (no alert) is always a candidate, so one is always within."""
    risk = period.scores[method]
    finite = risk[period.present & np.isfinite(risk) & (risk >= floor)]
    never = float(np.nextafter(finite.max(), np.inf)) if finite.size else 1.0
    if finite.size == 0:
        return Candidate(never, [], 0), True
    # Quantiles ever closer to the top (a baseline at a model's rate alerts on a sliver of rows),
    # and the top scores themselves.
    tail = np.quantile(finite, 1.0 - np.geomspace(0.1, 1e-7, COARSE))
    coarse = np.unique(np.concatenate([tail, np.unique(finite)[-8:], [never]]))
    judged = _judged(period, failures, method, coarse.tolist(), policy, node_level_modes, periods)
    best, _ = pick(judged, target)
    below = coarse[coarse < best.setting]
    if below.size:
        between = finite[(finite > below[-1]) & (finite < best.setting)]
        if between.size:
            fine = np.unique(np.quantile(between, np.linspace(0.0, 1.0, FINE)))
            judged += _judged(period, failures, method, fine.tolist(), policy, node_level_modes, periods)
    return pick(judged, target)


def rules_setting(scale: float, policy: AlertPolicy) -> Setting:
    """The rules at `scale` as a score column and threshold: as shipped (scale 1), their 0/1 score at
    0.5; stricter, their margin (RulesBaseline.margin), which exceeds k exactly where the rules at
    scale k fire. The hold level is then the threshold itself (hold_ratio 1): a 0/1 score held at half
    of 0.5 is held exactly while the rules fire, and so is a margin held above k."""
    if scale == 1.0:
        return Setting("rules", 0.5, policy)
    return Setting(MARGIN, float(np.nextafter(scale, np.inf)), dataclasses.replace(policy, hold_ratio=1.0))


def matched_scale(
    period: ScoredPeriod,
    failures: FailureLog,
    target: int,
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
    periods: PredictionPeriods,
    scales: Sequence[float] = SCALES,
) -> tuple[Candidate, bool]:
    """The rules' scale (of `scales`) at `target` false alarms on the period (see `pick`)."""
    settings = [rules_setting(k, policy) for k in scales]
    # One pass of the state machine per score column: every stricter scale shares the margin's.
    groups: dict[tuple[str, AlertPolicy], list[int]] = {}
    for i, at in enumerate(settings):
        groups.setdefault((at.method, at.policy), []).append(i)
    judged: list[Candidate] = []
    for (method, held), members in groups.items():
        thresholds = [settings[i].threshold for i in members]
        found = _judged(period, failures, method, thresholds, held, node_level_modes, periods)
        judged += [dataclasses.replace(c, setting=scales[i]) for c, i in zip(found, members, strict=True)]
    return pick(judged, target)
