"""The comparison: policies (a) periodic checkpoints at the Young/Daly interval, (b) the same plus
faultcast's snapshot-and-migrate, (c) an oracle that knows every failure 30 minutes ahead; and the
threshold sweep behind the recommendation. Every policy meets the same failures in each
replication (common random numbers), so the differences are the policies'."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.goodput.engine import (
    JobCosts,
    NodeReplacement,
    Outcome,
    Policy,
    ProtectTier,
    Scenario,
    simulate,
)
from faultcast.goodput.interval import daly_interval
from faultcast.goodput.process import AlertSample, Draw, draw, job_mtbf_s, scenario
from faultcast.goodput.replay import Replay
from faultcast.modes import FailureMode

ORACLE_LEAD_S = 1800.0
"""How far ahead the oracle policy knows every failure (seconds)."""


@dataclass(frozen=True)
class Job:
    """The training job studied: its size, length in days, costs and spare nodes; ValueError for fewer
    than one GPU or a length that is not positive and finite."""

    gpus: int
    days: float
    costs: JobCosts
    spares: int  # spare nodes

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {self.gpus}")
        if not (self.days > 0 and math.isfinite(self.days)):
            raise ValueError(f"days must be positive, got {self.days}")


@dataclass(frozen=True)
class PolicyResult:
    """One policy's outcomes over the replications (the same draws for every policy)."""

    key: str  # a, b, b_tuned, c, c_tuned
    label: str
    interval_s: float
    threshold: float | None
    outcomes: tuple[Outcome, ...]

    def mean(self, value: Callable[[Outcome], float]) -> float:
        """The mean of `value` over the replications."""
        return statistics.fmean(value(o) for o in self.outcomes)

    def sd(self, value: Callable[[Outcome], float]) -> float:
        """The sample standard deviation of `value` over the replications (0 for one replication)."""
        values = [value(o) for o in self.outcomes]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    @property
    def ettr(self) -> float:
        """The mean effective training time ratio (useful over wall time)."""
        return self.mean(lambda o: o.ettr)


def gpu_hours(job: Job, seconds: float) -> float:
    """`seconds` of the whole job's wall time in GPU-hours."""
    return seconds * job.gpus / 3600.0


def lost_s(o: Outcome) -> float:
    """Wall time that produced nothing kept: everything but useful compute."""
    return o.wall_s - o.useful_s


def min_lead_s(costs: JobCosts) -> float:
    """An alert must come at least this early for its snapshot to complete before the failure."""
    return costs.react_s + costs.snapshot_s


def interval_for(job: Job, rates: Mapping[str, float], foreseen_share: float) -> float:
    """Daly's interval for the failures a policy does not see coming."""
    unforeseen = sum(rates.values()) * (1.0 - foreseen_share)
    return daly_interval(job.costs.checkpoint_s, job_mtbf_s(job.gpus, unforeseen))


def draws(job: Job, rates: Mapping[str, float], replications: int, seed: int) -> list[Draw]:
    """`replications` draws from one seeded generator: the same seed gives the same list."""
    rng = np.random.default_rng(seed)
    return [draw(rng, job.gpus, job.days, rates) for _ in range(replications)]


def _run(
    key: str, label: str, policy: Policy, threshold: float | None, job: Job, scenarios: Sequence[Scenario]
) -> PolicyResult:
    outcomes = tuple(simulate(s, policy, job.costs, job.spares) for s in scenarios)
    return PolicyResult(key, label, policy.interval_s, threshold, outcomes)


def compare(
    job: Job, rates: Mapping[str, float], alerts: AlertSample, runs: Sequence[Draw]
) -> list[PolicyResult]:
    """The three policies (b and c also with the interval re-tuned to what they do not foresee)."""
    scenarios = [scenario(d, alerts, job.gpus, job.days) for d in runs]
    oracles = [s.oracle(ORACLE_LEAD_S) for s in scenarios]
    tau_a = interval_for(job, rates, 0.0)
    tau_c = interval_for(job, rates, 1.0 if min_lead_s(job.costs) <= ORACLE_LEAD_S else 0.0)
    thr = alerts.threshold
    return [
        _run(
            "a",
            "(a) periodic checkpoints, Young/Daly interval",
            Policy("a", tau_a, False),
            None,
            job,
            scenarios,
        ),
        _run("b", "(b) (a) + faultcast snapshot-and-migrate", Policy("b", tau_a, True), thr, job, scenarios),
        _run(
            "b_tuned",
            "(b') (b), interval re-tuned to unforeseen failures",
            tuned_policy(job, rates, foreseen(job, rates, alerts)),
            thr,
            job,
            scenarios,
        ),
        _run(
            "c", "(c) (a) + oracle, every failure 30 min ahead", Policy("c", tau_a, True), None, job, oracles
        ),
        _run(
            "c_tuned",
            "(c') (c), interval re-tuned (no periodic checkpoint)",
            Policy("c'", tau_c, True),
            None,
            job,
            oracles,
        ),
    ]


def false_alarm_upper_bound(rate_per_gpu_day: float, gpu_days: float, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a Poisson rate from `rate * gpu_days` observed alarms
    (the exact bound: the rate at which seeing that few has probability 1 - confidence). A replay of
    a few thousand GPU-days that saw no false alarm cannot tell 0 from 1 per 1,000 GPU-days, which at
    16,384 GPUs is 16 migrations a day."""
    observed = round(rate_per_gpu_day * gpu_days)

    def at_most_observed(mean: float) -> float:
        term = total = math.exp(-mean)
        for i in range(1, observed + 1):
            term *= mean / i
            total += term
        return total

    low, high = float(observed), float(observed) + 10.0 * math.sqrt(observed + 1) + 10.0
    for _ in range(100):  # bisection: at_most_observed falls as the mean grows
        mid = (low + high) / 2
        low, high = (mid, high) if at_most_observed(mid) > 1.0 - confidence else (low, mid)
    return high / gpu_days


def pessimistic(
    job: Job, rates: Mapping[str, float], alerts: AlertSample, gpu_days: float, runs: Sequence[Draw]
) -> PolicyResult:
    """(b') with the false-alarm rate at its 95% upper bound: what the replay cannot rule out."""
    bound = false_alarm_upper_bound(alerts.false_alarms_per_gpu_day, gpu_days)
    worse = alerts.with_false_alarm_rate(bound)
    scenarios = [scenario(d, worse, job.gpus, job.days) for d in runs]
    label = f"(b'') (b') at the false-alarm rate's 95% upper bound, {1000 * bound:.2f} per 1,000 GPU-days"
    return _run(
        "b_bound",
        label,
        tuned_policy(job, rates, foreseen(job, rates, worse)),
        alerts.threshold,
        job,
        scenarios,
    )


@dataclass(frozen=True)
class SweepPoint:
    """Policy (b') at one alert threshold: its ETTR, and what the alerts foresaw and cost."""

    threshold: float
    ettr: float  # policy (b'), mean over replications
    ettr_sd: float
    foreseen_share: float  # of all failures, with enough lead for the snapshot
    false_alarms_per_day: float  # for this job


def sweep(job: Job, rates: Mapping[str, float], result: Replay, runs: Sequence[Draw]) -> list[SweepPoint]:
    """Policy (b') at every replayed threshold."""
    points = []
    for alerts in result.samples:
        share = foreseen(job, rates, alerts)
        scenarios = [scenario(d, alerts, job.gpus, job.days) for d in runs]
        r = _run("b_tuned", "(b')", tuned_policy(job, rates, share), alerts.threshold, job, scenarios)
        points.append(
            SweepPoint(
                alerts.threshold,
                r.ettr,
                r.sd(lambda o: o.ettr),
                share,
                alerts.false_alarms_per_gpu_day * job.gpus,
            )
        )
    return points


def foreseen(job: Job, rates: Mapping[str, float], alerts: AlertSample) -> float:
    """The share of failures whose alert leaves time for the snapshot."""
    return alerts.caught_share(rates, min_lead_s(job.costs))


def tuned_policy(job: Job, rates: Mapping[str, float], foreseen_share: float) -> Policy:
    """(b'): act on alerts, checkpoint at Daly's interval for the failures the alerts miss."""
    return Policy("b'", interval_for(job, rates, foreseen_share), True)


def recommend(points: Sequence[SweepPoint]) -> SweepPoint:
    """The threshold with the highest effective training time ratio under policy (b')."""
    if not points:
        raise ValueError("no threshold was swept")
    return max(points, key=lambda p: (p.ettr, p.threshold))


@dataclass(frozen=True)
class Evaluation:
    """The whole study at one set of costs: the sweep, its recommendation, and every policy at it."""

    points: list[SweepPoint]
    best: SweepPoint
    results: list[PolicyResult]  # a, b, b_tuned, b_bound, c, c_tuned

    def by_key(self) -> dict[str, PolicyResult]:
        return {r.key: r for r in self.results}


def evaluate(
    job: Job,
    rates: Mapping[str, float],
    result: Replay,
    runs: Sequence[Draw],
    replications: int,
    sweep_replications: int,
) -> Evaluation:
    """Sweep the thresholds on the first `sweep_replications` draws, then run every policy at the
    recommended one on the first `replications`."""
    points = sweep(job, rates, result, runs[:sweep_replications])
    best = recommend(points)
    chosen = result.at(best.threshold)
    results = compare(job, rates, chosen, runs[:replications])
    results.insert(3, pessimistic(job, rates, chosen, result.gpu_days, runs[:replications]))
    return Evaluation(points, best, results)


@dataclass(frozen=True)
class TierPoint:
    """Policy (b') at the move threshold plus a protect tier at one lower threshold."""

    threshold: float  # the protect tier's
    ettr: float
    ettr_sd: float
    warned_share: float  # of all failures, with a protect warning at least react_s ahead
    warnings_per_day: float  # protect warnings on healthy nodes, for this job


@dataclass(frozen=True)
class TierStudy:
    """The protect tier's sweep below the move threshold, and the policy at its best point (None when
    no protect threshold beats the move tier alone on the same draws)."""

    tier: ProtectTier
    base: PolicyResult  # (b') at the move threshold, no protect tier
    points: list[TierPoint]
    best: TierPoint | None
    result: PolicyResult | None  # (t) at the best point, on the comparison's replications


def protect_tier(
    job: Job,
    rates: Mapping[str, float],
    result: Replay,
    move: AlertSample,
    tier: ProtectTier,
    runs: Sequence[Draw],
    replications: int,
    sweep_replications: int,
) -> TierStudy:
    """Sweep the protect tier's threshold over the replayed thresholds below `move`'s, on the first
    `sweep_replications` draws, against (b') alone on the same draws; run the best on the first
    `replications`. The periodic checkpoint interval is (b')'s: a protect tier changes what a crash
    loses, not which failures come unforeseen."""
    policy = tuned_policy(job, rates, foreseen(job, rates, move))
    tiered = dataclasses.replace(policy, name="t", protect=tier)
    sweep_runs = runs[:sweep_replications]
    base = _run(
        "b_tuned",
        "(b')",
        policy,
        move.threshold,
        job,
        [scenario(d, move, job.gpus, job.days) for d in sweep_runs],
    )
    points = []
    for low in result.samples:
        if low.threshold >= move.threshold:
            continue
        scenarios = [scenario(d, move, job.gpus, job.days, low) for d in sweep_runs]
        r = _run("t", "(t)", tiered, move.threshold, job, scenarios)
        points.append(
            TierPoint(
                low.threshold,
                r.ettr,
                r.sd(lambda o: o.ettr),
                low.caught_share(rates, job.costs.react_s),
                low.false_alarms_per_gpu_day * job.gpus,
            )
        )
    better = [p for p in points if p.ettr > base.ettr]
    best = max(better, key=lambda p: (p.ettr, p.threshold)) if better else None
    chosen = None
    if best is not None:
        low = result.at(best.threshold)
        chosen = _run(
            "t",
            f"(t) (b') + protect tier at {best.threshold:.3f}: replicas every {tier.replica_s:g} s while warned",
            tiered,
            move.threshold,
            job,
            [scenario(d, move, job.gpus, job.days, low) for d in runs[:replications]],
        )
    return TierStudy(tier, base, points, best, chosen)


def with_replacement(
    job: Job,
    rates: Mapping[str, float],
    alerts: AlertSample,
    runs: Sequence[Draw],
    replacement: NodeReplacement,
) -> PolicyResult:
    """(r): (b') plus buddy replicas and one node replaced from a warm pool, on the same draws. The
    periodic checkpoints remain only for what replicas cannot restore (silent data corruption), at
    Daly's interval for that rate."""
    unrestorable = rates.get(FailureMode.SILENT_DATA_CORRUPTION.value, 0.0)
    interval = daly_interval(job.costs.checkpoint_s, job_mtbf_s(job.gpus, unrestorable))
    label = (
        f"(r) (b') + buddy replicas every {replacement.replica_s:g} s, one node replaced in "
        f"{replacement.replace_s:g} s from a warm pool of {replacement.warm_pool}"
    )
    policy = Policy("r", interval, True, replacement=replacement)
    # A predicted failure takes the same replacement (its part handed over in a replica made at once).
    replaced = Job(
        job.gpus, job.days, dataclasses.replace(job.costs, migrate_s=replacement.replace_s), job.spares
    )
    scenarios = [scenario(d, alerts, job.gpus, job.days) for d in runs]
    return _run("r", label, policy, alerts.threshold, replaced, scenarios)
