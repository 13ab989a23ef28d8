"""What a GPU's gauges did between two model steps: the minimum, maximum and mean over the scrapes.

A collector scraping every second sees 60 readings in a one-minute model step; a model that keeps the
last of them misses what happened in between (a power brake of three seconds, a clock dip, a spike of
heat). The collector therefore ships one sample per step whose values are the last scrape's (counters
at the step's end) and whose summary holds, for every gauge, the minimum, maximum and mean over the
step's scrapes. A plain scrape is a summary of one. Summaries combine (`combine`), so the service lays
plain 1 s samples, 10 s summaries or 60 s summaries on its grid to the same step summary, and the
twin writes the same thing into its files (`SUMMARY_COLUMNS`).

Only `SUMMARISED` gauges reach the model's files and features: the ones whose excursions inside a
minute mean something physical (power delivery trouble brakes power and clocks for seconds; thermal
trouble shows as short peaks). The wire carries every gauge; counters are NaN in a summary (their
value at the step's end says all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.catalogue import Kind, Scope, index_of, metrics_for

SUMMARISED: tuple[str, ...] = (
    "gpu_temp", "power_usage", "sm_clock",
    "throttle_hw_power_brake", "throttle_hw_slowdown", "throttle_sw_thermal",
)  # fmt: skip  # names packed, not one per line
"""The GPU gauges whose step summaries the files keep and the features read."""
STATS = ("min", "max", "mean")
SUMMARY_COLUMNS: tuple[str, ...] = tuple(f"{m}_step_{s}" for m in SUMMARISED for s in STATS)
"""telemetry.parquet's summary columns, when a source writes them: `{metric}_step_{min,max,mean}`."""
SCRAPES_COLUMN = "step_scrapes"
"""telemetry.parquet's count of scrapes behind each row's summary (0 or absent: none)."""
MIN_SCRAPES = 6
"""The fewest scrapes a step's summary needs to be read: at a 60 s step, a 10 s collection or faster.
Two 30 s scrapes bound a minute far less tightly than sixty 1 s ones, and a feature must mean the same
on every fleet, so a summary of fewer scrapes is missing, not small."""

_GPU_KINDS = np.array([m.kind is Kind.GAUGE for m in metrics_for(Scope.GPU)])
SUMMARISED_INDEX = np.array([index_of(Scope.GPU)[m] for m in SUMMARISED])
"""SUMMARISED's positions in a GPU values array."""


@dataclass(frozen=True, slots=True)
class StepSummary:
    """A GPU's gauges over `scrapes` scrapes: min, max and mean, each aligned with the GPU values array
    (NaN for counters and for gauges never read in the window)."""

    scrapes: int
    minimum: tuple[float, ...]
    maximum: tuple[float, ...]
    mean: tuple[float, ...]

    @staticmethod
    def of(values: Sequence[float]) -> StepSummary:
        """A single scrape as a summary of one (counters blanked)."""
        v = np.where(_GPU_KINDS, np.asarray(values, dtype=np.float64), math.nan)
        t = tuple(v.tolist())
        return StepSummary(1, t, t, t)

    def check(self) -> str | None:
        """What is wrong with this summary, or None: lengths, scrapes, and min <= mean <= max."""
        n = len(_GPU_KINDS)
        if self.scrapes < 1:
            return f"a summary of {self.scrapes} scrapes"
        if not len(self.minimum) == len(self.maximum) == len(self.mean) == n:
            return (
                f"summary arrays have {len(self.minimum)}, {len(self.maximum)} and {len(self.mean)} "
                f"entries, the GPU schema has {n}"
            )
        lo, hi, mean = (np.asarray(a) for a in (self.minimum, self.maximum, self.mean))
        with np.errstate(invalid="ignore"):
            # A mean of float32 readings may sit a rounding step outside its bounds.
            slack = 1e-6 * np.maximum(np.abs(lo), np.abs(hi)) + 1e-9
            bad = (lo > hi) | (mean < lo - slack) | (mean > hi + slack)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            name = metrics_for(Scope.GPU)[k].name
            return f"summary of {name} has min {lo[k]}, mean {mean[k]}, max {hi[k]}"
        return None


def combine(parts: Sequence[StepSummary]) -> StepSummary:
    """One summary of all the parts' scrapes (min of minima, max of maxima, mean weighted by scrapes);
    a gauge missing from a part is left out of that part's share."""
    if len(parts) == 1:
        return parts[0]
    lo = np.array([p.minimum for p in parts], dtype=np.float64)
    hi = np.array([p.maximum for p in parts], dtype=np.float64)
    mean = np.array([p.mean for p in parts], dtype=np.float64)
    weight = np.array([p.scrapes for p in parts], dtype=np.float64)[:, None] * ~np.isnan(mean)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = weight.sum(axis=0)
        combined = np.where(
            total > 0, np.nansum(mean * weight, axis=0) / np.where(total > 0, total, 1), math.nan
        )
        return StepSummary(
            sum(p.scrapes for p in parts),
            tuple(np.fmin.reduce(lo, axis=0).tolist()),
            tuple(np.fmax.reduce(hi, axis=0).tolist()),
            tuple(combined.tolist()),
        )


def summarised_row(summary: StepSummary | None) -> np.ndarray:
    """(len(SUMMARY_COLUMNS) + 1,): the scrapes then SUMMARY_COLUMNS' values of one GPU's step, the
    way the files store them (NaN and 0 scrapes when there is no summary)."""
    if summary is None:
        return np.concatenate([[0.0], np.full(len(SUMMARY_COLUMNS), math.nan)])
    k = SUMMARISED_INDEX
    stats = np.stack(
        [np.asarray(summary.minimum)[k], np.asarray(summary.maximum)[k], np.asarray(summary.mean)[k]]
    )
    return np.concatenate([[float(summary.scrapes)], stats.T.reshape(-1)])


def summary_of_row(row: np.ndarray) -> StepSummary | None:
    """The inverse of `summarised_row`: a summary whose SUMMARISED gauges are the row's (the other
    gauges NaN); None when the row holds no scrapes."""
    scrapes = int(row[0]) if not math.isnan(row[0]) else 0
    if scrapes < 1:
        return None
    arrays = np.full((3, len(_GPU_KINDS)), math.nan)
    arrays[:, SUMMARISED_INDEX] = np.asarray(row[1:], dtype=np.float64).reshape(len(SUMMARISED), 3).T
    lo, hi, mean = (tuple(a.tolist()) for a in arrays)
    return StepSummary(scrapes, lo, hi, mean)
