"""What the subcommand modules share: the type of `add_subparsers()`, and argument types that turn
the library's ValueErrors into argparse's usage errors (the message kept, exit status 2)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

from faultcast.durations import DurationError, parse_duration, parse_limit
from faultcast.sim.schedule import Scenario

if TYPE_CHECKING:  # argparse's action is generic only in typeshed, not at run time
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subcommands = argparse._SubParsersAction


def duration(text: str) -> float:
    """A flag's duration in seconds (faultcast.durations.parse_duration)."""
    try:
        return parse_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def limit(text: str) -> float:
    """A flag's limit in seconds, "0" or "off" for none (faultcast.durations.parse_limit)."""
    try:
        return parse_limit(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def scenario(text: str) -> Scenario:
    """A failure on cue, MODE:NODE:GPU:AT[:LEAD] (faultcast.sim.schedule.Scenario.parse)."""
    try:
        return Scenario.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
