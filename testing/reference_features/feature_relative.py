"""Features that mean the same on any fleet: each GPU against its own history and against its peers.

A hot rack, a hot afternoon, a warmer data hall or a job at the power cap moves every GPU around it;
a failing part moves one. Absolute readings carry the fleet's climate and workload with them, which is
what made a model trained on one world raise alarms on another. These series cancel it:

- against its peers: the GPUs of the same node share the inlet air, the power shelf and the job, so a
  reading minus the node's median (`FeatureEngine._relative_to_node`) or a counter's rate minus the
  node's mean rate cancels the room, the hour and the job phase;
- against itself: how far the recent mean sits from the GPU's own slow baseline, in its own standard
  deviations (a card that always ran hot is not news; one that warms over an hour is);
- counters against the background: events per hour over the last hour, on a log scale, minus the GPU's
  (or the node's, for the network) own slow baseline (SBE-heavy healthy cards and a PCIe replay trickle
  that never changes cancel; a rise does not).

Peers stop at the node on purpose: the service keeps each node's features apart (one node's clock must
never make another's samples late), and the same code runs offline, so a feature may not look across
nodes.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

BASELINE_TAU_S = 24 * 3600.0  # own history: slow enough that an hour's drift stands out against it


class OwnBaseline:
    """Per slot and series: an EWMA of the mean and variance with time constant `tau_s`, updated where
    a value is seen. `z` is the distance of a value from it in standard deviations."""

    def __init__(self, slots: int, series: int, cadence_s: float, tau_s: float, min_std: np.ndarray) -> None:
        self.alpha = 1.0 - math.exp(-cadence_s / tau_s)
        self.mean = np.full((slots, series), math.nan)
        self.var = np.zeros((slots, series))
        self.seen = np.zeros((slots, series))  # how many values went in (a young baseline says little)
        self.min_std = min_std

    def reset(self, slots: np.ndarray) -> None:
        self.mean[slots] = math.nan
        self.var[slots] = 0.0
        self.seen[slots] = 0.0

    def z(self, recent: np.ndarray) -> np.ndarray:
        """(slots, series): (recent - baseline mean) / baseline std; NaN until the baseline has an
        hour's worth of values."""
        std = np.maximum(np.sqrt(self.var), self.min_std)
        young = self.seen * self.alpha < 1.0 - math.exp(-1.0 / 24.0)  # under about an hour at tau 24 h
        with np.errstate(invalid="ignore"):
            return np.where(young | np.isnan(recent), math.nan, (recent - self.mean) / std)

    def update(self, x: np.ndarray) -> None:
        seen = ~np.isnan(x)
        first = seen & np.isnan(self.mean)
        a = self.alpha
        delta = np.where(seen, x - np.where(np.isnan(self.mean), 0.0, self.mean), 0.0)
        later = seen & ~first
        self.mean = np.where(first, x, np.where(later, self.mean + a * delta, self.mean))
        self.var = np.where(later, (1 - a) * (self.var + a * delta * delta), self.var)
        self.seen += seen


class RateBaseline:
    """Per slot and counter group: an EWMA of the hourly event rate (log scale) with time constant
    `tau_s`, fed with the last hour's rate where the counter was read. It starts once a slot's counter
    has been read for `warm_steps`: a window not yet full of history understates the rate."""

    def __init__(self, slots: int, groups: int, cadence_s: float, tau_s: float, warm_steps: int) -> None:
        self.alpha = 1.0 - math.exp(-cadence_s / tau_s)
        self.warm_steps = warm_steps
        self.level = np.full((slots, groups), math.nan)
        self.first = np.full((slots, groups), -1, dtype=np.int64)  # the step a slot's counter was first read

    def reset(self, slots: np.ndarray) -> None:
        self.level[slots] = math.nan
        self.first[slots] = -1

    def excess(self, log_rate: np.ndarray) -> np.ndarray:
        """(slots, groups): the log rate now minus the baseline before this step (NaN when unknown)."""
        return np.asarray(log_rate - self.level)

    def update(self, step: int, log_rate: np.ndarray) -> None:
        """Feed this step's log rates (NaN where the counter was not read in the step)."""
        seen = ~np.isnan(log_rate)
        self.first = np.where(seen & (self.first < 0), step, self.first)
        seen &= step - self.first >= self.warm_steps
        self.level = np.where(
            seen,
            np.where(np.isnan(self.level), log_rate, self.level + self.alpha * (log_rate - self.level)),
            self.level,
        )


def log_hourly(rate_per_s: np.ndarray) -> np.ndarray:
    """Events per second as log1p(events per hour): one event an hour and ten thousand differ by 9, not
    by ten thousand, so a quiet fleet and a noisy one share a scale."""
    return np.asarray(np.log1p(np.maximum(rate_per_s, 0.0) * 3600.0))


def minus_node_mean(values: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """(slots, series): each GPU's value minus the mean of its node's GPUs that have one."""
    by_node = values.reshape(-1, gpus_per_node, values.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a node none of whose GPUs has a value
        mean = np.nanmean(by_node, axis=1)
    return np.asarray((by_node - mean[:, None, :]).reshape(values.shape))
