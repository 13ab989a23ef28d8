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

import numpy as np

from faultcast.model.features.relative import (
    BASELINE_TAU_S,
    RateBaseline,
    log_hourly,
    minus_node_mean,
    node_median,
)
from faultcast.model.features.windows import DerivedState, Ring, RunningExtremes, Windowed
from faultcast.step_summary import MIN_SCRAPES, SUMMARISED, SUMMARY_COLUMNS

RANGED = ("gpu_temp", "power_usage", "sm_clock")
SHARED = ("throttle_hw_power_brake", "throttle_hw_slowdown", "throttle_sw_thermal")
WIDTH = 1 + len(SUMMARY_COLUMNS)
"""Columns of a summary input row: the scrapes, then SUMMARY_COLUMNS."""
_MIN = np.array([1 + 3 * SUMMARISED.index(m) for m in RANGED])
_MAX = _MIN + 1
_MEAN = np.array([1 + 3 * SUMMARISED.index(m) + 2 for m in SHARED])


class StepFeatures(DerivedState):
    """Per slot: the step-summary features over a middle and a long window (in steps)."""

    _DERIVED = ("_widest",)

    def __init__(self, slots: int, gpus_per_node: int, cadence_s: float, mid: int, long: int) -> None:
        self.slots, self.g = slots, gpus_per_node
        self.mid = mid
        self._ranges = Ring(mid, slots, len(RANGED), math.nan)
        self._shares = Windowed(slots, len(SHARED), (long,), cadence_s, full=False)
        self._baseline = RateBaseline(slots, len(SHARED), cadence_s, BASELINE_TAU_S, long)
        self._derive()

    def _derive(self) -> None:
        self._widest = RunningExtremes(self.mid, self.slots, len(RANGED))  # of the ranges in the window
        self._widest.rebuild(self._ranges)

    @property
    def width(self) -> int:
        """Columns of the output (`names`)."""
        return 4 * len(RANGED) + 3 * len(SHARED)

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
        self._widest.rebuild(self._ranges)
        self._shares.reset(slots)
        self._baseline.reset(slots)

    def update(self, step: int, summary: np.ndarray) -> list[np.ndarray]:
        """summary: (slots, WIDTH); rows of fewer than MIN_SCRAPES scrapes count as none. The features
        in `names`' order, one (slots, 3) array each."""
        out = np.empty((self.slots, self.width))
        self.write(step, summary, out)
        return [out[:, i : i + 3] for i in range(0, self.width, 3)]

    def write(self, step: int, summary: np.ndarray, out: np.ndarray) -> None:
        """`update`'s arrays side by side into `out` (slots, width)."""
        r, f = len(RANGED), len(SHARED)
        read = summary[:, 0] >= MIN_SCRAPES
        ranges, widest, vs_node = out[:, :r], out[:, r : 2 * r], out[:, 2 * r : 3 * r]
        shares, share_long = out[:, 3 * r : 3 * r + f], out[:, 3 * r + f : 3 * r + 2 * f]
        np.subtract(summary[:, _MAX], summary[:, _MIN], out=ranges)
        ranges[~read] = math.nan
        shares[...] = summary[:, _MEAN]
        shares[~read] = math.nan
        self._ranges.push(ranges)
        low = np.empty_like(widest)
        self._widest.push(ranges, self._ranges, low, widest)
        by_node = ranges.reshape(-1, self.g, r)
        np.subtract(
            by_node, node_median(by_node)[:, None, :], out=np.reshape(vs_node, by_node.shape, copy=False)
        )
        self._shares.write(shares, share_long)
        # Seconds an hour on a log scale, like the counters' events an hour (feature_relative.log_hourly).
        log_long = log_hourly(share_long)
        out[:, 3 * r + 2 * f : 3 * r + 3 * f] = minus_node_mean(log_long, self.g)
        out[:, 3 * r + 3 * f :] = self._baseline.excess(log_long)
        self._baseline.update(step, np.where(read[:, None], log_long, math.nan))

    def skip(self, count: int) -> None:
        """The state `count` updates without a summary would leave (O(window) work)."""
        kept = min(count, self._ranges.size)
        self._ranges.push_many(np.full((kept, self.slots, len(RANGED)), math.nan), count)
        self._widest.rebuild(self._ranges)
        self._shares.skip(count, np.full((self.slots, len(SHARED)), math.nan))
