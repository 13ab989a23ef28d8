"""Parsing of human durations on the command line: 1s, 500ms, 2m, 1h, or plain seconds."""

from __future__ import annotations

import argparse
import re

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in `text`; raises argparse.ArgumentTypeError with the reason otherwise."""
    match = _PATTERN.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 1s, 500ms, 2m, 1.5)")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return seconds


def parse_limit(text: str) -> float:
    """Like parse_duration, but "0" or "off" turns the limit off (returns 0)."""
    if text.strip() in ("0", "off"):
        return 0.0
    return parse_duration(text)
