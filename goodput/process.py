"""The failure process a job of N GPUs meets, calibrated to the Llama 3 report, and its alerts.

Rates per mode are the fleet twin's (`faultcast.sim.modes`, unaccelerated); together they are the
hardware share of Llama 3's unexpected interruptions. The rest of the 419 interruptions in 54 days
on 16,384 GPUs (software, host and storage faults the twin does not model) is one more mode,
`unmodelled`, which no alert ever foresees and which takes no node out. Each failure's alert is a
failure of the same mode drawn from the model's replay on twin telemetry (its real lead or its
miss); false alarms are a Poisson process at the replay's rate per GPU-day.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.goodput.engine import JobFailure, Scenario
from faultcast.modes import MODES_WITH_PRECURSOR, Level
from faultcast.sim.modes import MODES

LLAMA3_UNEXPECTED = 419
"""Unexpected interruptions in the Llama 3 report's pre-training run (LLAMA3_GPUS GPUs, LLAMA3_DAYS days)."""
LLAMA3_GPUS = 16_384
"""GPUs of that run."""
LLAMA3_DAYS = 54.0
"""Days of that run."""
UNMODELLED = "unmodelled"
"""The mode name of the failures outside the twin's hardware modes: never foreseen."""
GPUS_PER_NODE = 8
"""GPUs per node of the goodput twin's jobs (a node-level failure takes eight GPUs)."""
_DAY_S = 86_400.0


def failure_rates() -> dict[str, float]:
    """Failures per GPU-day by mode, summing to Llama 3's unexpected interruption rate."""
    total = LLAMA3_UNEXPECTED / (LLAMA3_GPUS * LLAMA3_DAYS)
    rates = {m.name: m.rate_per_day / (GPUS_PER_NODE if m.level is Level.NODE else 1) for m in MODES}
    rates[UNMODELLED] = max(0.0, total - sum(rates.values()))
    return rates


def job_mtbf_s(gpus: int, rate_per_gpu_day: float) -> float:
    """Mean time between failures of a job on `gpus` GPUs (inf when nothing fails)."""
    per_day = gpus * rate_per_gpu_day
    return _DAY_S / per_day if per_day > 0 else math.inf


@dataclass(frozen=True)
class AlertSample:
    """What the model did at one threshold, from its replay: per mode, each replayed failure's
    lead in seconds (None: missed), and the false alarms per GPU-day."""

    threshold: float
    leads_s: Mapping[str, Sequence[float | None]]
    false_alarms_per_gpu_day: float

    def leads_for(self, mode: str) -> Sequence[float | None]:
        """The replay's leads for this mode; a foreseeable mode the replay did not see borrows every
        foreseeable mode's; the rest (no precursor, unmodelled) are never foreseen."""
        found = self.leads_s.get(mode)
        if found:
            return found
        if mode in MODES_WITH_PRECURSOR:
            return [
                lead for name, leads in self.leads_s.items() if name in MODES_WITH_PRECURSOR for lead in leads
            ]
        return []

    def with_false_alarm_rate(self, per_gpu_day: float) -> AlertSample:
        """The same leads with another false-alarm rate (per GPU-day)."""
        return AlertSample(self.threshold, self.leads_s, per_gpu_day)

    def caught_share(self, rates: Mapping[str, float], min_lead_s: float) -> float:
        """The share of all failures, by rate, whose alert comes at least `min_lead_s` ahead."""
        total = sum(rates.values())
        caught = 0.0
        for mode, rate in rates.items():
            leads = self.leads_for(mode)
            if leads:
                caught += rate * sum(1 for v in leads if v is not None and v >= min_lead_s) / len(leads)
        return caught / total if total else 0.0


@dataclass(frozen=True)
class Draw:
    """The randomness of one replication, shared by every policy and threshold so that their
    differences are the policies', not the dice's (common random numbers)."""

    times_s: np.ndarray
    modes: list[str]
    picks: np.ndarray  # uniform [0, 1): which replayed failure of the mode stands in for this one
    repairs_s: np.ndarray
    unit_gaps: np.ndarray  # exponential(1) gaps of the false-alarm process before scaling


def draw(rng: np.random.Generator, gpus: int, days: float, rates: Mapping[str, float]) -> Draw:
    """One replication's randomness: Poisson failures at `rates` (per GPU-day, by mode) over `days` on
    `gpus` GPUs, with their repairs and picks, and the false-alarm gaps. Advances `rng`."""
    from faultcast.sim.modes import BY_NAME

    names = sorted(rates)
    weights = np.array([rates[n] for n in names])
    wall = days * _DAY_S
    count = rng.poisson(gpus * days * weights.sum())
    times = np.sort(rng.uniform(0.0, wall, count))
    modes = [names[i] for i in rng.choice(len(names), size=count, p=weights / weights.sum())]
    picks = rng.uniform(0.0, 1.0, count)
    medians = np.array([BY_NAME[m].downtime_median_s if m in BY_NAME else 0.0 for m in modes])
    repairs = medians * rng.lognormal(0.0, 0.5, count)
    return Draw(times, modes, picks, repairs, rng.exponential(1.0, 64))


def scenario(
    d: Draw, alerts: AlertSample, gpus: int, days: float, protect: AlertSample | None = None
) -> Scenario:
    """The failures of the draw with the alerts the model gives them at this threshold, and with
    `protect` (a lower threshold's sample) the protect tier's warnings: the same replayed failure
    stands in at both thresholds (one pick), so its two leads are one failure's."""
    failures = []
    for t, mode, pick, repair in zip(d.times_s, d.modes, d.picks, d.repairs_s, strict=True):
        alert = _alert_time(alerts, mode, pick, float(t))
        warned = _alert_time(protect, mode, pick, float(t)) if protect is not None else None
        failures.append(JobFailure(float(t), mode, alert, mode != UNMODELLED, float(repair), warned))
    wall = days * _DAY_S
    protect_alarms = (
        false_alarm_times(d, protect.false_alarms_per_gpu_day * gpus, wall) if protect is not None else ()
    )
    return Scenario(
        wall,
        tuple(failures),
        false_alarm_times(d, alerts.false_alarms_per_gpu_day * gpus, wall),
        protect_alarms,
    )


def _alert_time(alerts: AlertSample, mode: str, pick: float, t: float) -> float | None:
    """When the replayed failure `pick` stands for was alerted at this sample's threshold (None: missed)."""
    leads = alerts.leads_for(mode)
    lead = leads[min(int(pick * len(leads)), len(leads) - 1)] if leads else None
    return None if lead is None else max(0.0, t - lead)


def false_alarm_times(d: Draw, per_day: float, wall_s: float) -> tuple[float, ...]:
    """The draw's unit-rate gaps scaled to `per_day`: a higher rate puts the same alarms closer."""
    if per_day <= 0:
        return ()
    scale = _DAY_S / per_day
    gaps = d.unit_gaps
    seed = int(gaps.sum() * 1e6) % (2**32)
    rng = np.random.default_rng(seed)
    while gaps.sum() * scale < wall_s:  # extend deterministically until the wall is covered
        gaps = np.concatenate([gaps, rng.exponential(1.0, len(gaps))])
    times = np.cumsum(gaps) * scale
    return tuple(float(t) for t in times[times < wall_s])
