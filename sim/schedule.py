"""What happens to a node over the whole horizon: failures, repairs, driver reloads, jobs.

Everything here is drawn once from the node's own streams, before any telemetry, so the rates can
be tested on a large fleet in seconds and the telemetry generator only has to read the schedule.
Failures are Poisson arrivals per GPU (per node for node-level modes) at the accelerated rates of the
world; a GPU that failed is dark until repaired and can only fail again after it returns. Whether a
failure carries a precursor, how long, how loud, in which shape and with which of its mode's signals
is drawn per failure. Degradations that stop without a failure (`NodeSchedule.aborted`) are drawn
the same way, at the world's `aborted_per_precursor` times the rate of precursor-bearing failures.
A world may give nodes a history (docs/fault-trace.md): a frailty that multiplies all their rates, and
refaults, a target failing again soon after it returns from repair; both draw from their own streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.durations import parse_duration
from faultcast.modes import Level
from faultcast.sim.config import FleetConfig
from faultcast.sim.fleet import node_frailty
from faultcast.sim.modes import BY_NAME, MODES, ModeSpec
from faultcast.sim.streams import Stream, rng
from faultcast.sim.world import World

_MIN_LEAD_S = 60.0
_MAX_LEAD_S = 8 * 3600.0
_STRENGTH_SIGMA = 0.8  # per-failure spread of precursor strength around the world's median
# Precursor shapes (sim/precursors.py): a failure draws one, uniformly.
SHAPES = ("ramp", "step", "intermittent", "plateau")
SCENARIO_STRENGTH = 3.0  # a failure ordered on cue: a loud, textbook precursor
_JOB_MEDIAN_S, _JOB_SIGMA = 6 * 3600.0, 0.8
_GAP_MEDIAN_S, _GAP_SIGMA = 20 * 60.0, 1.0
# A repair takes at most this long: beyond it a server is replaced, not repaired (the trace's longest
# repair is 131 days). At the default spread (sigma 0.5) no draw comes near it.
_MAX_DOWNTIME_S = 180 * 86_400.0
# A refault strikes the mode that failed before this often, else any of the target's modes by its rate:
# 87 of the trace's 153 follow-ups within 7 days name the same component (docs/fault-trace.md).
_REFAULT_SAME_MODE = 0.57


@dataclass(frozen=True, slots=True)
class ScheduledFailure:
    """One failure the twin has planned: its target (gpu None for a node-level mode), when it strikes
    and how its precursor and repair look. Times in seconds since the start of the simulation."""

    node: int
    gpu: int | None  # None for a node-level failure
    mode: str
    fail_s: float  # seconds since the start of the simulation
    lead_s: float  # length of the precursor before the failure (0: none)
    strength: float  # how loud the precursor is (lognormal around 1)
    downtime_s: float
    xid: int
    scripted: bool = False
    # Uniform draws fixed for the failure's whole life (which IB port degrades, when a remap turns
    # pending, whether and when a PCIe link downtrains), so chunk boundaries cannot change them.
    draws: tuple[float, ...] = (0.5, 0.5, 0.5, 0.5, 0.5, 0.5)
    shape: str = "ramp"  # one of SHAPES
    # Which of the mode's signals the precursor shows (sim/precursors.py numbers them); all by default.
    signals: tuple[bool, ...] = (True,) * 8
    # A degradation that stops at fail_s without failing (not in the failure log, no outage); it
    # reaches `peak` of the strength a failure's precursor would.
    aborted: bool = False
    peak: float = 1.0

    @property
    def precursor_start_s(self) -> float:
        """When the precursor starts (the failure time itself when there is none)."""
        return self.fail_s - self.lead_s

    @property
    def return_s(self) -> float:
        """When the repaired GPU or node is back."""
        return self.fail_s + self.downtime_s

    @property
    def spec(self) -> ModeSpec:
        """The twin's physics of this failure's mode."""
        return BY_NAME[self.mode]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A failure ordered on cue: `mode` on `node` (and `gpu`), failing `fail_s` after the start.

    The precursor starts `lead_s` before (the mode's median lead when None)."""

    mode: str
    node: int
    gpu: int | None
    fail_s: float
    lead_s: float | None = None
    # How loud the precursor is. A failure ordered on cue is a textbook one by default (3; the twin's
    # own failures are lognormal around the world's median, 1, from about 0.2 to 5).
    strength: float = SCENARIO_STRENGTH

    def __post_init__(self) -> None:
        spec = BY_NAME.get(self.mode)
        if spec is None:
            raise ValueError(f"unknown mode {self.mode!r}; known: {', '.join(BY_NAME)}")
        if (spec.level is Level.NODE) != (self.gpu is None):
            advice = "leave GPU empty" if spec.level is Level.NODE else "give a GPU"
            raise ValueError(f"{self.mode} is {spec.level.value}-level; {advice}")
        if self.fail_s <= 0:
            raise ValueError(f"a scenario must fail after the start, got {self.fail_s} s")
        if not (math.isfinite(self.strength) and 0 < self.strength <= 100):
            raise ValueError(f"a scenario's strength is a positive number up to 100, got {self.strength}")

    @staticmethod
    def parse(text: str) -> Scenario:
        """MODE:NODE:GPU:AT, e.g. hbm_wear:3:5:2h (GPU 5 of node 3 fails 2 h in); GPU empty for node
        level. An optional fifth field sets the precursor's lead (default: the mode's median), e.g.
        :40m, and a sixth its strength (default 3, a textbook failure; the twin's own are around 1,
        from about 0.2 to 5), e.g. :40m:1. ValueError saying what is wrong otherwise (`faultcast collect/simulate
        --scenario`, `faultcast demo --failure`)."""
        parts = text.split(":")
        if len(parts) not in (4, 5, 6):
            raise ValueError(f"{text!r}: expected MODE:NODE:GPU:AT[:LEAD[:STRENGTH]], e.g. hbm_wear:0:3:30m")
        name, node, gpu, at, *rest = parts
        lead = rest[:1] if rest and rest[0] != "" else []
        strength = SCENARIO_STRENGTH
        if len(rest) == 2:
            try:
                strength = float(rest[1])
            except ValueError:
                raise ValueError(
                    f"{text!r}: STRENGTH is a number (3: a textbook failure, 1: the twin's median)"
                ) from None
            if not (math.isfinite(strength) and 0 < strength <= 100):
                raise ValueError(f"{text!r}: STRENGTH must be a positive number up to 100, got {rest[1]}")
        try:
            node_index, gpu_index = int(node), None if gpu == "" else int(gpu)
        except ValueError:
            raise ValueError(
                f"{text!r}: NODE and GPU are indexes (GPU empty for a node-level mode)"
            ) from None
        try:
            return Scenario(
                name,
                node_index,
                gpu_index,
                parse_duration(at),
                parse_duration(lead[0]) if lead else None,
                strength,
            )
        except ValueError as e:  # the mode, its level, the times: said once, in __post_init__
            raise ValueError(f"{text!r}: {e}") from None

    def arg(self) -> str:
        """The scenario as `parse` reads it (for a `--scenario` flag)."""
        gpu = "" if self.gpu is None else str(self.gpu)
        lead = f":{self.lead_s:.0f}s" if self.lead_s is not None else ""
        if self.strength != SCENARIO_STRENGTH:
            lead = f"{lead or ':'}:{self.strength:g}"
        return f"{self.mode}:{self.node}:{gpu}:{self.fail_s:.0f}s{lead}"


@dataclass(frozen=True)
class NodeSchedule:
    """What will happen to one node over the horizon: failures, healthy driver reloads, its pod's jobs."""

    node: int
    failures: tuple[ScheduledFailure, ...]  # sorted by failure time
    reloads_s: tuple[float, ...]  # healthy driver reloads (counter resets)
    jobs: tuple[tuple[float, float], ...]  # (start, end) of the jobs on this node's pod
    aborted: tuple[ScheduledFailure, ...] = ()  # degradations that stop without failing, by time

    def gpu_failures(self, gpu: int) -> list[ScheduledFailure]:
        """The failures of GPU slot `gpu` (not the node-level ones), in time order."""
        return [f for f in self.failures if f.gpu == gpu]

    def node_failures(self) -> list[ScheduledFailure]:
        """The node-level failures, in time order."""
        return [f for f in self.failures if f.gpu is None]


def _lognormal(r: np.random.Generator, median: float, sigma: float) -> float:
    return float(median * math.exp(sigma * r.standard_normal())) if sigma > 0 else median


def _draw(
    r: np.random.Generator,
    spec: ModeSpec,
    world: World,
    target: tuple[int, int | None],
    fail_s: float,
    earliest_s: float,
    aborted: bool = False,
) -> ScheduledFailure:
    node, gpu = target
    lead = 0.0
    carries = r.random() < spec.precursor_probability(world)
    if carries or (aborted and spec.predictable):
        median = spec.lead_median_s * world.lead_scale
        lead = min(max(_lognormal(r, median, spec.lead_sigma), _MIN_LEAD_S), _MAX_LEAD_S)
    else:
        r.random()  # the same number of draws either way: one failure's choice cannot shift the next
    lead = max(0.0, min(lead, fail_s - earliest_s))  # a precursor cannot start before the GPU returned
    strength = _lognormal(r, world.strength_median, _STRENGTH_SIGMA)
    median_downtime = spec.downtime_median_s * world.downtime_scale
    downtime = min(_lognormal(r, median_downtime, world.downtime_sigma), _MAX_DOWNTIME_S)
    codes, probs = zip(*spec.xids, strict=True)
    xid = int(r.choice(codes, p=np.asarray(probs) / sum(probs)))
    draws = tuple(float(u) for u in r.random(6))
    shape = SHAPES[int(r.integers(len(SHAPES)))]
    # Partial precursors: each signal of the mode shows with probability 0.6; the first always does.
    signals = (True, *(bool(u < 0.6) for u in r.random(7)))
    peak = float(r.uniform(0.3, 1.0)) if aborted else 1.0
    return ScheduledFailure(
        node, gpu, spec.name, fail_s, lead, strength, downtime, xid,
        draws=draws, shape=shape, signals=signals, aborted=aborted, peak=peak,
    )  # fmt: skip


def _arrivals(
    r: np.random.Generator,
    specs: Sequence[ModeSpec],
    world: World,
    accel: float,
    horizon: float,
    blocked: Sequence[tuple[float, float]],
    target: tuple[int, int | None],
    mode_factor: Callable[[str], float],
    frailty: float = 1.0,
    refaults: np.random.Generator | None = None,
) -> list[ScheduledFailure]:
    """Poisson arrivals over [0, horizon) for one GPU (or node), skipping its dark periods and `blocked`;
    each mode's rate times `accel`, its `mode_factor` and the node's `frailty` (1.0 multiplies exactly:
    the same draws). With `refaults` (drawn from it, never from `r`), each failure is followed with the
    world's `refault_p` by another soon after its return, unless an independent arrival comes first."""
    rates = np.array(
        [
            s.rate_per_day * world.rate_scale(s.name) * accel * mode_factor(s.name) / 86_400.0 * frailty
            for s in specs
        ]
    )
    total = float(rates.sum())
    out: list[ScheduledFailure] = []
    if total <= 0:
        return out
    t = 0.0
    resumed = 0.0
    due = math.inf  # when a refault is pending
    while True:
        t += float(r.exponential(1.0 / total))
        source = r
        if due < t:  # the refault comes first (arrivals are memoryless: the later draw is dropped)
            t, source, due = due, refaults or r, math.inf
        if t >= horizon:
            return out
        window = next(((a, b) for a, b in blocked if a <= t < b), None)
        if window is not None:  # the node is dark: nothing fails until it returns
            t = resumed = window[1]
            continue
        if source is not r and source.random() < _REFAULT_SAME_MODE:
            spec = out[-1].spec  # the failure it follows strikes again
        else:
            spec = specs[int(source.choice(len(specs), p=rates / total))]
        earliest = max([resumed, *(b for a, b in blocked if b <= t)])
        failure = _draw(source, spec, world, target, t, earliest)
        out.append(failure)
        t = resumed = failure.return_s
        if refaults is not None and refaults.random() < world.refault_p:
            due = failure.return_s + float(refaults.exponential(world.refault_days * 86_400.0))


def _jobs(config: FleetConfig, node: int) -> tuple[tuple[float, float], ...]:
    """Jobs are shared by the consecutive nodes of a pod: they start, run and end together."""
    pod = node // config.nodes_per_job_pod
    r = rng(config.seed, Stream.JOBS, pod)
    jobs = []
    t = -float(r.uniform(0.0, _JOB_MEDIAN_S))  # the fleet is already busy when the clock starts
    while t < config.horizon_s:
        end = t + _lognormal(r, _JOB_MEDIAN_S, _JOB_SIGMA)
        jobs.append((t, end))
        t = end + _lognormal(r, _GAP_MEDIAN_S, _GAP_SIGMA)
    return tuple(jobs)


def _overlaps(f: ScheduledFailure, s: ScheduledFailure) -> bool:
    same_target = f.gpu is None or s.gpu is None or f.gpu == s.gpu
    return same_target and f.precursor_start_s < s.return_s and s.precursor_start_s < f.return_s


def node_schedule(config: FleetConfig, node: int, scenarios: Iterable[Scenario] = ()) -> NodeSchedule:
    """Each target (the node, each GPU, the reloads) draws from its own stream, so what happens
    before any moment does not depend on the horizon: a longer run extends a shorter one."""
    accel = config.acceleration if config.failures else 0.0
    horizon = config.horizon_s
    node_specs = [m for m in MODES if m.level is Level.NODE]
    gpu_specs = [m for m in MODES if m.level is Level.GPU]
    world = config.world
    frailty = node_frailty(config, node)

    def refaults(key: int) -> np.random.Generator | None:  # a stream per target, only when the world has them
        return rng(config.seed, Stream.HISTORY, node, 1 + key) if world.refault_p > 0 else None

    node_level = _arrivals(
        rng(config.seed, Stream.SCHEDULE, node, 0), node_specs, world, accel, horizon, (), (node, None),
        config.mode_factor, frailty, refaults(0),
    )  # fmt: skip
    blocked = [(f.fail_s, f.return_s) for f in node_level]
    failures = list(node_level)
    for gpu in range(config.gpus_per_node):
        r = rng(config.seed, Stream.SCHEDULE, node, 1 + gpu)
        gpu_level = _arrivals(
            r, gpu_specs, world, accel, horizon, blocked, (node, gpu), config.mode_factor, frailty,
            refaults(1 + gpu),
        )  # fmt: skip
        failures.extend(gpu_level)
    aborted = _aborted(config, node, node_specs, None) if config.confounders else []
    for gpu in range(config.gpus_per_node if config.confounders else 0):
        aborted.extend(_aborted(config, node, gpu_specs, gpu))

    scripted = []
    for s in scenarios:
        if s.node != node:
            continue
        spec = BY_NAME[s.mode]
        lead = 0.0 if not spec.predictable else (spec.lead_median_s if s.lead_s is None else s.lead_s)
        xid = spec.xids[0][0]
        draws = tuple(
            float(u) for u in rng(config.seed, Stream.SCHEDULE, node, 20_000, round(s.fail_s)).random(6)
        )
        scripted.append(
            ScheduledFailure(
                node,
                s.gpu,
                s.mode,
                s.fail_s,
                min(lead, s.fail_s),
                s.strength,
                spec.downtime_median_s,
                xid,
                scripted=True,
                draws=draws,
            )
        )
    # A rack burst's or a scripted failure wins over random ones that would overlap it on the same target.
    bursts = _rack_bursts(config, node)
    failures = [f for f in failures if not any(_overlaps(f, b) for b in bursts)] + bursts
    failures = [f for f in failures if not any(_overlaps(f, s) for s in scripted)] + scripted
    failures.sort(key=lambda f: (f.fail_s, -1 if f.gpu is None else f.gpu))

    reloads: list[float] = []
    per_day = world.driver_reloads_per_node_day
    if config.confounders and per_day > 0:
        r = rng(config.seed, Stream.SCHEDULE, node, 10_000)
        t = float(r.exponential(86_400.0 / per_day))
        while t < horizon:
            reloads.append(t)
            t += float(r.exponential(86_400.0 / per_day))
    aborted.sort(key=lambda f: (f.fail_s, -1 if f.gpu is None else f.gpu))
    return NodeSchedule(node, tuple(failures), tuple(reloads), _jobs(config, node), tuple(aborted))


def _rack_bursts(config: FleetConfig, node: int) -> list[ScheduledFailure]:
    """The node's failures in its rack's cooling bursts (World.rack_bursts_per_rack_year): the rack's
    events and which of its nodes each fails, and on which GPU, within a minute, come from one stream per
    rack, drawn for every slot whatever node asks; the failure itself from the node's own."""
    world = config.world
    rate = world.rack_bursts_per_rack_year / 365.25 * (config.acceleration if config.failures else 0.0)
    if rate <= 0:
        return []
    per_rack = config.nodes_per_rack
    r = rng(config.seed, Stream.HISTORY, 2_000_000 + node // per_rack)
    spec = BY_NAME["cooling"]
    out: list[ScheduledFailure] = []
    t, event = float(r.exponential(86_400.0 / rate)), 0
    while t < config.horizon_s:
        hit, gpus = r.random(per_rack), r.integers(config.gpus_per_node, size=per_rack)
        after = r.uniform(0.0, 60.0, per_rack)
        slot = node % per_rack
        if hit[slot] < world.rack_burst_node_p:
            target, fail_s = (node, int(gpus[slot])), t + float(after[slot])
            own = rng(config.seed, Stream.HISTORY, node, 40_000 + event)
            failure = _draw(own, spec, world, target, fail_s, 0.0)
            if not any(_overlaps(failure, f) for f in out):
                out.append(failure)
        t, event = t + float(r.exponential(86_400.0 / rate)), event + 1
    return out


def _aborted(
    config: FleetConfig, node: int, specs: Sequence[ModeSpec], gpu: int | None
) -> list[ScheduledFailure]:
    """Degradations of one GPU (or the node) that stop without a failure: the same precursors, at
    `aborted_per_precursor` times the real (unaccelerated) rate of the failures that carry one.
    Acceleration multiplies failures, not healthy hardware's look-alikes: an accelerated twin
    flatters precision, which is why false alarms are measured on a world at acceleration 1."""
    world = config.world
    key = 30_000 + (0 if gpu is None else 1 + gpu)
    r = rng(config.seed, Stream.SCHEDULE, node, key)
    rates = np.array(
        [
            s.rate_per_day * world.rate_scale(s.name) / 86_400.0
            * s.precursor_probability(world) * world.aborted_per_precursor
            for s in specs
        ]
    )  # fmt: skip
    total = float(rates.sum())
    out: list[ScheduledFailure] = []
    t = 0.0
    while total > 0:
        t += float(r.exponential(1.0 / total))
        if t >= config.horizon_s:
            break
        spec = specs[int(r.choice(len(specs), p=rates / total))]
        out.append(_draw(r, spec, world, (node, gpu), t, 0.0, aborted=True))
    return out


def in_windows(times: np.ndarray, windows: Sequence[tuple[float, float]]) -> np.ndarray:
    """Boolean mask of `times` inside any [start, end) window."""
    mask = np.zeros(times.shape, dtype=bool)
    for start, end in windows:
        if end > times[0] and start <= times[-1]:
            mask |= (times >= start) & (times < end)
    return mask
