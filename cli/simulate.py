"""`faultcast simulate`: run the fleet twin offline and write its telemetry and failure log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from faultcast.cli.paths import refuse, uncreatable
from faultcast.cli.types import Subcommands, add_world_flags, duration, scenario, world_from_args
from faultcast.sim.config import FleetConfig
from faultcast.sim.world import TRACE_FAMILY, World, trace_calibrated


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast simulate` and its flags (a FleetConfig's, scenarios, --out) to `commands`."""
    p: argparse.ArgumentParser = commands.add_parser(
        "simulate", help="run the fleet twin and write telemetry, network, failure log and manifest"
    )
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=float, default=2.0)
    p.add_argument("--interval", type=duration, default=60.0, help="sample interval (default 60s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--acceleration",
        type=float,
        default=1.0,
        help="multiply every failure rate (recorded in the manifest); 1 = the published base rates",
    )
    p.add_argument(
        "--mode-acceleration",
        action="append",
        type=mode_factor,
        default=[],
        metavar="MODE=FACTOR",
        help="multiply one mode's rate by FACTOR on top of --acceleration, e.g. cooling=6 (repeatable; "
        "recorded in the manifest, and `faultcast train` weights those failures' rows back down)",
    )
    p.add_argument(
        "--h100-fraction", type=float, default=0.5, help="share of nodes with H100 (the rest A100)"
    )
    p.add_argument(
        "--no-confounders", action="store_true", help="healthy noise only, without look-alike events"
    )
    add_world_flags(p)
    p.add_argument(
        "--family",
        choices=["faultcast-twin", "faultcast-trace", "independent"],
        default="faultcast-twin",
        help="which generator: the fleet twin (default), or the independent one written from the "
        "literature alone (faultcast.sim.independent; of the world flags it takes --world-seed only, and no "
        "scenario, confounder or h100 flags); faultcast-trace is the twin with a real fleet's node history "
        "(per-node frailty, refaults, long repairs, calibrated to StepFun's InfiniteHBD fault trace: "
        "docs/fault-trace.md) over the median world, the --world-seed one or the --world-file one",
    )
    p.add_argument(
        "--scenario",
        action="append",
        type=scenario,
        default=[],
        metavar="MODE:NODE:GPU:AT",
        help="order a failure on cue, e.g. hbm_wear:0:3:6h (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="the directory to write (created when missing)")
    p.set_defaults(handler=run)


def _world(args: argparse.Namespace) -> World:
    """The world the flags name; for faultcast-trace, with the trace's node history over it."""
    world = world_from_args(args)
    return trace_calibrated(world) if args.family == TRACE_FAMILY else world


def run(args: argparse.Namespace) -> int:
    """Write the twin's files into --out and print a summary. Returns 0, or 2 for a configuration or
    scenario the twin refuses."""
    why = uncreatable([("--out", args.out)])
    if why is not None:
        return refuse("simulate", why)
    if args.family == "independent":
        return _independent(args)
    try:
        config = FleetConfig(
            **_fleet_size(args),
            h100_fraction=args.h100_fraction,
            mode_acceleration=tuple(args.mode_acceleration),
            confounders=not args.no_confounders,
            world=_world(args),
        )
    except ValueError as exc:
        print(f"faultcast simulate: {exc}", file=sys.stderr)
        return 2
    from faultcast.sim.writer import simulate  # pyarrow loads only for this command

    try:
        manifest = simulate(config, args.out, args.scenario)
    except ValueError as exc:
        print(f"faultcast simulate: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{mode} {n}" for mode, n in manifest["failure_counts"].items())
    print(
        f"wrote {args.out}: {manifest['rows']['telemetry']:,} GPU rows, {manifest['rows']['network']:,} node rows, "
        f"{manifest['rows']['failures']} failures ({counts}) over {manifest['gpu_days']:g} GPU-days "
        f"at acceleration {config.acceleration:g}{_factors(config)}, world {config.world.id} ({config.world.family}"
        f"{'' if config.world.seed is None else f', seed {config.world.seed}'}), "
        f"{manifest['failures_with_precursor']} with a precursor, in {manifest['generation_seconds']:.1f} s"
    )
    return 0


def mode_factor(text: str) -> tuple[str, float]:
    """MODE=FACTOR as a pair (FleetConfig checks the mode and the factor)."""
    mode, sep, factor = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return mode.strip(), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MODE=FACTOR (e.g. cooling=6), got {text!r}") from None


def _fleet_size(args: argparse.Namespace) -> dict[str, Any]:
    """What both generators take from the flags: the fleet, its horizon and cadence, seed, acceleration."""
    return {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "days": args.days,
        "cadence_s": args.interval,
        "seed": args.seed,
        "acceleration": args.acceleration,
    }


def _independent(args: argparse.Namespace) -> int:
    """The independent generator: the same files, another author's physics."""
    given = {
        "--scenario": bool(args.scenario),
        "--world-file": args.world_file is not None,
        "--no-confounders": args.no_confounders,
        "--h100-fraction": args.h100_fraction != 0.5,
        "--mode-acceleration": bool(args.mode_acceleration),
    }
    ignored = [flag for flag, present in given.items() if present]
    if ignored:
        print(f"faultcast simulate: --family independent takes no {', '.join(ignored)}", file=sys.stderr)
        return 2
    from faultcast.sim.independent import IndependentConfig, generate

    try:
        config = IndependentConfig(**_fleet_size(args), world_seed=args.world_seed)
        manifest = generate(args.out, config)
    except ValueError as exc:
        print(f"faultcast simulate: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.out} (independent family, world {manifest['world']['id']}): "
        f"{manifest['rows']['telemetry']:,} GPU rows, {sum(manifest['failure_counts'].values())} failures "
        f"({manifest['failures_with_precursor']} with a precursor): {manifest['failure_counts']}"
    )
    return 0


def _factors(config: FleetConfig) -> str:
    """The mode factors for the summary line ("" when none)."""
    if not config.mode_acceleration:
        return ""
    return " (" + ", ".join(f"{mode} x{factor:g} more" for mode, factor in config.mode_acceleration) + ")"
