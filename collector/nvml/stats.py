"""Latency of NVML calls: a cheap per-call accumulator, and the CallStats the source reports."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallStats:
    """Latency of one NVML function across every scrape since the source opened."""

    count: int
    total_seconds: float
    max_seconds: float
    timeouts: int = 0  # calls the scrape stopped waiting for (counted in `count` once they return)

    @property
    def mean_seconds(self) -> float:
        """Mean latency per call; NaN before the first call returned."""
        return self.total_seconds / self.count if self.count else math.nan


class CallStat:
    """The mutable accumulator behind CallStats; slots keep the per-call update cheap.

    One writer per field: the thread making the calls updates count, total and max; the thread
    that stops waiting for a hung call updates timeouts. So no update is lost between them.
    """

    __slots__ = ("count", "max", "name", "timeouts", "total")

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.timeouts = 0

    def add(self, seconds: float) -> None:
        """Count one call that took `seconds` (the per-GPU hot loop inlines this)."""
        self.count += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds


def stat_in(stats: dict[str, CallStat], name: str) -> CallStat:
    """The accumulator for function `name` in `stats`, made on first use."""
    stat = stats.get(name)
    if stat is None:
        stat = stats[name] = CallStat(name)
    return stat


def merge(books: Iterable[Mapping[str, CallStat]]) -> dict[str, CallStats]:
    """Every function called or timed out at least once, summed over `books`, sorted by name."""
    merged: dict[str, CallStats] = {}
    for stats in books:
        for stat in tuple(stats.values()):  # one C-level copy: a hung GPU's worker may add a name
            if not (stat.count or stat.timeouts):
                continue
            seen = merged.get(stat.name)
            if seen is None:
                merged[stat.name] = CallStats(stat.count, stat.total, stat.max, stat.timeouts)
            else:
                merged[stat.name] = CallStats(
                    seen.count + stat.count,
                    seen.total_seconds + stat.total,
                    max(seen.max_seconds, stat.max),
                    seen.timeouts + stat.timeouts,
                )
    return dict(sorted(merged.items()))
