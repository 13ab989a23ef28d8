"""What a collector scraping every second sees between two of the twin's steps: each step's minimum,
maximum and mean of the summarised gauges (faultcast.step_summary), beside the step's last scrape.

The twin's steps are its cadence (a minute by default); its values are the step's last scrape. Inside
a step:

- a training job's power swings with its iterations (compute, then communication), on every GPU of
  the job at once: a half-swing of `World.step_power_swing` of the board power limit (more for bursty
  jobs, little at idle), the GPU's own sensor noise on top (its peak over 60 scrapes is about 2.3
  standard deviations out, and a power excursion precursor widens that noise);
- a power brake lasts seconds (`Effects.brake_s`): the braked scrapes read 60% power and half the
  clock, so the step's minimum and the brake flag's share show it even when the last scrape, at the
  step's end, missed it (a rack's PDU brake lasts minutes and covers whole steps);
- the die follows power with a time constant of seconds, so temperature swings with a share of the
  power swing (and cools in a brake); clocks under the power cap dip as power swings;
- a frozen exporter repeats one scrape: its summary is that scrape, a range of nothing.
"""

from __future__ import annotations

import numpy as np

from faultcast.sim.fleet import NodeTraits
from faultcast.sim.precursors import Effects
from faultcast.step_summary import SUMMARISED, SUMMARY_COLUMNS

SCRAPE_S = 1.0  # the collector's scrape interval the twin's summaries stand for
_BRAKE_POWER, _BRAKE_CLOCK = 0.6, 0.5  # what a brake leaves of power and clock (as in the step values)
_DIE_SHARE = 0.4  # the die stage's share of a GPU's temperature rise over inlet (sim/thermal.py)
_SENSOR_PEAK = 2.3  # standard deviations the extreme of about 60 Gaussian readings sits out


def step_scrapes(cadence_s: float) -> int:
    """Scrapes behind one step's summary."""
    return max(1, round(cadence_s / SCRAPE_S))


def summarise(
    traits: NodeTraits,
    cadence_s: float,
    swing: np.ndarray,
    busy: np.ndarray,
    last: dict[str, np.ndarray],
    temp_c: np.ndarray,
    fx: Effects,
    r: np.random.Generator,
) -> np.ndarray:
    """(T, G, 1 + len(SUMMARY_COLUMNS)): scrapes, then SUMMARY_COLUMNS' values per step and GPU.

    `swing`: (T,) the job's half power swing as a share of the power limit; `last`: the step's last
    scrape of each SUMMARISED gauge (T, G); `temp_c`: the die temperature before rounding."""
    gen = traits.generation
    n, g = temp_c.shape
    tdp = gen.tdp_w
    braked_last = fx.brake
    share = np.clip(fx.brake_s / cadence_s, 0.0, 1.0)
    share = np.where(braked_last, np.maximum(share, 1.0 / step_scrapes(cadence_s)), share)
    braking = share > 0
    # Power without the brake, and the step's mean around it (the last scrape is one point of the swing).
    power_last = last["power_usage"]
    free = np.where(braked_last, power_last / _BRAKE_POWER, power_last)
    sigma = 0.012 * tdp * (1.0 + fx.power_noise)
    half = np.where(busy, swing, 0.01)[:, None] * tdp * r.uniform(0.6, 1.0, (n, g))
    mean_free = free + r.normal(0.0, 0.3, (n, g)) * sigma
    top = np.minimum(mean_free + half + _SENSOR_PEAK * sigma, 1.02 * tdp)
    bottom = np.maximum(mean_free - half - _SENSOR_PEAK * sigma, 0.8 * gen.idle_w)
    bottom = np.where(braking, np.minimum(bottom, _BRAKE_POWER * mean_free), bottom)
    power_mean = mean_free * (1.0 - (1.0 - _BRAKE_POWER) * share)
    power = _bounded(bottom, top, power_mean, power_last, 3)

    clock_last = last["sm_clock"]
    clock_free = np.where(braked_last & busy[:, None], clock_last / _BRAKE_CLOCK, clock_last)
    capped = (free >= 0.97 * tdp) & busy[:, None]
    clock_low = np.where(capped, clock_free * (1.0 - 0.5 * half / tdp), clock_free)
    clock_low = np.where(braking & busy[:, None], _BRAKE_CLOCK * clock_free, clock_low)
    clock_mean = clock_free * (1.0 - (1.0 - _BRAKE_CLOCK) * share * busy[:, None])
    clock = _bounded(np.round(clock_low / 15.0) * 15.0, clock_free, clock_mean, clock_last, 0)

    c_per_w = gen.thermal_c_per_w
    temp_swing = c_per_w * _DIE_SHARE * 0.5 * (top - bottom)
    dip = c_per_w * _DIE_SHARE * (1.0 - _BRAKE_POWER) * mean_free * (1.0 - np.exp(-fx.brake_s / 5.0))
    noise = 0.4 * _SENSOR_PEAK
    temp_mean = temp_c - temp_swing * (power_last - power_mean) / np.maximum(top - bottom, 1.0)
    temp = _bounded(
        np.round(temp_mean - 0.5 * temp_swing - dip - noise),
        np.round(temp_mean + 0.5 * temp_swing + noise),
        temp_mean,
        last["gpu_temp"],
        0,
    )
    thermal_last = last["throttle_sw_thermal"]
    over = temp[1] - gen.slowdown_temp_c
    crossing = np.clip(over / np.maximum(temp[1] - temp[0], 1.0), 0.0, 1.0)
    thermal = (
        np.where(temp[0] > gen.slowdown_temp_c, 1.0, thermal_last),
        np.where(over > 0, 1.0, thermal_last),
        np.where(temp[0] > gen.slowdown_temp_c, 1.0, np.maximum(crossing, thermal_last * 0.5)),
    )
    brake = _flag(share, braked_last)
    hw_thermal = last["throttle_hw_slowdown"] * ~braked_last  # the part of HW slowdown that is thermal
    slowdown = (
        np.maximum(brake[0], hw_thermal),
        np.maximum(brake[1], hw_thermal),
        np.maximum(share, hw_thermal),
    )
    stats = {
        "gpu_temp": temp,
        "power_usage": power,
        "sm_clock": clock,
        "throttle_hw_power_brake": brake,
        "throttle_hw_slowdown": slowdown,
        "throttle_sw_thermal": thermal,
    }
    out = np.empty((n, g, 1 + len(SUMMARY_COLUMNS)))
    out[..., 0] = step_scrapes(cadence_s)
    for k, name in enumerate(SUMMARISED):
        for s in range(3):
            out[..., 1 + 3 * k + s] = stats[name][s]
    # A frozen exporter repeats one scrape; a GPU with no reading has no summary.
    frozen = fx.frozen[:, None] & np.ones(g, dtype=bool)
    for k, name in enumerate(SUMMARISED):
        for s in range(3):
            column = out[..., 1 + 3 * k + s]
            column[frozen] = last[name][frozen]
            column[np.isnan(last[name])] = np.nan
    out[..., 1:] = out[..., 1:].astype(np.float32)  # as the files store them, so a live twin reads the same
    return out


def _bounded(
    low: np.ndarray, high: np.ndarray, mean: np.ndarray, last: np.ndarray, decimals: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(min, max, mean) that hold the last scrape and each other: min <= mean, last <= max."""
    lo = np.minimum(np.round(low, decimals), last)
    hi = np.maximum(np.round(high, decimals), last)
    return lo, hi, np.clip(mean, lo, hi)


def _flag(share: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 0/1 state on for `share` of the step, `last` at its end: (min, max, mean)."""
    on = last.astype(np.float64)
    return (np.where(share >= 1.0, 1.0, 0.0) * on, np.maximum((share > 0).astype(np.float64), on), share)
