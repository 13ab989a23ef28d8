"""`faultcast goodput`: what predictive snapshot-and-migrate saves a job, against periodic
checkpoints alone and against an oracle, with the alert threshold that saves the most."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultcast.cli.paths import create, create_parents, missing_input, refuse
from faultcast.cli.types import Subcommands, duration, limit
from faultcast.goodput.engine import REPLICA_OVERHEAD, JobCosts, NodeReplacement, Outcome, ProtectTier
from faultcast.goodput.process import GPUS_PER_NODE, UNMODELLED, failure_rates, job_mtbf_s

if TYPE_CHECKING:  # the replay loads the model (LightGBM): only when the command runs
    from faultcast.goodput.cost_scaling import Assumptions
    from faultcast.goodput.measured_costs import MeasuredCosts
    from faultcast.goodput.process import AlertSample, Draw
    from faultcast.goodput.replay import Replay
    from faultcast.goodput.study import Evaluation, Job, PolicyResult, SweepPoint, TierStudy
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
        "--model", type=Path, help="the model whose alerts are replayed (default: the shipped model)"
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
        "--detect-evident",
        type=duration,
        default=None,
        metavar="DURATION",
        help="a crash whose failure leaves evidence (a critical Xid, a GPU lost, an IB port down, a node gone "
        "silent: every hardware mode but silent data corruption) goes unnoticed only this long: the service's "
        "FAILED event ends the job's collectives (4.5s: the worst case measured by bench/failure_detection.py, a "
        "hung node); default: --detect for every crash",
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
    p.add_argument(
        "--protect-replica",
        type=duration,
        default=60.0,
        help="protect tier: while a warning lasts, a replica in a buddy's memory this often (a crash it "
        "warned of loses at most this much)",
    )
    p.add_argument(
        "--protect-overhead",
        type=float,
        default=REPLICA_OVERHEAD,
        help="protect tier: the share of training time those replicas cost while a warning lasts (default: "
        "bench/replicas.py at one a minute, 256 MiB per rank)",
    )
    p.add_argument(
        "--protect-warning",
        type=duration,
        default=1800.0,
        help="protect tier: how long a warning on a node that does not fail lasts (the model's horizon)",
    )
    g = p.add_argument_group(
        "state in peers' memory and one node replaced (policy (r), when --replica-every is given)"
    )
    g.add_argument(
        "--replica-every",
        type=duration,
        default=None,
        metavar="DURATION",
        help="a replica of the job's state in a buddy's memory this often: a crash loses at most this much",
    )
    g.add_argument(
        "--replica-overhead",
        type=float,
        default=REPLICA_OVERHEAD,
        help="the share of training time the replicas cost (default: bench/replicas.py at one a minute, "
        "256 MiB per rank)",
    )
    g.add_argument(
        "--replace",
        type=duration,
        default=60.0,
        help="a crash noticed to the first step again on a warm spare (or in place when no node is lost)",
    )
    g.add_argument("--warm-pool", type=int, default=1, help="warm spare nodes kept running for the job")
    g.add_argument(
        "--rearm",
        type=duration,
        default=None,
        metavar="DURATION",
        help="a taken warm spare is replaced after this long (default: --restart)",
    )
    _add_cost_flags(p)
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


def _add_cost_flags(p: argparse.ArgumentParser) -> None:
    from faultcast.goodput import cost_scaling as cs

    g = p.add_argument_group(
        "measured costs",
        "take the costs from a migration benchmark's file (bench/migration.py), and carry them to a large "
        'job as an estimate (docs/goodput.md, "Measured costs"); crash detection and --drain stay flags',
    )
    g.add_argument(
        "--costs",
        metavar="FILE",
        type=Path,
        help="a faultcast.migration_costs/1 file, in place of --checkpoint, --snapshot, --restart, --migrate "
        "and --react (ignored with it); the --scale-* flags below need it",
    )
    g.add_argument(
        "--scale-params",
        metavar="N",
        type=float,
        help=f"the large job's parameters (default {cs.PARAMETERS:.0e})",
    )
    g.add_argument(
        "--bytes-per-param",
        metavar="BYTES",
        type=float,
        help=f"training state per parameter (default {cs.BYTES_PER_PARAM:g}: mixed-precision Adam as ZeRO "
        "counts it; 14 without gradients)",
    )
    g.add_argument(
        "--scale-shards",
        metavar="NODES",
        type=int,
        help="nodes the state is split over (default: every node of --gpus, full sharding); fewer "
        "means replicas, and each node holds more",
    )
    g.add_argument(
        "--scale-copy-bandwidth",
        metavar="BYTES_PER_S",
        type=float,
        help=f"GPU to host copy, bytes/s per GPU (default {cs.COPY_BYTES_PER_S_PER_GPU:.0e}: PCIe Gen5)",
    )
    g.add_argument(
        "--scale-network-bandwidth",
        metavar="BYTES_PER_S",
        type=float,
        help=f"a node's network, bytes/s (default {cs.NETWORK_BYTES_PER_S_PER_NODE:.0e}: one 200 Gb/s NIC)",
    )
    g.add_argument(
        "--scale-storage-bandwidth",
        metavar="BYTES_PER_S",
        type=float,
        help=f"checkpoint storage for the whole cluster, bytes/s (default {cs.STORAGE_BYTES_PER_S:.0e}: Llama 3's)",
    )
    g.add_argument(
        "--scale-reinit",
        metavar="DURATION",
        type=limit,
        help=f"extra fixed cost of each restart and migration at scale (default {cs.REINIT_S:g} s: NCCL "
        "initialisation at thousands of GPUs; 0 for none)",
    )


_SCALE_FLAGS = (
    "scale_params",
    "bytes_per_param",
    "scale_shards",
    "scale_copy_bandwidth",
    "scale_network_bandwidth",
    "scale_storage_bandwidth",
    "scale_reinit",
)


def assumptions_of(args: argparse.Namespace) -> Assumptions:
    """The scaled estimate's assumptions from the flags, defaults where not given; ValueError for a bad one."""
    from faultcast.goodput import cost_scaling as cs

    def given(name: str, default: float) -> float:
        value = getattr(args, name)
        return float(default if value is None else value)

    job = cs.LargeJob(
        parameters=given("scale_params", cs.PARAMETERS),
        gpus=args.gpus,
        bytes_per_param=given("bytes_per_param", cs.BYTES_PER_PARAM),
        shard_nodes=args.scale_shards,
    )
    bandwidths = cs.Bandwidths(
        copy_per_gpu=given("scale_copy_bandwidth", cs.COPY_BYTES_PER_S_PER_GPU),
        network_per_node=given("scale_network_bandwidth", cs.NETWORK_BYTES_PER_S_PER_NODE),
        storage_total=given("scale_storage_bandwidth", cs.STORAGE_BYTES_PER_S),
    )
    return cs.Assumptions(job, bandwidths, given("scale_reinit", cs.REINIT_S))


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
        evident_detect_s=args.detect_evident,
    )


@dataclass(frozen=True)
class Setup:
    """The job studied and where its costs came from: the flags, or a measured costs file (then also
    the assumptions that carry them to a large job)."""

    job: Job
    nodes: int
    measured: MeasuredCosts | None
    assumptions: Assumptions | None


def setup_of(args: argparse.Namespace) -> Setup:
    """The job and its costs from the flags and --costs; ValueError for a bad flag or costs file."""
    from faultcast.goodput import study
    from faultcast.goodput.measured_costs import load as load_costs

    if min(args.gpus, args.replications, args.sweep_replications) < 1 or not args.days > 0:
        raise ValueError("--gpus, --days, --replications and --sweep-replications must be positive")
    nodes = -(-args.gpus // GPUS_PER_NODE)
    spares = args.spares if args.spares is not None else max(1, math.ceil(0.02 * nodes))
    if args.costs is None:
        stray = [f"--{name.replace('_', '-')}" for name in _SCALE_FLAGS if getattr(args, name) is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)}: only with --costs")
        return Setup(study.Job(args.gpus, args.days, costs_of(args), spares), nodes, None, None)
    measured = load_costs(args.costs)
    assumptions = assumptions_of(args)
    job = study.Job(
        args.gpus, args.days, measured.job_costs(args.detect, args.drain, args.detect_evident), spares
    )
    return Setup(job, nodes, measured, assumptions)


@dataclass(frozen=True)
class Study:
    """What the command found: the recommended threshold, the basis it was chosen on, every figure."""

    threshold: float
    basis: dict[str, Any]
    figures: dict[str, object]
    protect_threshold: float | None = None  # the protect tier's, when one beats the move tier alone


def run_goodput(args: argparse.Namespace) -> int:
    """Run the study and print it; writes the plot, and the JSON and threshold.json when asked.
    Returns the exit status: 0, or 2 for bad flags, a bad costs file or a model that cannot be loaded."""
    from faultcast.goodput.replay import model_digest
    from faultcast.model.artifact import ModelError, load
    from faultcast.model.features.offline import DataError
    from faultcast.model.shipped import shipped_model_dir
    from faultcast.model.threshold_file import write

    try:
        setup = setup_of(args)
    except ValueError as exc:
        print(f"faultcast goodput: {exc}", file=sys.stderr)
        return 2
    why = (
        missing_input([("--model", args.model), ("--replay-data", args.replay_data)])
        or create([("--cache", args.cache)])
        or create_parents([("--plot", args.plot), ("--json", args.json)])
    )
    if why is None and args.apply and args.model is None:
        # threshold.json would land inside the installed package, and the next install would drop it.
        why = (
            "--apply writes threshold.json beside the model: copy the shipped model, give the copy as --model"
        )
    if why is not None:
        return refuse("goodput", why)
    started = time.perf_counter()
    try:
        args.model = args.model if args.model is not None else shipped_model_dir()
        model = load(args.model)
    except ModelError as exc:
        print(f"faultcast goodput: {exc}", file=sys.stderr)
        return 2
    try:
        replay = replayed(args, model)
    except DataError as exc:  # --replay-data that is no data directory
        return refuse("goodput", f"--replay-data {exc}" if args.replay_data is not None else str(exc))
    found = report_study(args, setup, replay)
    if args.apply:
        path = write(args.model, found.threshold, model_digest(model), found.basis, found.protect_threshold)
        tier = (
            "" if found.protect_threshold is None else f" and protect threshold {found.protect_threshold:.3f}"
        )
        print(
            f"applied: {path} (the service serves threshold {found.threshold:.3f}{tier} from its next start "
            "or reload)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(found.figures, indent=1))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


def report_study(args: argparse.Namespace, setup: Setup, result: Replay) -> Study:
    """The study on the model's replay at the setup's costs, printed, and the plot written; with measured
    costs, also the target at them and the whole comparison again at their scaled estimate."""
    from faultcast.goodput import report, study

    job = setup.job
    rates = failure_rates()
    total_rate = sum(rates.values())
    runs = study.draws(job, rates, max(args.replications, args.sweep_replications), args.seed)
    ev = study.evaluate(job, rates, result, runs, args.replications, args.sweep_replications)
    points, best, results = ev.points, ev.best, ev.results
    own = min(points, key=lambda p: abs(p.threshold - result.model_threshold))

    mtbf = job_mtbf_s(job.gpus, total_rate)
    print(
        f"goodput twin: {job.gpus:,} GPUs ({setup.nodes:,} nodes, {job.spares} spare) x {job.days:g} days, "
        f"{args.replications} replications (seed {args.seed})"
    )
    print(
        f"  failures: {total_rate * job.gpus:.2f} per day (job MTBF {mtbf / 3600:.2f} h), Llama 3's rate of "
        f"unexpected interruptions; {100 * rates[UNMODELLED] / total_rate:.0f}% outside the twin's hardware "
        "modes, never foreseen"
    )
    c = job.costs
    if setup.measured is None:
        print(
            f"  costs: checkpoint {c.checkpoint_s:g} s, snapshot {c.snapshot_s:g} s, crash detection {c.detect_s:g} s"
            f"{'' if c.evident_detect_s is None else f' ({c.evident_detect_s:g} s with evidence: FAILED events)'}, "
            f"restart {c.restart_s:g} s, migration {c.migrate_s:g} s, alert to snapshot {c.react_s:g} s, "
            f"drained healthy node out {c.drain_s / 3600:g} h"
        )
    else:
        from faultcast.goodput.costs_report import measured_lines

        print("\n".join(measured_lines(setup.measured, c)))
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
    by_key = ev.by_key()
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
    tiers = _protect_tier(args, job, rates, result, best.threshold, runs)
    if args.replica_every is not None:
        results = [*results, _replacement(args, job, rates, result.at(best.threshold), runs)]
    report.plot(args.plot, job, results, points, best)
    print(f"plot: {args.plot}")
    basis = {
        "gpus": job.gpus,
        "days": job.days,
        "costs": asdict(job.costs),
        "spares": job.spares,
        "ettr": best.ettr,
        "replications": args.replications,
        "seed": args.seed,
    }
    if setup.measured is not None:
        basis["costs_file"] = setup.measured.source
    protect = tiers.best.threshold if tiers.best is not None else None
    if protect is not None:
        basis["protect_threshold"] = protect
        basis["protect_tier"] = asdict(tiers.tier)
    figures = _json(job, results, points, best, result, basis)
    figures["costs"] = {"source": "flags", "used": asdict(job.costs)}
    figures["protect_tier"] = {
        "tier": asdict(tiers.tier),
        "base_ettr": tiers.base.ettr,
        "points": [asdict(p) for p in tiers.points],
        "chosen": protect,
        "policy": _policies(job, [tiers.result]) if tiers.result is not None else None,
    }
    if setup.measured is not None and setup.assumptions is not None:
        figures.update(_on_measured(args, setup.measured, setup.assumptions, job, ev, result, runs))
    return Study(best.threshold, basis, figures, protect)


def _replacement(
    args: argparse.Namespace, job: Job, rates: Mapping[str, float], move: AlertSample, runs: Sequence[Draw]
) -> PolicyResult:
    """Policy (r) at the recommended threshold, printed with where its lost GPU-hours go beside (b')'s."""
    from faultcast.goodput import report, study, targets

    replacement = NodeReplacement(
        replica_s=args.replica_every,
        overhead=args.replica_overhead,
        replace_s=args.replace,
        warm_pool=args.warm_pool,
        rearm_s=args.rearm if args.rearm is not None else args.restart,
        pool_share=args.warm_pool * GPUS_PER_NODE / job.gpus,
    )
    found = study.with_replacement(job, rates, move, runs[: args.replications], replacement)
    print()
    print(f"state in peers' memory and one node replaced ({args.replications} replications):")
    print(report.table(job, [found]))
    print("  where its lost GPU-hours go:")
    c = job.costs
    crashes = found.mean(lambda o: o.crashes)
    warm = found.mean(lambda o: o.warm_replacements)
    behind = {  # what these buckets are made of under (r), which the generic text does not say
        "recompute_s": f"{crashes:.1f} crashes x the work since the newest replica (at most "
        f"{replacement.replica_s:g} s; since the last checkpoint for silent data corruption, interval "
        f"{found.interval_s / 60:.0f} min)",
        "restart_s": f"{crashes:.1f} crashes x (detection {c.evident_detect_s or c.detect_s:g} s with evidence, "
        f"{c.detect_s:g} s without + {replacement.replace_s:g} s to the first step on a warm spare or in "
        f"place; {crashes - warm:.1f} of them not on a warm spare)",
        "migration_s": f"{found.mean(lambda o: o.migrations):.1f} predicted failures x the same replacement "
        f"({replacement.replace_s:g} s)",
    }
    for part in targets.lost_parts(found, job.costs):
        if part.lost_s > 0:
            what = behind.get(part.bucket, part.behind)
            print(
                f"  - {part.label}: {study.gpu_hours(job, part.lost_s):,.0f} ({100 * part.share:.0f}%): {what}"
            )
    return found


def _protect_tier(
    args: argparse.Namespace,
    job: Job,
    rates: Mapping[str, float],
    result: Replay,
    move_threshold: float,
    runs: Sequence[Draw],
) -> TierStudy:
    """The protect tier below the recommended threshold, printed: its sweep, and the policy at the
    chosen threshold (if one beats the move tier alone)."""
    from faultcast.goodput import report, study

    tier = ProtectTier(
        replica_s=args.protect_replica,
        overhead=args.protect_overhead,
        warning_s=args.protect_warning,
        spare_share=GPUS_PER_NODE / job.gpus,  # one node readied per warning
    )
    found = study.protect_tier(
        job, rates, result, result.at(move_threshold), tier, runs, args.replications, args.sweep_replications
    )
    print()
    print(
        f"protect tier below {move_threshold:.3f} (replica every {tier.replica_s:g} s while warned at "
        f"{100 * tier.overhead:.2f}% of training time, one spare node readied; a false warning lasts "
        f"{tier.warning_s / 60:g} min; {args.sweep_replications} replications per threshold):"
    )
    print(report.tier_table(found.points, found.best, found.base.ettr))
    if found.result is not None:
        print()
        print(report.table(job, [found.result]))
    else:
        print("no protect threshold beats the move tier alone: none chosen")
    return found


def _on_measured(
    args: argparse.Namespace,
    measured: MeasuredCosts,
    assumptions: Assumptions,
    job: Job,
    ev: Evaluation,
    result: Replay,
    runs: Sequence[Draw],
) -> dict[str, object]:
    """Print the target at the measured costs, then the comparison at their scaled estimate; returns
    their figures for --json."""
    from faultcast.goodput import cost_scaling, costs_report, study, targets
    from faultcast.goodput.measured_costs import UNMEASURED

    unmeasured = frozenset(UNMEASURED)
    print()
    print("the goodput target at the measured costs:")
    print("\n".join(costs_report.target_lines(job, ev, job.costs, unmeasured)))
    scaled = cost_scaling.scale(measured, assumptions)
    large = replace(job, costs=cost_scaling.job_costs(scaled, args.detect, args.drain, args.detect_evident))
    at_scale = study.evaluate(
        large, failure_rates(), result, runs, args.replications, args.sweep_replications
    )
    print()
    print("\n".join(costs_report.scaling_lines(assumptions, scaled)))
    print()
    print(
        f"at the scaled estimate (threshold {at_scale.best.threshold:.3f}, recommended at these costs; "
        f"{args.replications} replications):"
    )
    print(costs_report.policy_table(large, at_scale))
    print("\n".join(costs_report.target_lines(large, at_scale, large.costs, unmeasured)))

    def target(j: Job, e: Evaluation) -> dict[str, object]:
        by_key = e.by_key()
        check = targets.check(by_key["a"], by_key["b_tuned"])
        parts = targets.lost_parts(by_key["b_tuned"], j.costs)
        return {
            "ettr": check.ettr,
            "ettr_met": check.ettr_met,
            "gpu_hours_lost": study.gpu_hours(j, check.lost_s),
            "baseline_gpu_hours_lost": study.gpu_hours(j, check.baseline_lost_s),
            "lost_met": check.lost_met,
            "met": check.met,
            "excess_gpu_hours": study.gpu_hours(j, check.excess_s),
            "lost_by_bucket_gpu_hours": {p.bucket: study.gpu_hours(j, p.lost_s) for p in parts},
        }

    return {
        "costs": {
            "source": "measured",
            **measured.to_json(),
            "not_measured": {name: getattr(job.costs, name) for name in UNMEASURED},
            "used": asdict(job.costs),
        },
        "target": target(job, ev),
        "scaled": {
            "assumptions": assumptions.to_json(),
            "costs": [c.to_json() for c in scaled],
            "background_write_s": cost_scaling.background_write_s(assumptions),
            "used": asdict(large.costs),
            "recommended_threshold": at_scale.best.threshold,
            "policies": _policies(large, at_scale.results),
            "target": target(large, at_scale),
        },
    }


def replayed(args: argparse.Namespace, model: FaultModel) -> Replay:
    """The model's replay: from the cache when its inputs are the same, else computed and cached."""
    from faultcast.goodput import replay as rp
    from faultcast.model.evaluation.evaluate import held_out_part
    from faultcast.model.features.offline import open_dataset

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
    return {
        "basis": basis,
        "policies": _policies(job, results),
        "sweep": [vars(p) for p in points],
        "recommended_threshold": best.threshold,
        "replay": {k: v for k, v in result.to_json().items() if k != "samples"},
    }


def _policies(job: Job, results: Sequence[PolicyResult]) -> list[dict[str, object]]:
    from faultcast.goodput.study import gpu_hours, lost_s

    return [
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
    ]
