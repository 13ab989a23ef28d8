"""Temperature from power, through time: a two-stage thermal model over the rack's inlet air.

A GPU's temperature does not follow its power at once: the die warms over the cold plate (or
heatsink) within seconds, the cold plate over the inlet within minutes. The twin integrates both
stages exactly for a zero-order-held power (x[k] = a x[k-1] + (1 - a) u[k], a = exp(-dt / tau)), so the
result is right at any cadence, and carries each stage's state from one chunk to the next. A drop in
power (a checkpoint, a data stall, an evaluation) then leaves the GPU warmer than its power alone
explains for a few minutes, on every healthy GPU, as on real hardware.

The thermal resistance (C per W over inlet) is the generation's datasheet-derived figure times the
world's `thermal_resistance_scale`; 40% of it sits in the die stage, 60% in the cold plate. The time
constants are the world's `tau_die_s` and `tau_sink_s` (no measured public figure: priors, see
docs/failure-modes.md), spread +-15% per GPU. HBM follows the cold plate, a few degrees warmer.

Throttling lowers the power reported (sim/generate.py) but not the temperature: the stages take
the power before thermal slowdown, so a GPU deep in slowdown never cools itself and its temperature
is overstated by a few degrees. That only happens under a failing cooler or a room cooling event.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter

_DIE_SHARE = 0.4


def first_order(u: np.ndarray, previous: np.ndarray, tau_s: np.ndarray, cadence_s: float) -> np.ndarray:
    """x[k] = a x[k-1] + (1 - a) u[k] along axis 0, from x[-1] = `previous`; `tau_s` per column."""
    a = np.exp(-cadence_s / np.maximum(tau_s, 1e-9))
    out = np.empty_like(u, dtype=np.float64)
    for column in range(u.shape[1]):  # lfilter takes one coefficient set: a GPU at a time (8 calls)
        ak = float(a[column])
        filtered, _ = lfilter([1.0 - ak], [1.0, -ak], u[:, column], zi=[ak * float(previous[column])])
        out[:, column] = filtered
    return out


def stage_rises(
    power_w: np.ndarray,
    c_per_w: np.ndarray,
    tau_die_s: np.ndarray,
    tau_sink_s: np.ndarray,
    state: tuple[np.ndarray, np.ndarray],
    cadence_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(die rise over the cold plate, cold-plate rise over inlet), each (T, G), from the power per
    step and the stages' rises at the end of the previous chunk (`state`: die, sink)."""
    die = first_order(power_w * (_DIE_SHARE * c_per_w), state[0], tau_die_s, cadence_s)
    sink = first_order(power_w * ((1.0 - _DIE_SHARE) * c_per_w), state[1], tau_sink_s, cadence_s)
    return die, sink


def daily_cycle_c(t_unix_s: np.ndarray, amplitude_c: float) -> np.ndarray:
    """The daily inlet cycle: +-amplitude around the mean, warmest mid-afternoon (UTC)."""
    hour = (t_unix_s % 86_400.0) / 3600.0
    return amplitude_c * np.sin(2.0 * math.pi * (hour - 9.0) / 24.0)


def weather_c(t_unix_s: np.ndarray, day_offsets: np.ndarray, first_day: int) -> np.ndarray:
    """Day-to-day drift shared by the whole fleet: one offset per day, linear between midday points.
    `day_offsets[i]` belongs to day `first_day + i` (days since the epoch)."""
    days = t_unix_s / 86_400.0 - 0.5 - first_day
    drift: np.ndarray = np.interp(days, np.arange(len(day_offsets)), day_offsets)
    return drift
