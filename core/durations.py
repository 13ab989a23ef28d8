"""Human durations: 1s, 500ms, 2m, 1h, 1d, or plain seconds (the command line's flags and scenario
strings use them; faultcast.cli.types turns the errors into argparse's)."""

from __future__ import annotations

import re

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


class DurationError(ValueError):
    """Text that is not a positive duration; the message says why, with examples."""


def parse_duration(text: str) -> float:
    """Seconds in `text` (always > 0); raises DurationError with the reason otherwise."""
    match = _PATTERN.match(text)
    if match is None:
        raise DurationError(f"{text!r} is not a duration (examples: 1s, 500ms, 2m, 1.5)")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise DurationError(f"{text!r}: a duration must be positive")
    return seconds


def parse_limit(text: str) -> float:
    """Like parse_duration, but "0" or "off" turns the limit off (returns 0)."""
    if text.strip() in ("0", "off"):
        return 0.0
    return parse_duration(text)
