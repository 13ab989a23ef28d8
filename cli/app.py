"""The `faultcast` command: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from faultcast import __version__


def build_parser() -> argparse.ArgumentParser:
    """The `faultcast` parser with every subcommand; each sets `handler`, the function that runs it
    (args -> exit status)."""
    parser = argparse.ArgumentParser(prog="faultcast", description=__doc__)
    parser.add_argument("--version", action="version", version=f"faultcast {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Each subcommand's module loads its heavy parts (the model stack, the service) only when it runs,
    # so every `faultcast collect` start stays light (tests/test_cli.py holds the line).
    from faultcast.cli import (
        calibrate,
        collect,
        demo,
        failures,
        goodput,
        import_score,
        labels,
        model,
        models,
        retrain,
        serve,
        simulate,
    )

    collect.add_parser(commands)
    simulate.add_parser(commands)
    goodput.add_parser(commands)
    model.add_parsers(commands)
    retrain.add_parser(commands)
    import_score.add_parsers(commands)
    failures.add_parser(commands)
    labels.add_parser(commands)
    models.add_parser(commands)
    calibrate.add_parser(commands)
    serve.add_parser(commands)
    demo.add_parser(commands)
    metrics = commands.add_parser("metrics", help="print the metric catalogue as a Markdown table")
    metrics.set_defaults(handler=_print_catalogue)
    return parser


def _print_catalogue(_: argparse.Namespace) -> int:
    from faultcast.catalogue import METRICS

    print("| name | scope | kind | unit | Prometheus name | source | how it is read |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in METRICS:
        label = f'{{{m.family_label[0]}="{m.family_label[1]}"}}' if m.family_label else ""
        print(
            f"| {m.name} | {m.scope.value} | {m.kind.value} | {m.unit} | `{m.prometheus_name}{label}` "
            f"| {m.source.value} | {m.read} |"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), set up logging to stderr and run the subcommand; returns its
    exit status. argparse exits with 2 itself on bad usage."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
