"""Features of what happened inside each step (faultcast.step_summary): the gauges' excursions between
two model steps, which the step's last scrape cannot show.

- power, clock and temperature: the step's range (max - min), its largest range over the middle window,
  and the range minus its node's median range (a job's iterations swing every GPU of the node alike;
  a failing power stage swings one);
- brake, HW slowdown and thermal flags: the share of the step they were on, the mean share over the
  long window, that share (as seconds an hour, on a log scale) minus its node's mean and minus the
  GPU's own slow baseline (a brake-prone card that always blips cancels; one that starts to does not).

A step whose summary covers fewer than MIN_SCRAPES scrapes (a collector shipping every 30 s, an
import from a coarse Prometheus, the independent family's files) has none: the features are missing,
not zero, so the model knows what it lacks.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from faultcast.step_summary import MIN_SCRAPES, SUMMARISED, SUMMARY_COLUMNS
from faultcast.testing.reference_features.feature_relative import (
    BASELINE_TAU_S,
    RateBaseline,
    log_hourly,
    minus_node_mean,
)
from faultcast.testing.reference_features.windows import Ring, Windowed

RANGED = ("gpu_temp", "power_usage", "sm_clock")
SHARED = ("throttle_hw_power_brake", "throttle_hw_slowdown", "throttle_sw_thermal")
WIDTH = 1 + len(SUMMARY_COLUMNS)
"""Columns of a summary input row: the scrapes, then SUMMARY_COLUMNS."""
_MIN = np.array([1 + 3 * SUMMARISED.index(m) for m in RANGED])
_MAX = _MIN + 1
_MEAN = np.array([1 + 3 * SUMMARISED.index(m) + 2 for m in SHARED])


class StepFeatures:
    """Per slot: the step-summary features over a middle and a long window (in steps)."""

    def __init__(self, slots: int, gpus_per_node: int, cadence_s: float, mid: int, long: int) -> None:
        self.slots, self.g = slots, gpus_per_node
        self.mid = mid
        self._ranges = Ring(mid, slots, len(RANGED), math.nan)
        self._shares = Windowed(slots, len(SHARED), (long,), cadence_s, full=False)
        self._baseline = RateBaseline(slots, len(SHARED), cadence_s, BASELINE_TAU_S, long)

    @staticmethod
    def names(mid: str, long: str) -> list[str]:
        out = [f"{m}_step_range" for m in RANGED]
        out += [f"{m}_step_range_max_{mid}" for m in RANGED]
        out += [f"{m}_step_range_vs_node" for m in RANGED]
        out += [f"{f}_step_share" for f in SHARED]
        out += [f"{f}_step_share_mean_{long}" for f in SHARED]
        out += [f"{f}_step_share_vs_node_{long}" for f in SHARED]
        out += [f"{f}_step_share_excess_{long}" for f in SHARED]
        return out

    def blank(self) -> np.ndarray:
        """An input of no summaries: (slots, WIDTH), no scrapes."""
        out = np.full((self.slots, WIDTH), math.nan)
        out[:, 0] = 0.0
        return out

    def reset(self, slots: np.ndarray) -> None:
        """A new GPU in these slots: its history starts over."""
        self._ranges.fill_slots(slots, math.nan)
        self._shares.reset(slots)
        self._baseline.reset(slots)

    def update(self, step: int, summary: np.ndarray) -> list[np.ndarray]:
        """summary: (slots, WIDTH); rows of fewer than MIN_SCRAPES scrapes count as none."""
        read = summary[:, 0] >= MIN_SCRAPES
        ranges = np.where(read[:, None], summary[:, _MAX] - summary[:, _MIN], math.nan)
        shares = np.where(read[:, None], summary[:, _MEAN], math.nan)
        self._ranges.push(ranges)
        widest = np.fmax.reduce(self._ranges.last(self.mid), axis=0)
        by_node = ranges.reshape(-1, self.g, len(RANGED))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a node with no summary this step: all-NaN
            median = np.nanmedian(by_node, axis=1)
        vs_node = (by_node - median[:, None, :]).reshape(ranges.shape)
        (share_long,) = self._shares.update(shares)
        # Seconds an hour on a log scale, like the counters' events an hour (feature_relative.log_hourly).
        log_long = log_hourly(share_long)
        excess = self._baseline.excess(log_long)
        self._baseline.update(step, np.where(read[:, None], log_long, math.nan))
        return [ranges, widest, vs_node, shares, share_long, minus_node_mean(log_long, self.g), excess]

    def skip(self, count: int) -> None:
        """The state `count` updates without a summary would leave (O(window) work)."""
        kept = min(count, self._ranges.size)
        self._ranges.push_many(np.full((kept, self.slots, len(RANGED)), math.nan), count)
        self._shares.skip(count, np.full((self.slots, len(SHARED)), math.nan))
