"""The statistics of StepFun's InfiniteHBD fault trace (sim/traces/), as docs/fault-trace.md reports them.

    .venv/bin/python -m bench.fault_trace

Prints the trace's concentration, per-server dispersion, recurrence, repair times, servers down at once
and bursts (faultcast.sim.fault_trace.trace_statistics); how the recurrence and burst figures move with
the window that defines them; the figures for each fault level alone; faults by month; and what the
service's default circuit breaker would refuse if every fault start asked for a drain. Reads only the
shipped file; takes under a second.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from scipy import stats

from faultcast.service.config import ServiceConfig
from faultcast.sim.fault_trace import (
    Fault,
    FaultTrace,
    Quantiles,
    TraceStatistics,
    load_trace,
    trace_statistics,
)


def _q(q: Quantiles, unit: str) -> str:
    return f"p10 {q.p10:.2f}  p25 {q.p25:.2f}  median {q.p50:.2f}  p75 {q.p75:.2f}  p90 {q.p90:.2f} {unit}"


def _top_share_limit(dist: stats.rv_discrete, fraction: float = 0.1) -> float:
    """The share of faults on the most-faulted `fraction` of a large fleet whose per-server counts follow
    `dist` (a scipy discrete distribution): the upper tail of its pmf, weighted by count, over the mean."""
    counts = np.arange(0, 1000)
    pmf = dist.pmf(counts)
    left, carried = fraction, 0.0
    for x in counts[::-1]:
        take = min(float(pmf[x]), left)
        carried += take * float(x)
        left -= take
    return carried / float((counts * pmf).sum())


def _report(s: TraceStatistics) -> None:
    print(
        f"fleet servers            {s.fleet_servers} (the source's figure; {s.servers_with_faults} have faults)"
    )
    print(f"faults                   {s.faults}")
    print(f"window                   day {s.first_start_day:.4f} (first start) to day {s.last_event_day:.4f}")
    print(
        f"rate                     {s.faults / s.fleet_servers / s.last_event_day * 365:.3f} faults a server-year"
    )
    print("concentration")
    print(f"  top {s.top_servers} of {s.fleet_servers} servers   {100 * s.top_share:.1f} % of faults")
    faulted = f"top {s.top_servers_of_faulted} of {s.servers_with_faults} faulted"
    print(f"  {faulted:<22} {100 * s.top_share_of_faulted:.1f} % of faults")
    print(f"  servers by fault count {dict(enumerate(s.servers_by_count))}")
    print(f"  count mean, variance   {s.count_mean:.3f}, {s.count_variance:.3f}")
    print(
        f"  negative binomial k    {s.dispersion_k:.3f} (maximum likelihood), {s.dispersion_k_moments:.3f} (moments)"
    )
    print(f"  hazard CV 1/sqrt(k)    {s.dispersion_k**-0.5:.2f}")
    same = _top_share_limit(stats.poisson(s.count_mean))
    frail = _top_share_limit(stats.nbinom(s.dispersion_k, s.dispersion_k / (s.dispersion_k + s.count_mean)))
    print(
        f"  top 10 % share if      one hazard for all {100 * same:.1f} %, gamma hazards of shape k {100 * frail:.1f} %"
    )
    print(f"recurrence (next fault on the same server within {s.follow_days:g} days)")
    print(f"  of the fault's start   {s.followed} faults, {100 * s.followed_share:.1f} %")
    print(
        f"  of its repair          {s.followed_after_repair} faults, {100 * s.followed_after_repair_share:.1f} %"
    )
    print(f"  per-server hazard only {100 * s.followed_share_hazard_only:.1f} % expected")
    print(f"  same component         {s.followed_same_component} of the {s.followed}")
    print(f"  start to next start    {_q(s.recurrence_days, 'days')}")
    print(f"  repair to next start   {_q(s.uptime_days, 'days')}")
    print("repair")
    print(f"  hours                  {_q(s.repair_hours, 'h')}")
    print(f"  mean, longest          {s.repair_mean_hours:.1f} h, {s.repair_max_hours:.1f} h")
    print(f"  zero-length            {s.zero_repairs} faults")
    # A lognormal's interquartile range spans 2 * 0.6745 sigma in log space.
    sigma = math.log(s.repair_hours.p75 / s.repair_hours.p25) / (2 * 0.6745)
    print(f"  lognormal sigma        {sigma:.2f} (from the interquartile range)")
    print("servers in repair at once (weighted by time)")
    print(f"  mean, p99, most        {s.down_mean:.2f}, {s.down_p99}, {s.down_max}")
    print(f"bursts (starts within {s.burst_seconds:g} s of another, any server)")
    print(
        f"  after another          {s.faults_after_another} faults ({s.expected_after_another_uniform:.2f} if uniform)"
    )
    print(
        f"  near another           {s.faults_in_bursts} faults, in {s.bursts} bursts, largest {s.largest_burst}"
    )
    print(f"  by component           {dict(s.burst_components)}")


def _windows(trace: FaultTrace) -> None:
    follow = []
    for days in (1.0, 7.0, 30.0):
        s = trace_statistics(trace, follow_days=days)
        follow.append(
            f"{days:g} d: {100 * s.followed_share:.1f} % ({100 * s.followed_share_hazard_only:.1f} % hazard only)"
        )
    print("recurrence by window     " + ",  ".join(follow))
    bursts = [
        f"{sec:g} s: {trace_statistics(trace, burst_seconds=sec).faults_after_another}"
        for sec in (10, 60, 600, 3600)
    ]
    print("after another by window  " + ",  ".join(bursts))


def breaker_refusals(drains: Iterable[tuple[str, float]]) -> tuple[int, list[float]]:
    """The service's default circuit breaker asked to drain each (server, time in seconds), in time order:
    how many it refuses, and the days (to 0.1) of the refusals."""
    breaker = ServiceConfig().breaker()
    refused = {
        round(t / 86_400.0, 1)
        for server, t in sorted(drains, key=lambda d: d[1])
        if not breaker.allow(server, t)
    }
    return breaker.tripped, sorted(refused)


def _breaker(trace: FaultTrace) -> None:
    """The service's default circuit breaker asked to drain each fault's server as the fault starts: an
    upper bound on what it would refuse, since alerts come before faults and not for every one."""
    config = ServiceConfig()
    print(
        f"breaker ({config.max_drains} nodes per {config.drain_window_s:g} s), a drain at every fault start"
    )
    for level in (None, "Hardware Failure"):
        tripped, days = breaker_refusals(
            (f.server, f.start_day * 86_400.0) for f in trace.faults if level is None or f.level == level
        )
        print(f"  {level or 'all faults'}: {tripped} refused, on days {days}")


def _episodes(trace: FaultTrace, days: float = 7.0) -> None:
    """Per-server dispersion with recurrence taken out: only faults starting more than `days` after the
    server's previous fault count (recurrences inflate the count variance that frailty alone would fit)."""
    print(f"episodes (a server's faults more than {days:g} d after its previous one)")
    for level in (None, "Hardware Failure"):
        kept: list[Fault] = []
        for faults in trace.by_server().values():
            mine = [f for f in faults if level is None or f.level == level]
            kept += [f for i, f in enumerate(mine) if i == 0 or f.start_day - mine[i - 1].start_day > days]
        s = trace_statistics(FaultTrace(tuple(sorted(kept, key=lambda f: f.start_day)), trace.fleet_servers))
        print(
            f"  {level or 'all faults':<22} {s.faults} episodes, k {s.dispersion_k:.2f}, "
            f"top-10% share {100 * s.top_share:.1f} %"
        )


def _by_month(trace: FaultTrace) -> None:
    """Faults per 30 days of the window: is the fleet's rate steady?"""
    months = np.bincount([int(f.start_day // 30) for f in trace.faults]).tolist()
    print(f"faults per 30 days       {months}")


def _by_level(trace: FaultTrace) -> None:
    """The figures again for each level alone: the twin's modes are hardware faults, while Other Failure holds
    unknown errors and failed stress tests, which batch operations may cause."""
    print(
        "by level                 faults  top-10% share  k      within 7 d (hazard only)  median repair  after another"
    )
    for level in ("Hardware Failure", "Other Failure", "Software Failure"):
        part = FaultTrace(tuple(f for f in trace.faults if f.level == level), trace.fleet_servers)
        s = trace_statistics(part)
        print(
            f"  {level:<22} {s.faults:>6}  {100 * s.top_share:>12.1f} %  {s.dispersion_k:<5.2f}  "
            f"{100 * s.followed_share:>5.1f} % ({100 * s.followed_share_hazard_only:>4.1f} %)"
            f"{s.repair_hours.p50:>18.1f} h  {s.faults_after_another:>13}"
        )


def _repair_by_level(trace: FaultTrace) -> None:
    by_level: dict[str, list[float]] = defaultdict(list)
    for f in trace.faults:
        by_level[f.level].append(f.repair_hours)
    print("repair by level")
    for level, hours in sorted(by_level.items(), key=lambda kv: -len(kv[1])):
        p25, p50, p75 = np.percentile(hours, [25, 50, 75])
        print(f"  {level:<22} {len(hours):>3} faults, median {p50:.1f} h (p25 {p25:.1f}, p75 {p75:.1f})")


def main() -> None:
    trace = load_trace()
    _report(trace_statistics(trace))
    _windows(trace)
    _repair_by_level(trace)
    _by_level(trace)
    _by_month(trace)
    _episodes(trace)
    _breaker(trace)


if __name__ == "__main__":
    main()
