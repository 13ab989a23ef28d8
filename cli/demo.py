"""`faultcast demo`: the end-to-end demo on the fleet twin (faultcast.demo.run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from faultcast.cli.paths import create, missing_input, refuse
from faultcast.cli.types import Subcommands, scenario
from faultcast.demo.settings import DEFAULT_FAILURES, DemoSettings

_DEFAULTS = DemoSettings()


def add_parser(commands: Subcommands) -> None:
    """Add `faultcast demo` and its flags (DemoSettings') to `commands`."""
    demo = commands.add_parser("demo", help="the end-to-end demo on the fleet twin (what `make run` runs)")
    demo.add_argument("--nodes", type=int, default=_DEFAULTS.nodes, help="simulated nodes (8 GPUs each)")
    demo.add_argument(
        "--speed", type=float, default=_DEFAULTS.speed, help="simulated seconds per wall-clock second"
    )
    demo.add_argument(
        "--failure", type=scenario, action="append", dest="failures", metavar="MODE:NODE:GPU:AT[:LEAD]",
        help="order a failure (repeatable); default: HBM, firmware, NVLink and PCIe failures over ~3 hours",
    )  # fmt: skip  # one argument per call reads better than the formatter's split
    demo.add_argument(
        "--model", type=Path, default=_DEFAULTS.model, help="the model (default: the shipped model)"
    )
    demo.add_argument("--out", type=Path, default=_DEFAULTS.out, help="logs and state of the run")
    demo.add_argument(
        "--prometheus-port", type=int, default=_DEFAULTS.prometheus_port, help="the service's /metrics"
    )
    demo.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo with the flags' settings (the default failures when none are given); its exit status."""
    why = missing_input([("--model", args.model)]) or create([("--out", args.out)])
    if why is not None:
        return refuse("demo", why)
    settings = DemoSettings(
        nodes=args.nodes, speed=args.speed, failures=tuple(args.failures or DEFAULT_FAILURES),
        model=args.model, out=args.out, prometheus_port=args.prometheus_port,
    )  # fmt: skip  # one line per group of settings
    from faultcast.demo.run import run_demo  # the service and LightGBM: only when the demo runs

    return run_demo(settings)
