"""What the subcommand modules share: the type of `add_subparsers()`, and argument types that turn
the library's ValueErrors into argparse's usage errors (the message kept, exit status 2)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from faultcast.durations import DurationError, parse_duration, parse_limit
from faultcast.sim.schedule import Scenario
from faultcast.sim.world import World

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


def world_file(text: str) -> World:
    """A world file's world (faultcast.sim.world.World.from_file), read when the flags are parsed."""
    try:
        return World.from_file(Path(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_world_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--world-seed and --world-file: which world of the twin (faultcast.sim.world) to run."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--world-seed",
        type=int,
        help="draw the world (failure mix, precursor share, look-alike rates, thermal constants) from "
        "the documented priors with this seed; default: the median world",
    )
    group.add_argument(
        "--world-file",
        type=world_file,
        help="a JSON file of world parameters over the median world (your fleet: hot racks, SBE-heavy "
        "cards, ...); see docs/failure-modes.md",
    )


def world_from_args(args: argparse.Namespace) -> World:
    """The world --world-seed or --world-file names (the median world when neither)."""
    if args.world_seed is not None:
        return World.draw(args.world_seed)
    world: World = args.world_file if args.world_file is not None else World()
    return world
