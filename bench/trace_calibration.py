"""The twin calibrated to StepFun's InfiniteHBD fault trace, measured as the trace is (docs/fault-trace.md).

    nice -n 10 .venv/bin/python -m bench.trace_calibration [--seeds 5]

Draws the failure schedule alone (no telemetry) of a 400-node fleet over the trace's 348 days, at
acceleration 1, in the median world (today's twin) and in the trace-calibrated world
(faultcast.sim.world.trace_calibrated), each over several fleet seeds, and prints the statistics
bench/fault_trace.py prints for the trace beside the trace's own: faults, the share on the most-faulted
tenth of the servers, the negative-binomial shape k, faults followed by another on the same server within 7
days of their start (and what per-server hazard alone would give), repair quartiles, servers down at once
and faults starting within 60 s of another's start (and the largest such burst); the calibrated world with
and without rack bursts (TRACE_BURSTS). Each row is the mean over the seeds, with the range in brackets.
About 5 s a seed and world on one core.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np

from faultcast.sim.config import FleetConfig
from faultcast.sim.fault_trace import (
    FLEET_SERVERS,
    TraceStatistics,
    load_trace,
    trace_statistics,
    twin_faults,
)
from faultcast.sim.world import TRACE_BURSTS, TRACE_CALIBRATION, World, trace_calibrated

TRACE_DAYS = 348.0
_COLUMNS: tuple[tuple[str, str, Callable[[TraceStatistics], float]], ...] = (
    ("faults", "{:.0f}", lambda s: s.faults),
    ("top-10% share %", "{:.1f}", lambda s: 100 * s.top_share),
    ("k", "{:.2f}", lambda s: s.dispersion_k),
    ("within 7 d %", "{:.1f}", lambda s: 100 * s.followed_share),
    ("hazard only %", "{:.1f}", lambda s: 100 * s.followed_share_hazard_only),
    ("repair p25 h", "{:.2f}", lambda s: s.repair_hours.p25),
    ("median h", "{:.1f}", lambda s: s.repair_hours.p50),
    ("p75 h", "{:.1f}", lambda s: s.repair_hours.p75),
    ("p90 h", "{:.0f}", lambda s: s.repair_hours.p90),
    ("down mean", "{:.2f}", lambda s: s.down_mean),
    ("down p99", "{:.0f}", lambda s: s.down_p99),
    ("within 60 s of another", "{:.1f}", lambda s: s.faults_after_another),
    ("largest burst", "{:.1f}", lambda s: s.largest_burst),
)


def twin_statistics(world: World, seeds: Sequence[int], nodes: int = FLEET_SERVERS) -> list[TraceStatistics]:
    """The trace's statistics of the twin's failure schedule in `world`, one per fleet seed."""
    return [
        trace_statistics(twin_faults(FleetConfig(nodes=nodes, days=TRACE_DAYS, seed=seed, world=world)))
        for seed in seeds
    ]


def _row(name: str, runs: Sequence[TraceStatistics]) -> str:
    cells = []
    for _, fmt, get in _COLUMNS:
        values = np.array([get(s) for s in runs], dtype=float)
        cell = fmt.format(values.mean())
        if len(runs) > 1:
            cell += f" [{fmt.format(values.min())}-{fmt.format(values.max())}]"
        cells.append(cell)
    return f"| {name} | " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="fleet seeds per world (default 5)")
    args = parser.parse_args(argv)
    seeds = range(1, args.seeds + 1)
    print(f"{FLEET_SERVERS} nodes x {TRACE_DAYS:g} days, acceleration 1, fleet seeds {list(seeds)}")
    print(f"calibration: {TRACE_CALIBRATION}, rack bursts: {TRACE_BURSTS}")
    print("| | " + " | ".join(name for name, _, _ in _COLUMNS) + " |")
    print("| --- " * (len(_COLUMNS) + 1) + "|")
    print(_row("InfiniteHBD trace", [trace_statistics(load_trace())]))
    print(_row("twin, median world", twin_statistics(World(), seeds)))
    print(_row("twin, trace-calibrated", twin_statistics(trace_calibrated(), seeds)))
    print(
        _row("twin, trace-calibrated with rack bursts", twin_statistics(trace_calibrated(bursts=True), seeds))
    )


if __name__ == "__main__":
    main()
