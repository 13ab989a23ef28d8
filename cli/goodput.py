"""`faultcast goodput`: what predictive snapshot-and-migrate saves a job, against periodic
checkpoints alone and against an oracle, with the alert threshold that saves the most."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultcast.cli.types import Subcommands, duration
from faultcast.goodput.engine import JobCosts, Outcome
from faultcast.goodput.process import GPUS_PER_NODE, UNMODELLED, failure_rates, job_mtbf_s

if TYPE_CHECKING:  # the replay loads the model (LightGBM): only when the command runs
    from faultcast.goodput.replay import Replay
    from faultcast.goodput.study import Job, PolicyResult, SweepPoint
    from faultcast.model.artifact import FaultModel

log = logging.getLogger(__name__)
_DAY_S = 86_400.0


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast goodput` and its flags (job size, costs, replay twin, sweep) to `commands`."""
    p = commands.add_parser(
        "goodput",
        help="simulate a long training job: effective training time with and without faultcast",
        description=__doc__,
    )
    p.add_argument("--gpus", type=int, default=16_384, help="the job's GPUs (8 per node)")
    p.add_argument("--days", type=float, default=54.0, help="wall-clock days simulated")
    p.add_argument(
        "--model",
        type=Path,
        default=Path("out/demo-model"),
        help="the model whose alerts are replayed (the demo's is trained here if absent)",
    )
    p.add_argument(
        "--replay-data",
        type=Path,
        help="twin or imported telemetry to replay the model on (default: a fresh twin the model "
        "never saw, generated into --cache)",
    )
    p.add_argument("--twin-nodes", type=int, default=64, help="nodes of the generated replay twin")
    p.add_argument("--twin-days", type=float, default=4.0, help="days of the generated replay twin")
    p.add_argument(
        "--twin-acceleration",
        type=float,
        default=100.0,
        help="failure-rate multiplier of the replay twin (more failures to draw leads from)",
    )
    p.add_argument("--checkpoint", type=duration, default=30.0, help="a periodic checkpoint blocks this long")
    p.add_argument("--snapshot", type=duration, default=30.0, help="a predictive snapshot blocks this long")
    p.add_argument(
        "--detect",
        type=duration,
        default=300.0,
        help="a crash goes unnoticed this long (collective timeout, health checks)",
    )
    p.add_argument(
        "--restart",
        type=duration,
        default=300.0,
        help="after a crash: reschedule, re-initialise, load the checkpoint",
    )
    p.add_argument(
        "--migrate",
        type=duration,
        default=300.0,
        help="after a snapshot: the planned restart on a spare node",
    )
    p.add_argument(
        "--react",
        type=duration,
        default=10.0,
        help="alert to snapshot start (delivery and the next agreement step)",
    )
    p.add_argument(
        "--drain",
        type=duration,
        default=4 * 3600.0,
        help="a drained node with nothing found is back after this long",
    )
    p.add_argument("--spares", type=int, help="spare nodes (default: 2%% of the job's nodes, at least 1)")
    p.add_argument("--replications", type=int, default=20, help="independent runs per policy")
    p.add_argument("--sweep-replications", type=int, default=5, help="runs per threshold in the sweep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cache", type=Path, default=Path("out/goodput"), help="the replay twin and replay results"
    )
    p.add_argument("--plot", type=Path, default=Path("out/goodput/goodput.png"), help="the PNG written")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument(
        "--apply",
        action="store_true",
        help="write the recommended threshold beside the model (threshold.json): the service "
        "serves it from its next start or reload",
    )
    p.set_defaults(handler=run_goodput)


def costs_of(args: argparse.Namespace) -> JobCosts:
    """The job's costs from the parsed flags (seconds); JobCosts raises ValueError for a bad one."""
    return JobCosts(
        checkpoint_s=args.checkpoint,
        snapshot_s=args.snapshot,
        detect_s=args.detect,
        restart_s=args.restart,
        migrate_s=args.migrate,
        react_s=args.react,
        drain_s=args.drain,
    )


def run_goodput(args: argparse.Namespace) -> int:
    """Run the study and print it; writes the plot, and the JSON and threshold.json when asked.
    Returns the exit status: 0, or 2 for bad flags or a model that cannot be loaded."""
    from faultcast.demo.model import ensure_model
    from faultcast.goodput import report, study
    from faultcast.goodput.replay import model_digest
    from faultcast.model.artifact import ModelError, load
    from faultcast.model.threshold_file import write

    try:
        if min(args.gpus, args.replications, args.sweep_replications) < 1 or not args.days > 0:
            raise ValueError("--gpus, --days, --replications and --sweep-replications must be positive")
        nodes = -(-args.gpus // GPUS_PER_NODE)
        spares = args.spares if args.spares is not None else max(1, math.ceil(0.02 * nodes))
        job = study.Job(args.gpus, args.days, costs_of(args), spares)
    except ValueError as exc:
        print(f"faultcast goodput: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if args.model == Path("out/demo-model"):
        ensure_model(args.model)
    try:
        model = load(args.model)
    except ModelError as exc:
        print(f"faultcast goodput: {exc}", file=sys.stderr)
        return 2
    result = replayed(args, model)
    rates = failure_rates()
    total_rate = sum(rates.values())
    runs = study.draws(job, rates, max(args.replications, args.sweep_replications), args.seed)
    points = study.sweep(job, rates, result, runs[: args.sweep_replications])
    best = study.recommend(points)
    chosen = result.at(best.threshold)
    results = study.compare(job, rates, chosen, runs[: args.replications])
    results.insert(3, study.pessimistic(job, rates, chosen, result.gpu_days, runs[: args.replications]))
    own = min(points, key=lambda p: abs(p.threshold - result.model_threshold))

    mtbf = job_mtbf_s(job.gpus, total_rate)
    print(
        f"goodput twin: {job.gpus:,} GPUs ({nodes:,} nodes, {spares} spare) x {job.days:g} days, "
        f"{args.replications} replications (seed {args.seed})"
    )
    print(
        f"  failures: {total_rate * job.gpus:.2f} per day (job MTBF {mtbf / 3600:.2f} h), Llama 3's rate of "
        f"unexpected interruptions; {100 * rates[UNMODELLED] / total_rate:.0f}% outside the twin's hardware "
        "modes, never foreseen"
    )
    c = job.costs
    print(
        f"  costs: checkpoint {c.checkpoint_s:g} s, snapshot {c.snapshot_s:g} s, crash detection {c.detect_s:g} s, "
        f"restart {c.restart_s:g} s, migration {c.migrate_s:g} s, alert to snapshot {c.react_s:g} s, "
        f"drained healthy node out {c.drain_s / 3600:g} h"
    )
    print(
        f"  alerts: model {args.model} replayed on {result.gpu_days:,.0f} GPU-days of {_data(result)}, "
        f"{result.failures} failures ({_modes(result)})"
    )
    print()
    print(report.table(job, results))
    print()
    print(
        f"sweep ({args.sweep_replications} replications per threshold; the model's own threshold "
        f"{result.model_threshold:.3f} gives (b') {100 * own.ettr:.2f}%):"
    )
    print(report.sweep_table(points, best, result.model_threshold))
    by_key = {r.key: r for r in results}
    print()
    print(
        f"recommended threshold: {best.threshold:.3f} (effective training time {100 * best.ettr:.2f}% under "
        f"(b'); {100 * best.foreseen_share:.1f}% of failures foreseen in time, "
        f"{best.false_alarms_per_day:.2f} false alarms per day)"
    )
    print("targets at this size:")
    a = by_key["a"]
    for key in ("b", "b_tuned"):
        r = by_key[key]
        name = r.label.split(" ")[0]
        print(f"  {name} effective training time >= 95%: {_met(r.ettr >= 0.95)} ({100 * r.ettr:.2f}%)")
        for what, value in (("GPU-hours lost", study.lost_s), ("GPU-hours lost to recompute", _recompute)):
            mine, theirs = r.mean(value), a.mean(value)
            print(
                f"  {name} {what} <= half of (a)'s: {_met(mine <= theirs / 2)} ({study.gpu_hours(job, mine):,.0f} "
                f"vs {study.gpu_hours(job, theirs):,.0f}, {100 * (1 - mine / theirs):.0f}% less)"
            )
    report.plot(args.plot, job, results, points, best)
    print(f"plot: {args.plot}")
    basis = {
        "gpus": job.gpus,
        "days": job.days,
        "costs": asdict(job.costs),
        "spares": spares,
        "ettr": best.ettr,
        "replications": args.replications,
        "seed": args.seed,
    }
    if args.apply:
        path = write(args.model, best.threshold, model_digest(model), basis)
        print(
            f"applied: {path} (the service serves threshold {best.threshold:.3f} from its next start or reload)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_json(job, results, points, best, result, basis), indent=1))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


def replayed(args: argparse.Namespace, model: FaultModel) -> Replay:
    """The model's replay: from the cache when its inputs are the same, else computed and cached."""
    from faultcast.goodput import replay as rp
    from faultcast.model.dataset import open_dataset
    from faultcast.model.evaluate import held_out_part

    if args.replay_data is not None:
        data_dir = args.replay_data
        twin = None
    else:
        twin = replay_twin(model, args.twin_nodes, args.twin_days, args.twin_acceleration)
        data_dir = args.cache / f"twin-{rp.cache_key(twin)}"
    source = {
        "model_sha256": rp.model_digest(model),
        "model_threshold": rp.trained_threshold(model),
        "data": str(data_dir) if twin is None else {"twin": twin},
        "drain_s": args.drain,
        "rules": rp.REPLAY_RULES,
    }
    cache = args.cache / f"replay-{rp.cache_key(source)}.json"
    found = rp.load_cached(cache, source)
    if found is not None:
        return found
    if twin is not None and not (data_dir / "manifest.json").is_file():
        from faultcast.sim.config import FleetConfig
        from faultcast.sim.writer import simulate

        print(
            f"generating the replay twin ({args.twin_nodes} nodes x {args.twin_days:g} days) into {data_dir}"
        )
        simulate(FleetConfig(**twin), data_dir, [])
    dataset = open_dataset(data_dir)
    nodes, start, training_data = held_out_part(dataset, model)
    part = "its held-out nodes and days" if training_data else f"{len(nodes)} nodes"
    print(f"replaying the model on {data_dir}, {part} (about a minute per 1,000 GPU-days)")
    result = rp.replay(model, dataset, nodes, start, args.drain, source)
    rp.save(cache, result)
    return result


def replay_twin(model: FaultModel, nodes: int, days: float, acceleration: float) -> dict[str, Any]:
    """A twin the model never saw: another seed (other hardware, other failures) and a start a week
    after its training data ended."""
    from faultcast.sim.config import DEFAULT_START_UNIX_S

    data = model.card.training_data  # the twin the model was trained on, when it was one
    config = data.manifest.get("config") if data is not None else None
    trained: dict[str, Any] = config if isinstance(config, dict) else {}
    seed = int(trained.get("seed", 0)) + 1000
    start = int(
        trained.get("start_unix_s", DEFAULT_START_UNIX_S) + (float(trained.get("days", 0.0)) + 7) * _DAY_S
    )
    return {
        "nodes": nodes,
        "days": days,
        "seed": seed,
        "acceleration": acceleration,
        "start_unix_s": start,
        "gpus_per_node": GPUS_PER_NODE,
        "cadence_s": model.feature_config.cadence_s,
    }


def _modes(result: Replay) -> str:
    return ", ".join(f"{n} {m}" for m, n in sorted(result.failures_by_mode.items(), key=lambda kv: -kv[1]))


def _data(result: Replay) -> str:
    data = result.source["data"]
    if isinstance(data, dict):
        t = data["twin"]
        return (
            f"a twin it never saw ({t['nodes']} nodes x {t['days']:g} days, seed {t['seed']}, "
            f"failure rates x{t['acceleration']:g})"
        )
    return f"{data} (held out from training where it is the model's training data)"


def _recompute(o: Outcome) -> float:
    return o.recompute_s


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _json(
    job: Job,
    results: list[PolicyResult],
    points: list[SweepPoint],
    best: SweepPoint,
    result: Replay,
    basis: dict[str, Any],
) -> dict[str, object]:
    from faultcast.goodput.study import gpu_hours, lost_s

    return {
        "basis": basis,
        "policies": [
            {
                "key": r.key,
                "label": r.label,
                "interval_s": r.interval_s if math.isfinite(r.interval_s) else None,
                "threshold": r.threshold,
                "ettr": r.ettr,
                "ettr_sd": r.sd(lambda o: o.ettr),
                "gpu_hours_lost": gpu_hours(job, r.mean(lost_s)),
                "gpu_hours_recompute": gpu_hours(job, r.mean(lambda o: o.recompute_s)),
                "crashes": r.mean(lambda o: o.crashes),
                "migrations": r.mean(lambda o: o.migrations),
                "false_alarm_migrations": r.mean(lambda o: o.false_alarm_migrations),
                "false_alarm_gpu_hours": gpu_hours(job, r.mean(lambda o: o.false_alarm_s)),
            }
            for r in results
        ],
        "sweep": [vars(p) for p in points],
        "recommended_threshold": best.threshold,
        "replay": {k: v for k, v in result.to_json().items() if k != "samples"},
    }
