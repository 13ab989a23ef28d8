"""What each alert was worth, judged against a failure log: the prediction-period convention of the
failure-prediction literature (Salfner, Lenk and Malek, "A survey of online failure prediction
methods", ACM Computing Surveys 42(3), 2010: lead time, minimal warning time, prediction period).

An incident (model/incidents.py) is credited only by a failure where its evidence pointed: a GPU
incident by a failure of that GPU, a node-level incident by a node-level failure of that node (never
by another GPU of the node). By the first such failure after it opened, an incident is

- **true** when the failure came between the minimal warning time (5 min) and the prediction period
  (2 h) after it opened: there was time to snapshot and move, and the drain was worth it;
- **late** when the failure came sooner than the minimal warning time;
- **premature** when it came after the prediction period but within a day;
- **false** when no such failure came within a day.

False alarms are premature + false: every incident not followed by its failure within the
prediction period. An incident that opened inside a censored span of its place (censored.csv: a node
drained on a prediction that nothing settled) is neither: perhaps the drain prevented its failure, so it
is counted apart (`censored_alerts`) and credits no failure. A failure is **caught** when an incident
it credits opened at least the minimal warning time and at most the prediction period before it; its
lead is measured from the earliest such incident.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from faultcast.model.evaluation.intervals import NodeTallies
from faultcast.model.features.offline import Censored, Failure, FailureLog
from faultcast.model.incidents import AlertPolicy, Incident, track
from faultcast.modes import FailureMode


@dataclass(frozen=True, slots=True)
class PredictionPeriods:
    """The periods every figure is judged by (recorded in `faultcast evaluate`'s output)."""

    warning_s: float = 300.0  # minimal warning time: a snapshot and a drain need this much
    period_s: float = 7200.0  # prediction period: what a drain is worth
    false_after_s: float = 86400.0  # no failure within this: false rather than premature

    def to_json(self) -> dict[str, float]:
        """The periods as recorded in reports and in the model's manifest."""
        return asdict(self)

    def outcome(self, lead_s: float | None) -> Outcome:
        """An alert's outcome from the lead of the first failure it credits within `false_after_s`
        (None: none came)."""
        if lead_s is None:
            return Outcome.FALSE
        if lead_s < self.warning_s:
            return Outcome.LATE
        return Outcome.TRUE if lead_s <= self.period_s else Outcome.PREMATURE


class Outcome(enum.Enum):
    """What followed an alert (see `PredictionPeriods.outcome`)."""

    TRUE = "true"
    LATE = "late"
    PREMATURE = "premature"
    FALSE = "false"


DEFAULT_PERIODS = PredictionPeriods()


@dataclass(frozen=True)
class ScoredPeriod:
    """Scores of every present row of some nodes over a period, on the model's grid."""

    times_s: np.ndarray  # (steps,) unix seconds
    nodes: tuple[int, ...]  # dataset node indexes of the slots, in slot order / gpus_per_node
    gpus_per_node: int
    present: np.ndarray  # (steps, slots)
    scores: dict[str, np.ndarray]  # method -> (steps, slots) risk (NaN where absent)
    labels: np.ndarray  # (steps, slots) bool
    # (steps, slots) the model's likely mode where some method's score reached MODE_FLOOR, else "":
    # the tracker reads it where an alert opens, to tell node-level incidents from GPU ones.
    modes: np.ndarray
    # Spans whose label nobody knows (the dataset's censored.csv): incidents opened inside them are
    # judged neither true nor false (`is_censored`).
    censored: Censored = field(default_factory=Censored.none)

    @property
    def cadence_s(self) -> float:
        """Seconds between two steps (60 for a period of one step)."""
        return float(self.times_s[1] - self.times_s[0]) if len(self.times_s) > 1 else 60.0

    @property
    def gpu_days(self) -> float:
        """GPU-days of present rows in the period."""
        return float(self.present.sum()) * self.cadence_s / 86_400.0

    def slot_of(self, node: int, gpu: int) -> int:
        """The column of (dataset node index, GPU) in the period's arrays."""
        return self.nodes.index(node) * self.gpus_per_node + gpu


def incidents(
    period: ScoredPeriod,
    method: str,
    thresholds: Sequence[float],
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
) -> list[list[Incident]]:
    """Every incident `method` raises over the period at each threshold: the batch loop over the
    service's state machine. Incident.node is the period's node position (period.nodes[node])."""
    return track(
        period.scores[method],
        period.present,
        period.modes,
        thresholds,
        policy,
        period.gpus_per_node,
        node_level_modes,
    )


def is_censored(incident: Incident, period: ScoredPeriod) -> bool:
    """Whether the incident opened inside a censored span of its GPU (a node-level one: of any GPU of
    its node), so that what followed it says nothing: its failure may have been prevented."""
    spans = period.censored
    if not len(spans.node):
        return False
    opened = float(period.times_s[incident.opened_step])
    hit = spans.at(opened, [period.nodes[incident.node]], period.gpus_per_node)
    return bool(hit.any() if incident.node_level else hit[incident.gpu])


def credits(incident: Incident, failure: Failure, period: ScoredPeriod) -> bool:
    """Whether `failure` is where the incident's evidence pointed (see the module docstring)."""
    return period.nodes[incident.node] == failure.node and incident.gpu == failure.gpu


@dataclass(frozen=True, slots=True)
class Judged:
    """An incident with what followed it."""

    incident: Incident
    time_s: float  # when it opened
    outcome: Outcome
    failure: Failure | None  # the first failure it credits within `false_after_s`
    lead_s: float | None  # the failure's time minus the opening's


def judge(
    period: ScoredPeriod, failures: FailureLog, found: Sequence[Incident], periods: PredictionPeriods
) -> list[Judged]:
    """Each incident's outcome, by the first failure it credits after it opened; a censored incident
    (`is_censored`) has none and is left out."""
    out = []
    for incident in found:
        if is_censored(incident, period):
            continue
        t = float(period.times_s[incident.opened_step])
        node = period.nodes[incident.node]
        # Failures at the opening step itself count (as late): `between` excludes its lower bound.
        following = [
            f
            for f in failures.between(t - 1e-6, t + periods.false_after_s, [node])
            if credits(incident, f, period)
        ]
        first = following[0] if following else None
        lead = None if first is None else first.time_s - t
        out.append(Judged(incident, t, periods.outcome(lead), first, lead))
    return out


@dataclass(frozen=True, slots=True)
class Catch:
    """A failure of the period and its warning: the lead of the earliest incident it credits that
    opened within the prediction period before it (None: none did)."""

    failure: Failure
    lead_s: float | None

    def caught(self, warning_s: float) -> bool:
        """Warned at least `warning_s` ahead (and within the prediction period)."""
        return self.lead_s is not None and self.lead_s >= warning_s


def catches(
    period: ScoredPeriod, failures: FailureLog, found: Sequence[Incident], periods: PredictionPeriods
) -> list[Catch]:
    """Every failure in the period, with its warning (never from a censored incident)."""
    by_place: dict[tuple[int, int], list[float]] = {}
    for incident in found:
        if is_censored(incident, period):
            continue
        key = (period.nodes[incident.node], incident.gpu)
        by_place.setdefault(key, []).append(float(period.times_s[incident.opened_step]))
    out = []
    for f in failures.between(float(period.times_s[0]), float(period.times_s[-1]), period.nodes):
        before = f.time_s - np.asarray(by_place.get((f.node, f.gpu), []))
        within = before[(before >= 0) & (before <= periods.period_s)]
        out.append(Catch(f, float(within.max()) if len(within) else None))
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


@dataclass(frozen=True)
class Events:
    """What a method's incidents over a period came to: every failure with its warning, every
    incident with its outcome."""

    caught: list[Catch]
    judged: list[Judged]
    censored: int = 0  # incidents opened inside a censored span: neither judged nor credited


def events(
    period: ScoredPeriod, failures: FailureLog, found: Sequence[Incident], periods: PredictionPeriods
) -> Events:
    """Catches and judged incidents of `found` (one threshold's incidents) over the period."""
    return Events(
        catches(period, failures, found, periods),
        judge(period, failures, found, periods),
        sum(is_censored(i, period) for i in found),
    )


def predictable_counts(
    caught: Sequence[Catch], warning_s: float, by_mode: bool = False
) -> tuple[int, int, int]:
    """(failures that carried a precursor, how many of them were caught, failures the log does not
    say about): the per-mode tallies (`mode_tallies`, `by_mode` as there) summed."""
    total = sum(mode_tallies(caught, warning_s, by_mode).values(), ModeTally())
    return total.predictable, total.predictable_caught, total.unknown


def event_metrics(
    period: ScoredPeriod,
    failures: FailureLog,
    found: Sequence[Incident],
    periods: PredictionPeriods,
    score: np.ndarray,
) -> dict[str, object]:
    """Recall (caught at >= the minimal warning time, within the prediction period), lead times of
    the caught failures, false alarms (premature + false) per 1,000 GPU-days, alert precision (the
    share of incidents that were true), PR-AUC of the rows."""
    return metrics_of(period, events(period, failures, found, periods), periods, score)


def metrics_of(
    period: ScoredPeriod, found: Events, periods: PredictionPeriods, score: np.ndarray
) -> dict[str, object]:
    """`event_metrics` of incidents already judged. `recall_5min_predictable` is over the failures
    the log says carried a precursor, and NaN when the log does not say for some failure of the
    period (`failures_precursor_unknown` counts those)."""
    from sklearn.metrics import average_precision_score

    caught, judged = found.caught, found.judged
    warned = [c for c in caught if c.caught(periods.warning_s)]
    leads_min = [c.lead_s / 60.0 for c in warned if c.lead_s is not None]
    modes = mode_tallies(caught, periods.warning_s)
    total = sum(modes.values(), ModeTally())
    predictable, predictable_caught, unknown = total.predictable, total.predictable_caught, total.unknown
    count = {o: sum(1 for j in judged if j.outcome is o) for o in Outcome}
    per_1000 = 1000.0 / max(period.gpu_days, 1e-9)
    n = len(caught)
    present = period.present
    labelled = period.labels[present]
    scored = np.nan_to_num(score[present], nan=0.0)
    pr_auc = float(average_precision_score(labelled, scored)) if labelled.any() else float("nan")
    nan = float("nan")
    return {
        "recall_5min": len(warned) / n if n else nan,
        "recall_5min_predictable": predictable_caught / predictable if predictable and not unknown else nan,
        "recall_1min": sum(c.caught(60.0) for c in caught) / n if n else nan,
        "median_lead_min": _quantile(leads_min, 50),
        "p10_lead_min": _quantile(leads_min, 10),
        "p90_lead_min": _quantile(leads_min, 90),
        "false_alarms_per_1000_gpu_days": (count[Outcome.PREMATURE] + count[Outcome.FALSE]) * per_1000,
        "premature_alarms_per_1000_gpu_days": count[Outcome.PREMATURE] * per_1000,
        "false_only_alarms_per_1000_gpu_days": count[Outcome.FALSE] * per_1000,
        "alert_precision": count[Outcome.TRUE] / len(judged) if judged else nan,
        "alerts": len(judged),
        "true_alarms": count[Outcome.TRUE],
        "late_alarms": count[Outcome.LATE],
        "premature_alarms": count[Outcome.PREMATURE],
        "false_only_alarms": count[Outcome.FALSE],
        "false_alarms": count[Outcome.PREMATURE] + count[Outcome.FALSE],
        "censored_alerts": found.censored,
        "failures": n,
        "failures_caught": len(warned),
        "failures_predictable": None if unknown else predictable,
        "failures_precursor_unknown": unknown,
        "pr_auc": pr_auc,
        "recall_by_mode": recall_by_mode(modes),
        "by_mode": mode_report(modes),
    }


@dataclass(frozen=True, slots=True)
class ModeTally:
    """One failure mode's failures over a period and what a method caught of them (at the minimal
    warning time, within the prediction period)."""

    failures: int = 0
    caught: int = 0  # of all its failures
    predictable: int = 0  # failures the log says carried a precursor
    predictable_caught: int = 0
    unknown: int = 0  # failures the log does not say about
    leads_min: tuple[float, ...] = ()  # the caught predictable failures' leads

    def __add__(self, other: ModeTally) -> ModeTally:
        return ModeTally(
            self.failures + other.failures,
            self.caught + other.caught,
            self.predictable + other.predictable,
            self.predictable_caught + other.predictable_caught,
            self.unknown + other.unknown,
            self.leads_min + other.leads_min,
        )

    @property
    def recall(self) -> float:
        """Recall of the predictable failures (NaN: none, or the log does not say for some)."""
        return (
            self.predictable_caught / self.predictable if self.predictable and not self.unknown else math.nan
        )

    def to_json(self) -> dict[str, object]:
        """The mode's row as the report writes it."""
        return {
            "failures": self.failures,
            "predictable": None if self.unknown else self.predictable,
            "predictable_caught": self.predictable_caught,
            "recall_5min_predictable": self.recall,
            "median_lead_min": _quantile(self.leads_min, 50),
        }


def mode_tallies(caught: Sequence[Catch], warning_s: float, by_mode: bool = False) -> dict[str, ModeTally]:
    """Per failure mode, its failures and what was caught of them at >= `warning_s`. Which failures
    were predictable is the failure log's word (`precursor_s`): a mode with a precursor can still
    strike without one. Where the log does not say (a real fleet's never does), the failure is
    unknown, or with `by_mode` predictable when its mode can carry a precursor (`can_warn`): what
    training's validation on a fleet's own holdout counts, else its recall would be NaN."""
    out: dict[str, ModeTally] = {}
    for c in caught:
        precursor = c.failure.precursor_s
        known, carried, hit = not math.isnan(precursor), precursor > 0, c.caught(warning_s)
        if not known and by_mode:
            known, carried = True, can_warn(c.failure.mode)
        lead = (c.lead_s / 60.0,) if hit and carried and c.lead_s is not None else ()
        out[c.failure.mode] = out.get(c.failure.mode, ModeTally()) + ModeTally(
            1, int(hit), int(known and carried), int(known and carried and hit), int(not known), lead
        )
    return out


def can_warn(mode: str) -> bool:
    """Whether failures of `mode` can carry a precursor (the mode catalogue's `has_precursor`); a mode
    faultcast does not know can (as training's labels take it: FailureLog.learnable)."""
    try:
        return FailureMode(mode).has_precursor
    except ValueError:
        return True


def mode_report(tallies: dict[str, ModeTally]) -> dict[str, dict[str, object]]:
    """The per-mode rows of a method (`by_mode` in the report), by mode name."""
    return {mode: tallies[mode].to_json() for mode in sorted(tallies)}


def recall_by_mode(tallies: dict[str, ModeTally]) -> dict[str, float]:
    """Per mode, the share of all its failures caught (`recall_by_mode` in the report)."""
    return {mode: t.caught / t.failures for mode, t in sorted(tallies.items()) if t.failures}


_COUNTED = (
    "failures",
    "caught",
    "caught_1min",
    "predictable",
    "predictable_caught",
    "precursor_unknown",
    "alerts",
    "true_alarms",
    "premature_alarms",
    "false_only_alarms",
)  # the NodeTallies columns counted one failure or incident at a time


def node_tallies(period: ScoredPeriod, found: Events, periods: PredictionPeriods) -> NodeTallies:
    """Per node of the period (in period.nodes order) the counts behind every figure: what the
    bootstrap (model/evaluation/intervals.py) resamples. A failure counts at its node, an incident at its own."""
    n = len(period.nodes)
    position = {node: i for i, node in enumerate(period.nodes)}
    t = {name: np.zeros(n) for name in _COUNTED}
    leads, owners = [], []
    for c in found.caught:
        i = position[c.failure.node]
        hit = c.caught(periods.warning_s)
        t["failures"][i] += 1
        t["caught"][i] += hit
        t["caught_1min"][i] += c.caught(60.0)
        if math.isnan(c.failure.precursor_s):
            t["precursor_unknown"][i] += 1
        elif c.failure.precursor_s > 0:
            t["predictable"][i] += 1
            t["predictable_caught"][i] += hit
        if hit and c.lead_s is not None:
            leads.append(c.lead_s / 60.0)
            owners.append(i)
    column = {
        Outcome.TRUE: "true_alarms",
        Outcome.PREMATURE: "premature_alarms",
        Outcome.FALSE: "false_only_alarms",
    }
    for j in found.judged:
        t["alerts"][j.incident.node] += 1
        if j.outcome in column:
            t[column[j.outcome]][j.incident.node] += 1
    rows = period.present.reshape(period.present.shape[0], n, period.gpus_per_node).sum(axis=(0, 2))
    return NodeTallies(
        **t,
        gpu_days=rows * period.cadence_s / 86_400.0,
        leads_min=np.asarray(leads, dtype=np.float64),
        lead_node=np.asarray(owners, dtype=np.int64),
    )


def choose_threshold(
    period: ScoredPeriod,
    failures: FailureLog,
    method: str,
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
    budget_per_1000_gpu_days: float,
    periods: PredictionPeriods = DEFAULT_PERIODS,
    floor: float = 0.0,
) -> tuple[float, float]:
    """The lowest threshold (not under `floor`) whose false alarms (premature + false) on `period`
    stay within the budget: (threshold, false alarms per 1,000 GPU-days).

    On a validation period too small for the budget to allow even one false alarm (under
    1,000 / budget GPU-days), one is allowed: otherwise no threshold but "never" would do."""
    return choose_threshold_pooled(
        [(period, failures)], method, policy, node_level_modes, budget_per_1000_gpu_days, periods, floor
    )


def choose_threshold_pooled(
    parts: Sequence[tuple[ScoredPeriod, FailureLog]],
    method: str,
    policy: AlertPolicy,
    node_level_modes: frozenset[str],
    budget_per_1000_gpu_days: float,
    periods: PredictionPeriods = DEFAULT_PERIODS,
    floor: float = 0.0,
) -> tuple[float, float]:
    """`choose_threshold` over several periods as one (a group of validation worlds): false alarms
    summed over the parts against the budget of their GPU-days summed, so that a choice rests on
    every world's failures and look-alikes, not on one world's."""
    candidates = candidate_thresholds([p for p, _ in parts], method, floor)
    if candidates.size == 0:
        return 1.0, 0.0
    gpu_days = sum(p.gpu_days for p, _ in parts)
    allowed = max(1, int(budget_per_1000_gpu_days * gpu_days / 1000.0))
    found = [incidents(p, method, candidates.tolist(), policy, node_level_modes) for p, _ in parts]
    best = (float(candidates[-1]) + 1e-9, 0.0)
    # From the highest threshold down, while the false alarms stay within what is allowed (judged
    # lazily: the low thresholds' many incidents are never judged once one is over the budget).
    for k in range(len(candidates) - 1, -1, -1):
        false = 0
        for (period, failures), these in zip(parts, found, strict=True):
            judged = judge(period, failures, these[k], periods)
            false += sum(1 for j in judged if j.outcome in (Outcome.PREMATURE, Outcome.FALSE))
        if false > allowed:
            break
        best = (float(candidates[k]), 1000.0 * false / max(gpu_days, 1e-9))
    return best


def candidate_thresholds(periods: Sequence[ScoredPeriod], method: str, floor: float = 0.0) -> np.ndarray:
    """The thresholds a choice tries, ascending: 201 quantiles of the top tenth of the scores (not
    under `floor`) and the 300 highest distinct scores. Empty when no row scores."""
    finite = np.concatenate(
        [
            p.scores[method][p.present & ~np.isnan(p.scores[method]) & (p.scores[method] >= floor)]
            for p in periods
        ]
    )
    if finite.size == 0:
        return finite
    return np.unique(
        np.concatenate([np.quantile(finite, np.linspace(0.90, 1.0, 201)), np.unique(finite)[-300:]])
    )
