"""StepFun's InfiniteHBD fault trace (sim/traces/, see its README): its faults, and the statistics of how real
faults concentrate on servers, recur, take time to repair and arrive in bursts, which the twin is calibrated to."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np

from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import node_schedule

TRACE_FILE = "infinitehbd_faults.json"
STATISTICS_FILE = "infinitehbd_fault_statistics.json"
# The source's fleet: 400 servers, of which only those with a fault appear in the file.
FLEET_SERVERS = 400
# event_time is in days with at most four decimals: times are known to 8.64 s.
RESOLUTION_DAYS = 1e-4
_SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Fault:
    """One fault: the server was unavailable from start_day to end_day (days since the trace's origin)."""

    server: str  # the trace's node_id, an anonymised UUID
    start_day: float
    end_day: float
    level: str  # Hardware Failure, Software Failure or Other Failure
    component: str  # the trace's Class: GPU, NIC, Fan, Stress Test Failure, ...
    description: str  # the trace's Desc: GPU xid Error, Link Down, ...

    @property
    def repair_hours(self) -> float:
        return (self.end_day - self.start_day) * 24.0


@dataclass(frozen=True)
class FaultTrace:
    """Faults ordered by start (ties by server), and the size of the fleet they were drawn from."""

    faults: tuple[Fault, ...]
    fleet_servers: int

    def servers_with_faults(self) -> int:
        return len({f.server for f in self.faults})

    def by_server(self) -> dict[str, list[Fault]]:
        """Each server's faults in order of start."""
        out: dict[str, list[Fault]] = defaultdict(list)
        for f in self.faults:
            out[f.server].append(f)
        return dict(out)


@dataclass(frozen=True)
class Quantiles:
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float

    @staticmethod
    def of(values: Sequence[float]) -> Quantiles:
        if not values:
            return Quantiles(math.nan, math.nan, math.nan, math.nan, math.nan)
        p = np.percentile(np.asarray(values, dtype=float), [10, 25, 50, 75, 90])
        return Quantiles(*(float(v) for v in p))


@dataclass(frozen=True)
class TraceStatistics:
    """What the trace says, measured from its faults; every share is of all faults unless named otherwise."""

    fleet_servers: int
    servers_with_faults: int
    faults: int
    first_start_day: float
    last_event_day: float
    # Concentration: the share of faults on the most-faulted top_fraction of the fleet (and of the faulted servers).
    top_servers: int
    top_share: float
    top_servers_of_faulted: int
    top_share_of_faulted: float
    # Per-server fault counts: servers_by_count[n] servers had n faults (servers without faults included).
    servers_by_count: tuple[int, ...]
    count_mean: float
    count_variance: float
    # The gamma-mixed Poisson (negative binomial) shape k of the counts: the servers' hazards vary with
    # coefficient of variation 1/sqrt(k). inf when the counts are not over-dispersed.
    dispersion_k: float
    dispersion_k_moments: float
    # Recurrence: faults followed by another on the same server starting within follow_days of this one's start,
    # within follow_days of this one's repair, and the share expected if each server kept its count but its
    # faults fell uniformly over the window (per-server hazard alone, no recurrence).
    follow_days: float
    followed: int
    followed_share: float
    followed_after_repair: int
    followed_after_repair_share: float
    followed_share_hazard_only: float
    followed_same_component: int
    recurrence_days: Quantiles  # start to the next start on the same server
    uptime_days: Quantiles  # repair to the next start on the same server
    # Repairs.
    repair_hours: Quantiles
    repair_mean_hours: float
    repair_max_hours: float
    zero_repairs: int
    # Bursts: faults starting within burst_seconds of another's start, on any server.
    burst_seconds: float
    faults_after_another: int  # with an earlier (or simultaneous) start within burst_seconds
    faults_in_bursts: int  # with any other start within burst_seconds, before or after
    bursts: int  # chains of starts each within burst_seconds of the previous, two faults or more
    largest_burst: int
    expected_after_another_uniform: float  # if all starts fell uniformly over the window
    burst_components: tuple[tuple[str, int], ...]  # faults in bursts by component, most first
    # Servers in repair at once over [0, last_event_day] (a server with two faults open counts once):
    # the time-weighted mean, 99th percentile and most, what a warm pool of spares must cover.
    down_mean: float
    down_p99: int
    down_max: int


def trace_file(name: str = TRACE_FILE) -> Traversable:
    """A file of sim/traces: the installed package data, or the file beside this module's source when an
    editable install does not link the data (strict editable installs link only declared package data)."""
    packaged = resources.files("faultcast.sim") / "traces" / name
    if packaged.is_file():
        return packaged
    beside = Path(__file__).resolve().parent / "traces" / name
    if beside.is_file():
        return beside
    raise FileNotFoundError(f"{name}: neither in the package data of faultcast.sim nor at {beside}")


def load_trace() -> FaultTrace:
    """The shipped InfiniteHBD trace."""
    return parse_events(json.loads(trace_file().read_text(encoding="utf-8")), FLEET_SERVERS)


def parse_events(events: object, fleet_servers: int) -> FaultTrace:
    """Faults from the trace's events: each fault_end closes the earliest open fault_start on the same server
    with the same fault_type. ValueError for a malformed event, an end without a start or a start never ended."""
    if not isinstance(events, list):
        raise ValueError("the trace is not a JSON array of events")
    open_starts: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    faults: list[Fault] = []
    for i, event in enumerate(events):
        server, time, kind, level, component, description = _fields(i, event)
        key = (server, level, component, description)
        if kind == "fault_start":
            open_starts[key].append(time)
        elif not open_starts[key]:
            raise ValueError(f"event {i}: fault_end on {server} with no open fault_start of its type")
        else:
            start = open_starts[key].pop(0)
            if time < start:
                raise ValueError(f"event {i}: fault_end at day {time} before its start at day {start}")
            faults.append(Fault(server, start, time, level, component, description))
    unended = sum(len(v) for v in open_starts.values())
    if unended:
        raise ValueError(f"{unended} fault_start events never end")
    servers = len({f.server for f in faults})
    if servers > fleet_servers:
        raise ValueError(f"{servers} servers have faults, more than the fleet's {fleet_servers}")
    faults.sort(key=lambda f: (f.start_day, f.server))
    return FaultTrace(tuple(faults), fleet_servers)


def _fields(i: int, event: object) -> tuple[str, float, str, str, str, str]:
    if not isinstance(event, dict):
        raise ValueError(f"event {i}: not an object")
    kind = event.get("event_type")
    time = event.get("event_time")
    server = event.get("node_id")
    ftype = event.get("fault_type")
    if kind not in ("fault_start", "fault_end"):
        raise ValueError(f"event {i}: event_type {kind!r}")
    if not isinstance(time, int | float) or isinstance(time, bool) or not math.isfinite(time):
        raise ValueError(f"event {i}: event_time {time!r}")
    if not isinstance(server, str) or not isinstance(ftype, dict):
        raise ValueError(f"event {i}: node_id or fault_type missing")
    names = [ftype.get(k) for k in ("Level", "Class", "Desc")]
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"event {i}: fault_type needs Level, Class and Desc strings")
    return server, float(time), kind, str(names[0]), str(names[1]), str(names[2])


def trace_statistics(
    trace: FaultTrace, *, top_fraction: float = 0.1, follow_days: float = 7.0, burst_seconds: float = 60.0
) -> TraceStatistics:
    """The trace's concentration, recurrence, repair times and bursts (see TraceStatistics)."""
    faults = trace.faults
    n = len(faults)
    if n == 0:
        raise ValueError("the trace has no faults")
    per_server = trace.by_server()
    counts = sorted((len(v) for v in per_server.values()), reverse=True)
    all_counts = counts + [0] * (trace.fleet_servers - len(counts))
    top = math.ceil(top_fraction * trace.fleet_servers)
    top_faulted = math.ceil(top_fraction * len(counts))
    window = max(f.end_day for f in faults)

    followed = after_repair = same_component = 0
    recurrence: list[float] = []
    uptime: list[float] = []
    for series in per_server.values():
        for a, b in itertools.pairwise(series):
            recurrence.append(b.start_day - a.start_day)
            uptime.append(b.start_day - a.end_day)
            if _within(b.start_day - a.start_day, follow_days):
                followed += 1
                same_component += a.component == b.component
            after_repair += _within(b.start_day - a.end_day, follow_days)

    repairs = [f.repair_hours for f in faults]
    mean = float(np.mean(all_counts))
    variance = float(np.var(all_counts, ddof=1)) if len(all_counts) > 1 else 0.0
    bursts = _bursts(faults, burst_seconds / _SECONDS_PER_DAY)
    down_mean, down_p99, down_max = _down_servers(per_server, window)
    in_bursts = [f for b in bursts for f in b]
    return TraceStatistics(
        fleet_servers=trace.fleet_servers,
        servers_with_faults=len(counts),
        faults=n,
        first_start_day=faults[0].start_day,
        last_event_day=window,
        top_servers=top,
        top_share=sum(counts[:top]) / n,
        top_servers_of_faulted=top_faulted,
        top_share_of_faulted=sum(counts[:top_faulted]) / n,
        servers_by_count=tuple(np.bincount(all_counts).tolist()),
        count_mean=mean,
        count_variance=variance,
        dispersion_k=negative_binomial_k(all_counts),
        dispersion_k_moments=mean * mean / (variance - mean) if variance > mean else math.inf,
        follow_days=follow_days,
        followed=followed,
        followed_share=followed / n,
        followed_after_repair=after_repair,
        followed_after_repair_share=after_repair / n,
        followed_share_hazard_only=sum(_expected_close_gaps(c, follow_days, window) for c in counts) / n,
        followed_same_component=same_component,
        recurrence_days=Quantiles.of(recurrence),
        uptime_days=Quantiles.of(uptime),
        repair_hours=Quantiles.of(repairs),
        repair_mean_hours=float(np.mean(repairs)),
        repair_max_hours=max(repairs),
        zero_repairs=sum(r == 0.0 for r in repairs),
        burst_seconds=burst_seconds,
        faults_after_another=len(in_bursts) - len(bursts),
        faults_in_bursts=len(in_bursts),
        bursts=len(bursts),
        largest_burst=max((len(b) for b in bursts), default=0),
        expected_after_another_uniform=_expected_close_gaps(n, burst_seconds / _SECONDS_PER_DAY, window),
        burst_components=tuple(Counter(f.component for f in in_bursts).most_common()),
        down_mean=down_mean,
        down_p99=down_p99,
        down_max=down_max,
    )


def _within(gap_days: float, limit_days: float) -> bool:
    """gap <= limit, the gap counted in whole ticks of the trace's resolution: float noise in the
    difference of two times cannot move a gap across the limit."""
    return round(gap_days / RESOLUTION_DAYS) <= limit_days / RESOLUTION_DAYS + 1e-6


def _down_servers(per_server: dict[str, list[Fault]], window: float) -> tuple[float, int, int]:
    """How many servers are in repair at once over [0, window]: the time-weighted mean, 99th percentile
    and most."""
    steps: list[tuple[float, int]] = []
    for faults in per_server.values():
        for start, end in _merged((f.start_day, f.end_day) for f in faults):
            steps += [(start, 1), (end, -1)]
    steps.sort()  # at one instant a return (-1) sorts before a start: no false peak
    time_at: dict[int, float] = defaultdict(float)
    level, since = 0, 0.0
    for t, change in steps:
        time_at[level] += t - since
        level, since = level + change, t
    time_at[level] += window - since
    levels = sorted(time_at)
    cumulative = np.cumsum([time_at[n] for n in levels]) / window
    p99 = levels[min(int(np.searchsorted(cumulative, 0.99)), len(levels) - 1)]
    return sum(n * d for n, d in time_at.items()) / window, p99, max(n for n, d in time_at.items() if d > 0)


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping intervals joined."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _bursts(faults: Sequence[Fault], within_days: float) -> list[list[Fault]]:
    """Chains of faults (in order of start) each starting within within_days of the previous; two or more."""
    chains: list[list[Fault]] = [[faults[0]]]
    for prev, f in itertools.pairwise(faults):
        if _within(f.start_day - prev.start_day, within_days):
            chains[-1].append(f)
        else:
            chains.append([f])
    return [c for c in chains if len(c) > 1]


def _expected_close_gaps(points: int, within: float, window: float) -> float:
    """Expected number of consecutive gaps no longer than `within` among `points` times drawn uniformly over
    `window`: each of the points - 1 spacings is window * Beta(1, points)."""
    if points < 2:
        return 0.0
    return (points - 1) * (1.0 - (1.0 - min(within / window, 1.0)) ** points)


def negative_binomial_k(counts: Sequence[int]) -> float:
    """Maximum-likelihood shape k of a negative binomial fitted to counts (its mean is the sample mean);
    inf when the counts are not over-dispersed. Golden-section search on log k."""
    mean = float(np.mean(counts))
    if mean == 0.0 or float(np.var(counts)) <= mean:
        return math.inf
    histogram = Counter(counts)

    def loglik(log_k: float) -> float:
        return negative_binomial_loglik(histogram, math.exp(log_k), mean)

    lo, hi = math.log(1e-4), math.log(1e4)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loglik(a), loglik(b)
    while hi - lo > 1e-9:
        if fa >= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loglik(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loglik(b)
    return math.exp((lo + hi) / 2.0)


def negative_binomial_loglik(histogram: Counter[int], k: float, mean: float) -> float:
    """Log-likelihood of counts ({count: how often}) under a negative binomial of shape k and this mean,
    less the terms that do not depend on k."""
    p = mean / (k + mean)
    return math.fsum(
        often * (math.lgamma(x + k) - math.lgamma(k) + k * math.log1p(-p) + x * math.log(p))
        for x, often in histogram.items()
    )


_SOFTWARE_MODES = frozenset({"software", "nccl_timeout"})


def twin_faults(config: FleetConfig) -> FaultTrace:
    """The twin's failure schedule for `config` (no telemetry: seconds for 400 nodes over a year) in the
    trace's form, so that trace_statistics measures the twin as it measures the trace: a node is a server,
    each failure of it or its GPUs a fault from its start to its return, its mode the component."""
    faults = [
        Fault(
            config.node_name(node),
            f.fail_s / _SECONDS_PER_DAY,
            f.return_s / _SECONDS_PER_DAY,
            "Software Failure" if f.mode in _SOFTWARE_MODES else "Hardware Failure",
            f.mode,
            f.mode,
        )
        for node in range(config.nodes)
        for f in node_schedule(config, node).failures
    ]
    faults.sort(key=lambda f: (f.start_day, f.server))
    return FaultTrace(tuple(faults), config.nodes)
