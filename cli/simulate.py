"""`faultcast simulate`: run the fleet twin offline and write its telemetry and failure log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from faultcast.cli.types import Subcommands, duration, scenario
from faultcast.sim.config import FleetConfig


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
        "--h100-fraction", type=float, default=0.5, help="share of nodes with H100 (the rest A100)"
    )
    p.add_argument(
        "--no-confounders", action="store_true", help="healthy noise only, without look-alike events"
    )
    p.add_argument(
        "--scenario",
        action="append",
        type=scenario,
        default=[],
        metavar="MODE:NODE:GPU:AT",
        help="order a failure on cue, e.g. hbm_wear:0:3:6h (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the twin's files into --out and print a summary. Returns 0, or 2 for a configuration or
    scenario the twin refuses."""
    try:
        config = FleetConfig(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            days=args.days,
            cadence_s=args.interval,
            seed=args.seed,
            acceleration=args.acceleration,
            h100_fraction=args.h100_fraction,
            confounders=not args.no_confounders,
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
        f"at acceleration {config.acceleration:g}, in {manifest['generation_seconds']:.1f} s"
    )
    return 0
