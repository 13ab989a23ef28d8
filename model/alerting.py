"""The alert policy, and event-level scoring of alerts against a failure log.

Policy (shared by threshold selection, evaluation and the service): an alert opens on a GPU when
its risk has been at or above the threshold for `k` consecutive scores and no alert is open there;
it closes when the risk stays below the threshold for `clear_steps` scores, when the GPU goes
dark, or when `horizon` has passed since it opened (the prediction "within the horizon" has
expired; if the risk is still high a new alert opens). Thresholds are evaluated side by side, so
choosing one is a single pass over the scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.model.dataset import Failure, FailureLog

# An alarm counts against the false-alarm budget when its GPU (or node) does not fail within this
# window: it took healthy hardware out of service. See docs/model.md.
NUISANCE_WINDOW_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class AlertPolicy:
    k: int = 2
    clear_steps: int = 10
    horizon_s: float = 1800.0


def alert_starts(
    risk: np.ndarray, present: np.ndarray, thresholds: Sequence[float], policy: AlertPolicy, cadence_s: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each threshold, the (step, slot) where alerts open. risk, present: (steps, slots)."""
    thr = np.asarray(thresholds, dtype=np.float64)[:, None]
    c, s = len(thr), risk.shape[1]
    above_run = np.zeros((c, s), dtype=np.int64)
    below_run = np.zeros((c, s), dtype=np.int64)
    opened = np.full((c, s), -1, dtype=np.int64)
    expire = max(1, round(policy.horizon_s / cadence_s))
    starts: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(c)]
    for t in range(risk.shape[0]):
        here = present[t][None, :]
        r = np.where(np.isnan(risk[t]), -np.inf, risk[t])[None, :]
        above = (r >= thr) & here
        above_run = np.where(here, np.where(above, above_run + 1, 0), above_run)
        below_run = np.where(here, np.where(above, 0, below_run + 1), below_run)
        is_open = opened >= 0
        close = is_open & (~here | (below_run >= policy.clear_steps) | (t - opened >= expire))
        opened = np.where(close, -1, opened)
        new = (opened < 0) & (above_run >= policy.k) & here
        if new.any():
            opened = np.where(new, t, opened)
            for ci in np.nonzero(new.any(axis=1))[0]:
                starts[ci].append((t, np.nonzero(new[ci])[0]))
    out = []
    for per in starts:
        if per:
            steps = np.concatenate([np.full(len(slots), t) for t, slots in per])
            slots = np.concatenate([slots for _, slots in per])
        else:
            steps, slots = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        out.append((steps, slots))
    return out


class AlertTracker:
    """`alert_starts` one score at a time, for the service: per-slot runs in arrays, grown as slots
    appear. `update` takes the slots scored at one grid step and says which alerts open and close;
    a parity test holds it equal to `alert_starts` over the same scores."""

    def __init__(self, policy: AlertPolicy, cadence_s: float, threshold: float) -> None:
        self.policy, self.threshold = policy, threshold
        self.expire = max(1, round(policy.horizon_s / cadence_s))
        self.above_run = np.zeros(0, dtype=np.int64)
        self.below_run = np.zeros(0, dtype=np.int64)
        self.opened = np.zeros(0, dtype=np.int64)  # grid step the open alert opened at; -1: none

    def _grow(self, slots: int) -> None:
        if slots <= len(self.opened):
            return
        extra = slots - len(self.opened)
        self.above_run = np.concatenate([self.above_run, np.zeros(extra, dtype=np.int64)])
        self.below_run = np.concatenate([self.below_run, np.zeros(extra, dtype=np.int64)])
        self.opened = np.concatenate([self.opened, np.full(extra, -1, dtype=np.int64)])

    def update(
        self, step: int, slots: np.ndarray, risk: np.ndarray, present: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One grid step of some slots: (opened, closed, close reasons) as slot arrays; a slot can
        close and reopen in the same step (the horizon passed and the risk is still high).
        Reasons: 0 risk below threshold, 1 horizon passed, 2 dark."""
        self._grow(int(slots.max()) + 1 if len(slots) else 0)
        r = np.where(np.isnan(risk), -np.inf, risk)
        above = (r >= self.threshold) & present
        a, b, o = self.above_run[slots], self.below_run[slots], self.opened[slots]
        a = np.where(present, np.where(above, a + 1, 0), a)
        b = np.where(present, np.where(above, 0, b + 1), b)
        is_open = o >= 0
        dark = is_open & ~present
        low = is_open & present & (b >= self.policy.clear_steps)
        expired = is_open & ~dark & ~low & (step - o >= self.expire)
        close = dark | low | expired
        o = np.where(close, -1, o)
        new = (o < 0) & (a >= self.policy.k) & present
        o = np.where(new, step, o)
        self.above_run[slots], self.below_run[slots], self.opened[slots] = a, b, o
        reasons = np.where(dark, 2, np.where(low, 0, 1))[close]
        return slots[new], slots[close], reasons

    def open_slots(self) -> np.ndarray:
        return np.nonzero(self.opened >= 0)[0]


@dataclass(frozen=True)
class ScoredPeriod:
    """Scores of every present row of some nodes over a period, on the model's grid."""

    times_s: np.ndarray  # (steps,) unix seconds
    nodes: tuple[int, ...]  # dataset node indexes of the slots, in slot order / gpus_per_node
    gpus_per_node: int
    present: np.ndarray  # (steps, slots)
    scores: dict[str, np.ndarray]  # method -> (steps, slots) risk (NaN where absent)
    labels: np.ndarray  # (steps, slots) bool

    @property
    def gpu_days(self) -> float:
        cadence = float(self.times_s[1] - self.times_s[0]) if len(self.times_s) > 1 else 60.0
        return float(self.present.sum()) * cadence / 86_400.0

    def slot_of(self, node: int, gpu: int) -> int:
        return self.nodes.index(node) * self.gpus_per_node + gpu


def incidents(
    period: ScoredPeriod, starts: tuple[np.ndarray, np.ndarray]
) -> list[tuple[int, int, tuple[int, ...]]]:
    """Alerts grouped into what an operator sees: (step, node, GPUs). GPUs of one node whose alerts
    open in the same step are one incident (a node-level signal lights up every GPU at once)."""
    steps, slots = starts
    g = period.gpus_per_node
    grouped: dict[tuple[int, int], list[int]] = {}
    for step, slot in zip(steps.tolist(), slots.tolist(), strict=True):
        grouped.setdefault((step, period.nodes[slot // g]), []).append(slot % g)
    return [(step, node, tuple(gpus)) for (step, node), gpus in sorted(grouped.items())]


def false_alarm_rate(
    period: ScoredPeriod, failures: FailureLog, starts: tuple[np.ndarray, np.ndarray], horizon_s: float
) -> tuple[int, int, float]:
    """(true incidents, false incidents, false incidents per 1,000 GPU-days). An incident is true
    when one of its GPUs, or its node, fails within the horizon after it opens."""
    true = false = 0
    for step, node, gpus in incidents(period, starts):
        t = float(period.times_s[step])
        soon = failures.between(t, t + horizon_s, [node])
        hit = any(f.gpu < 0 or f.gpu in gpus for f in soon)
        true += hit
        false += not hit
    return true, false, 1000.0 * false / max(period.gpu_days, 1e-9)


def failure_leads(
    period: ScoredPeriod, failures: FailureLog, starts: tuple[np.ndarray, np.ndarray], horizon_s: float
) -> list[tuple[Failure, float]]:
    """Each failure in the period with the lead, in minutes, of the earliest alert on its GPU (any
    GPU of its node, for a node-level failure) opened within the horizon before it; 0 when none."""
    g = period.gpus_per_node
    steps, slots = starts
    alert_times = period.times_s[steps] if len(steps) else np.zeros(0)
    out = []
    for f in failures.between(float(period.times_s[0]), float(period.times_s[-1]), period.nodes):
        base = period.nodes.index(f.node) * g
        targets = np.arange(base, base + g) if f.gpu < 0 else np.array([base + f.gpu])
        window = np.isin(slots, targets) & (alert_times >= f.time_s - horizon_s) & (alert_times < f.time_s)
        out.append((f, float(f.time_s - alert_times[window].min()) / 60.0 if window.any() else 0.0))
    return out


def event_metrics(
    period: ScoredPeriod,
    failures: FailureLog,
    starts: tuple[np.ndarray, np.ndarray],
    horizon_s: float,
    predictable: set[str],
    score: np.ndarray,
) -> dict[str, object]:
    """Recall at 1 and 5 minutes' lead, lead times, false alarms, alert precision, PR-AUC."""
    from sklearn.metrics import average_precision_score

    leads: list[float] = []
    caught1 = caught5 = caught5_predictable = predictable_total = 0
    by_mode: dict[str, list[int]] = {}
    inside = failure_leads(period, failures, starts, horizon_s)
    for row, lead in inside:
        hit1, hit5 = lead >= 1.0, lead >= 5.0
        caught1 += hit1
        caught5 += hit5
        if row.mode in predictable:
            predictable_total += 1
            caught5_predictable += hit5
        if hit1:
            leads.append(lead)
        by_mode.setdefault(row.mode, [0, 0])
        by_mode[row.mode][0] += hit5
        by_mode[row.mode][1] += 1
    true, false, fa_rate = false_alarm_rate(period, failures, starts, horizon_s)
    _, nuisance, nuisance_rate = false_alarm_rate(period, failures, starts, NUISANCE_WINDOW_S)
    n = len(inside)
    present = period.present
    labelled = period.labels[present]
    scored = np.nan_to_num(score[present], nan=0.0)
    pr_auc = float(average_precision_score(labelled, scored)) if labelled.any() else float("nan")
    return {
        "recall_1min": caught1 / n if n else float("nan"),
        "recall_5min": caught5 / n if n else float("nan"),
        "recall_5min_predictable": caught5_predictable / predictable_total
        if predictable_total
        else float("nan"),
        "median_lead_min": float(np.median(leads)) if leads else float("nan"),
        "p10_lead_min": float(np.percentile(leads, 10)) if leads else float("nan"),
        "false_alarms_per_1000_gpu_days": fa_rate,
        "alert_precision": true / (true + false) if true + false else float("nan"),
        "alerts": true + false,
        "false_alarms": false,
        # Alarms on hardware that did not fail within a day: what a false-alarm budget is for (an
        # early alarm on a GPU that fails 45 minutes later still saves the job).
        "nuisance_alarms_per_1000_gpu_days": nuisance_rate,
        "nuisance_alarms": nuisance,
        "pr_auc": pr_auc,
        "recall_by_mode": {mode: hits / total for mode, (hits, total) in sorted(by_mode.items())},
    }


def choose_threshold(
    period: ScoredPeriod,
    failures: FailureLog,
    method: str,
    policy: AlertPolicy,
    cadence_s: float,
    budget_per_1000_gpu_days: float,
    window_s: float = NUISANCE_WINDOW_S,
) -> tuple[float, float]:
    """The lowest threshold whose false alarms on `period` stay within the budget: (threshold, rate).
    A false alarm here is an incident not followed by a failure of its GPU or node within
    `window_s` (a day: a nuisance alarm that took healthy hardware out of service).

    On a validation period too small for the budget to allow even one false alarm (under
    1,000 / budget GPU-days), one is allowed: otherwise no threshold but "never" would do."""
    risk = period.scores[method]
    finite = risk[period.present & ~np.isnan(risk)]
    if finite.size == 0:
        return 1.0, 0.0
    allowed = max(1, int(budget_per_1000_gpu_days * period.gpu_days / 1000.0))
    candidates = np.unique(
        np.concatenate([np.quantile(finite, np.linspace(0.90, 1.0, 201)), np.unique(finite)[-300:]])
    )
    starts = alert_starts(risk, period.present, candidates.tolist(), policy, cadence_s)
    best = (float(candidates[-1]) + 1e-9, 0.0)
    for thr, start in sorted(zip(candidates, starts, strict=True), key=lambda x: -x[0]):
        _, false, rate = false_alarm_rate(period, failures, start, window_s)
        if false > allowed:
            break
        best = (float(thr), rate)
    return best
