"""StepFun's InfiniteHBD fault trace replayed through the goodput twin and the remediation policy.

    nice -n 10 .venv/bin/python -m bench.trace_replay --replay out/calib/goodput/replay-KEY.json

The trace's 400 servers are one job's 400 nodes (3,200 GPUs, 8 a node) for the trace's 349 days, and its
584 faults are the job's failures, each at its start, out for its own repair (docs/fault-trace.md). A
fault's alert is drawn as the goodput twin draws it (goodput/process.py): from the model's replay on twin
telemetry (`--replay`, the replay JSON that `faultcast goodput --cache DIR` writes), a replayed failure of
the same mode; each fault's mode is the twin mode its component and description name (`trace_mode`), and
the Other Failure verdicts (unknown errors, stress tests) and software faults are `software`, which no alert
foresees. Prints:

(a) goodput: the study's policies (goodput/study.py `evaluate`: periodic checkpoints, + faultcast, the
    oracle) on the trace's faults, with the study's default 2 % of spare nodes and with `--spares`, over
    replications that redraw only which replayed failure stands in for each fault and when the false alarms
    come;
(b) the warm pool: for pools of N spares, how many faults find all N out (each spare replaces a server in
    repair) and the share of time with more than N servers out, the ETTR of policies (a) and (b') with N
    spares; beside the first two for the trace-calibrated twin's (with and without rack bursts) and the
    median twin's failure schedules;
(c) the circuit breaker (bench/fault_trace.py `breaker_refusals`, the service's default): refusals if
    every fault start asked for a drain, and if only the alerts did (the foreseen faults at their alert
    times, the false alarms on random servers) at the sweep's threshold, the model's and the lowest.

Takes under a minute once the replay exists; making one (`faultcast goodput --cache out/calib/goodput`,
the shipped model on a fresh 64-node twin) takes about five minutes on this machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.fault_trace import breaker_refusals
from faultcast.goodput.engine import JobCosts, Policy, simulate
from faultcast.goodput.process import GPUS_PER_NODE, AlertSample, Draw, scenario
from faultcast.goodput.replay import Replay
from faultcast.goodput.study import Evaluation, Job, evaluate, interval_for, tuned_policy
from faultcast.sim.config import FleetConfig
from faultcast.sim.fault_trace import Fault, FaultTrace, load_trace, twin_faults
from faultcast.sim.world import World, trace_calibrated

_DAY_S = 86_400.0
# The goodput twin's default costs (docs/goodput.md, `faultcast goodput` without flags).
COSTS = JobCosts(
    checkpoint_s=30.0, snapshot_s=30.0, detect_s=300.0, restart_s=300.0, migrate_s=300.0, react_s=10.0,
    drain_s=4 * 3600.0,
)  # fmt: skip
POOLS = (2, 4, 8, 16, 24, 32)
# A GPU fault's description names the twin's mode; the first key found in it wins.
_GPU_MODES = (
    ("ECC", "hbm_wear"),
    ("PCI link width", "pcie"),
    ("P2P Bandwidth", "nvlink"),
    ("Temperature", "cooling"),
    ("Silent Data", "silent_data_corruption"),
    ("nvidia-smi Timeout", "firmware"),
)
_COMPONENT_MODES = {
    "Fan": "cooling",
    "Parameter Plane Cable": "infiniband",
    "NIC": "infiniband",
}


def trace_mode(f: Fault) -> str:
    """The twin mode a trace fault stands for: GPU faults by description (lost, unknown and Xid errors are
    detachments), fans as cooling, cables and NICs as InfiniBand, the rest of the hardware (power supplies,
    boards, CPUs) as host faults, and software faults and operations' verdicts as software."""
    if f.level != "Hardware Failure":
        return "software"
    if f.component == "GPU":
        return next((mode for key, mode in _GPU_MODES if key in f.description), "detachment")
    return _COMPONENT_MODES.get(f.component, "host")


def trace_draw(trace: FaultTrace, rng: np.random.Generator) -> Draw:
    """The trace's faults as one replication of the goodput twin: fixed times, modes and repairs; random
    picks of the replayed failure that stands in for each and false-alarm gaps."""
    faults = trace.faults
    return Draw(
        times_s=np.array([f.start_day * _DAY_S for f in faults]),
        modes=[trace_mode(f) for f in faults],
        picks=rng.uniform(0.0, 1.0, len(faults)),
        repairs_s=np.array([f.repair_hours * 3600.0 for f in faults]),
        unit_gaps=rng.exponential(1.0, 64),
    )


def trace_rates(trace: FaultTrace, days: float) -> dict[str, float]:
    """Faults per GPU-day by mode over the trace."""
    gpus = trace.fleet_servers * GPUS_PER_NODE
    return {mode: n / (gpus * days) for mode, n in Counter(trace_mode(f) for f in trace.faults).items()}


def pool_dry(trace: FaultTrace, pool: int, days: float) -> tuple[int, float]:
    """Faults that find `pool` spares all taken (at least `pool` other servers in repair at their start),
    and the share of [0, days] with more than `pool` servers in repair."""
    spans = [(f.start_day, f.end_day, f.server) for f in trace.faults]
    dry = sum(
        len({s for a, b, s in spans if a <= f.start_day < b and s != f.server}) >= pool for f in trace.faults
    )
    edges = sorted({0.0, days, *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
    short = 0.0
    for lo, hi in itertools.pairwise(edges):
        if hi > days:
            break
        if len({s for a, b, s in spans if a <= lo < b}) > pool:
            short += hi - lo
    return dry, short / days


def _goodput(ev: Evaluation, job: Job) -> None:
    print(f"(a) goodput: {job.gpus} GPUs x {job.days:g} days, {job.spares} spares, the study's default costs")
    print(
        f"  recommended threshold {ev.best.threshold:.3f}, foreseen share {100 * ev.best.foreseen_share:.1f} %"
    )
    print(
        "  | policy | ETTR | crashes | averted | migrations | false-alarm migrations | waits for a spare, h |"
    )
    print("  | --- | --- | --- | --- | --- | --- | --- |")
    for r in ev.results:
        print(
            f"  | {r.label} | {100 * r.ettr:.2f} % (sd {100 * r.sd(lambda o: o.ettr):.2f}) | "
            f"{r.mean(lambda o: o.crashes):.1f} | {r.mean(lambda o: o.averted):.1f} | "
            f"{r.mean(lambda o: o.migrations):.1f} | {r.mean(lambda o: o.false_alarm_migrations):.1f} | "
            f"{r.mean(lambda o: o.spare_wait_s) / 3600:,.0f} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replay", type=Path, required=True, help="a replay JSON from `faultcast goodput`")
    parser.add_argument("--replications", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--spares",
        type=int,
        default=40,
        help="spares of the second goodput run (the first: 2%% of the nodes)",
    )
    args = parser.parse_args(argv)
    replay = Replay.from_json(json.loads(args.replay.read_text()))
    trace = load_trace()
    days = float(np.ceil(max(f.end_day for f in trace.faults)))
    gpus = trace.fleet_servers * GPUS_PER_NODE
    rng = np.random.default_rng(args.seed)
    runs = [trace_draw(trace, rng) for _ in range(args.replications)]
    rates = trace_rates(trace, days)
    print(
        f"trace: {len(trace.faults)} faults, modes {dict(Counter(trace_mode(f) for f in trace.faults).most_common())}"
    )
    print(
        f"replay: {args.replay} ({replay.failures} failures on {replay.gpu_days:,.0f} GPU-days, "
        f"model threshold {replay.model_threshold:.3f})"
    )
    evaluations = []
    for spares in (max(1, round(0.02 * trace.fleet_servers)), args.spares):  # the study's default, and more
        job = Job(gpus, days, COSTS, spares)
        evaluations.append(evaluate(job, rates, replay, runs, args.replications, min(3, args.replications)))
        _goodput(evaluations[-1], job)
    ev = evaluations[-1]

    print("(b) warm pool: faults that find every spare out; time with more servers out than spares")
    twins = {
        "trace-calibrated twin": twin_faults(
            FleetConfig(nodes=400, days=days, seed=1, world=trace_calibrated())
        ),
        "calibrated twin with rack bursts": twin_faults(
            FleetConfig(nodes=400, days=days, seed=1, world=trace_calibrated(bursts=True))
        ),
        "median twin": twin_faults(FleetConfig(nodes=400, days=days, seed=1, world=World())),
    }
    alerts = replay.at(ev.best.threshold)
    policies = {"(a)": Policy("a", interval_for(job, rates, 0.0), False)}
    policies["(b')"] = tuned_policy(job, rates, ev.best.foreseen_share)
    print(
        "  | spares | trace: faults finding every spare out | trace: time with more out | "
        + " | ".join(f"ETTR {name}" for name in policies)
        + " | "
        + " | ".join(f"{name}: faults finding every spare out, time with more out" for name in twins)
        + " |"
    )
    print("  | --- " * (3 + len(policies) + len(twins)) + "|")
    for pool in POOLS:
        dry, short = pool_dry(trace, pool, days)
        ettr = [
            np.mean([simulate(scenario(d, alerts, gpus, days), policy, COSTS, pool).ettr for d in runs])
            for policy in policies.values()
        ]
        cells = [
            f"{n} ({100 * n / len(t.faults):.1f} %), {100 * s:.1f} %"
            for t in twins.values()
            for n, s in [pool_dry(t, pool, days)]
        ]
        print(
            f"  | {pool} | {dry} ({100 * dry / len(trace.faults):.1f} %) | {100 * short:.1f} % | "
            + " | ".join(f"{100 * e:.2f} %" for e in ettr)
            + " | "
            + " | ".join(cells)
            + " |"
        )

    print("(c) circuit breaker (the service's default), refusals")
    every, days_every = breaker_refusals((f.server, f.start_day * _DAY_S) for f in trace.faults)
    print(f"  a drain at every fault start: {every} refused, on days {days_every}")
    for threshold in sorted({ev.best.threshold, replay.model_threshold, replay.samples[0].threshold}):
        _alert_drains(trace, replay.at(threshold), runs, gpus, days)


def _alert_drains(
    trace: FaultTrace, alerts: AlertSample, runs: Sequence[Draw], gpus: int, days: float
) -> None:
    """The breaker asked to drain only on alerts: each foreseen fault's server at its alert, each false alarm
    a server drawn at random (not one of the trace's: those fail; the breaker counts distinct nodes)."""
    refused, drains_per_run = [], []
    for d in runs:
        s = scenario(d, alerts, gpus, days)
        drains = [
            (f.server, a.alert_s)
            for f, a in zip(trace.faults, s.failures, strict=True)
            if a.alert_s is not None
        ]
        pick = np.random.default_rng(int(d.unit_gaps.sum() * 1e6) % 2**32)
        drains += [(f"healthy-{int(pick.integers(trace.fleet_servers))}", t) for t in s.false_alarms]
        refused.append(breaker_refusals(drains)[0])
        drains_per_run.append(len(drains))
    print(
        f"  drains only on alerts at threshold {alerts.threshold:.3f} "
        f"({1000 * alerts.false_alarms_per_gpu_day:.2f} false alarms per 1,000 GPU-days): "
        f"{np.mean(refused):.1f} refused of {np.mean(drains_per_run):.1f} drains, mean over {len(runs)} "
        "replications"
    )


if __name__ == "__main__":
    main()
