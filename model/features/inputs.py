"""What the feature engine reads from a grid step before it computes anything: samples held across a
sparse cadence, frozen exporters recognised, and each GPU's own sampling interval.

A fleet exported every 10 minutes puts a sample on one grid step in ten; a 60 s model would see a GPU
that is there one step and gone the next nine. Gauges and 0/1 states are therefore held forward from a
GPU's last real sample for up to `hold_s` (a reading is what the GPU looked like until the next one),
and whether a GPU is late is judged against its own interval between samples, not the grid's: the same
features at 10 s, 60 s or 10 min. Counters are never held: rates already span the gap between two
readings.

An exporter that freezes keeps reporting the same values with new timestamps (seen for 37 hours on a
real fleet). A working GPU's temperature, power and clocks are never bit-identical for long: power in
milliwatts moves with every kernel, and temperature with power. Once every gauge of a GPU has stayed
identical for `frozen_s`, its samples are treated as absent until something changes.
"""

from __future__ import annotations

import math

import numpy as np

# Gauges compared to tell a frozen exporter: any of them moving proves the readings are live.
FROZEN_WATCH = ("gpu_temp", "memory_temp", "power_usage", "sm_clock", "gpu_util")
_INTERVAL_ALPHA = 0.2  # EWMA weight of a new interval between samples


class InputConditioner:
    """Per-slot state: the last real sample, when it came, how long its gauges stayed identical, and
    the typical interval between samples.

    `condition` takes one step's raw rows (NaN rows for GPUs not sampled in the step) and returns the
    rows the engine computes on: held gauges and flags filled in, frozen samples blanked."""

    def __init__(
        self,
        slots: int,
        columns: tuple[str, ...],
        held: tuple[str, ...],
        cadence_s: float,
        hold_s: float,
        frozen_s: float,
    ) -> None:
        index = {name: i for i, name in enumerate(columns)}
        self.cadence_s = cadence_s
        self.hold_steps = max(0, int(hold_s // cadence_s))
        self.frozen_steps = max(1, math.ceil(frozen_s / cadence_s))
        self._held_cols = np.array([index[c] for c in held])
        self._watch = np.array([index[c] for c in FROZEN_WATCH])
        self._presence = np.array([index["gpu_temp"], index["power_usage"]])
        self._last = np.full((slots, len(columns)), math.nan)  # the last real sample
        self.last_step = np.full(slots, -1, dtype=np.int64)  # its step
        self._same_since = np.full(slots, -1, dtype=np.int64)  # step since which the gauges are identical
        self.interval_s = np.full(slots, math.nan)  # EWMA of the interval between real samples
        self.sampled = np.zeros(slots, dtype=bool)  # a real, live sample in this step
        self.frozen = np.zeros(slots, dtype=bool)  # the sample of this step was blanked as frozen
        # The time since the previous live sample in the GPU's own intervals (the grid's step until one
        # is known): the gap a live sample ends, or the one still open; NaN before the first sample.
        self.late = np.full(slots, math.nan)

    def reset(self, slots: np.ndarray) -> None:
        """A new GPU in these slots: its history starts over."""
        self._last[slots] = math.nan
        self.last_step[slots] = -1
        self._same_since[slots] = -1
        self.interval_s[slots] = math.nan

    def condition(self, step: int, gpu: np.ndarray, *, in_place: bool = False) -> np.ndarray:
        """The rows to compute on (a new array, or `gpu` itself with `in_place`); updates the state."""
        real = ~np.isnan(gpu[:, self._presence]).all(axis=1)
        watched, before = gpu[:, self._watch], self._last[:, self._watch]
        same = (
            real
            & (self.last_step >= 0)
            & np.all((watched == before) | (np.isnan(watched) & np.isnan(before)), axis=1)
        )
        np.copyto(self._same_since, step, where=real & ~same)
        self.frozen = same & (step - self._same_since >= self.frozen_steps)
        live = real & ~self.frozen
        gap = (step - self.last_step) * self.cadence_s
        known = live & (self.last_step >= 0)
        typical = np.where(
            np.isnan(self.interval_s), self.cadence_s, np.maximum(self.interval_s, self.cadence_s)
        )
        # Before this sample counts: the gap it ends (live), or the one still open (no live sample).
        self.late = np.where(self.last_step >= 0, gap / typical, math.nan)
        self.interval_s = np.where(
            known,
            np.where(
                np.isnan(self.interval_s), gap, self.interval_s + _INTERVAL_ALPHA * (gap - self.interval_s)
            ),
            self.interval_s,
        )
        np.copyto(self._last, gpu, where=real[:, None])  # frozen ones too: they must change to thaw
        np.copyto(self.last_step, step, where=live)
        self.sampled = live
        out = gpu if in_place else gpu.copy()
        if self.frozen.any():
            out[self.frozen] = math.nan
        # Held for the GPU's own expected gap (1.5 intervals), at most hold_s: on a grid as fine as the
        # sampling a missed sample or two is held, on a sparse export the whole gap between samples.
        hold = ~real & (self.last_step >= 0) & ((step - self.last_step) * self.cadence_s <= self._span())
        if hold.any():
            rows = np.nonzero(hold)[0]
            out[np.ix_(rows, self._held_cols)] = self._last[np.ix_(rows, self._held_cols)]
        return out

    def _span(self) -> np.ndarray:
        """(slots,) seconds after its last live sample a GPU's reading is held."""
        return np.asarray(
            np.minimum(self.hold_steps * self.cadence_s, 1.5 * np.nan_to_num(self.interval_s, nan=0.0))
        )

    def hold_steps_left(self, step: int) -> int:
        """From `step` on, how many steps without samples may still show a held reading somewhere."""
        seen = self.last_step >= 0
        if not seen.any():
            return 0
        last_held = self.last_step[seen] + np.floor(self._span()[seen] / self.cadence_s).astype(np.int64)
        return max(0, int(last_held.max()) - step + 1)
