"""The `faultcast` command line: every argparse user of the package lives here, one module per
subcommand, each a thin layer that parses arguments and calls the library (which never needs it)."""

from faultcast.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
