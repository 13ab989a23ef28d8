"""Rolling windows over a fixed time grid, for many series at once: the building blocks of the features.

`Ring` keeps the last rows of an (slots, series) array so any recent span is one slice; `Windowed`
keeps running totals over it, so a window's mean and spread cost O(1) per step whatever its length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class Ring:
    """The last `size` rows of an (n, s) series, stored twice so any recent span is one slice."""

    def __init__(self, size: int, n: int, s: int, fill: float) -> None:
        self.size = size
        self.data = np.full((2 * size, n, s), fill)
        self.pos = 0  # where the next row goes

    def push(self, row: np.ndarray) -> None:
        self.data[self.pos] = row
        self.data[self.pos + self.size] = row
        self.pos = (self.pos + 1) % self.size

    def last(self, k: int) -> np.ndarray:
        """The last k rows pushed, oldest first, as a view."""
        end = self.pos + self.size
        return self.data[end - k : end]

    def ago(self, k: int) -> np.ndarray:
        """The row pushed k pushes ago (k=1 is the newest)."""
        row: np.ndarray = self.data[self.pos + self.size - k]
        return row

    def push_many(self, rows: np.ndarray, count: int) -> None:
        """As `count` pushes of which `rows` are the last min(count, size), oldest first (the earlier
        ones would be overwritten): O(size) whatever `count`."""
        if len(rows) != min(count, self.size):
            raise ValueError(f"{len(rows)} rows for {count} pushes into a ring of {self.size}")
        at = (self.pos + count - len(rows) + np.arange(len(rows))) % self.size
        self.data[at] = rows
        self.data[at + self.size] = rows
        self.pos = (self.pos + count) % self.size

    def fill_slots(self, slots: np.ndarray, value: np.ndarray | float) -> None:
        self.data[:, slots] = value

    def __getstate__(self) -> dict[str, object]:
        """One copy of the rows (the second half always equals the first): a saved scoring state
        (service/scoring_state.py) is half as large."""
        return {"size": self.size, "pos": self.pos, "rows": self.data[: self.size]}

    def __setstate__(self, state: dict[str, object]) -> None:
        rows = np.asarray(state["rows"])
        self.size, self.pos = int(state["size"]), int(state["pos"])  # type: ignore[call-overload]
        self.data = np.concatenate([rows, rows])


def nan_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


class Windowed:
    """Mean, std, min, max, slope and EWMA over time windows for s series of n slots.

    Sums come from running totals: a window's sum is the total now minus the total w steps ago,
    O(1) per step whatever the window. Min and max scan the ring of raw values.
    """

    def __init__(self, n: int, s: int, windows: Sequence[int], cadence_s: float, full: bool) -> None:
        self.windows = tuple(windows)
        self.cadence_s = cadence_s
        self.full = full  # False: only the window mean (flags)
        size = max(self.windows) + 1
        self.total = np.zeros((n, s, 3))  # running count, sum, sum of squares
        self.totals = Ring(size, n, s * 3, 0.0)
        self.values = Ring(size, n, s, math.nan)
        self.ewma = np.full((len(self.windows), n, s), math.nan)
        self.alpha = [1.0 - math.exp(-cadence_s / (w * cadence_s)) for w in self.windows]

    def reset(self, slots: np.ndarray) -> None:
        """Forget the history of these slots (a new GPU): their windows restart empty."""
        self.totals.fill_slots(slots, self.total[slots].reshape(len(slots), -1))
        self.values.fill_slots(slots, math.nan)
        self.ewma[:, slots] = math.nan

    def update(self, x: np.ndarray) -> list[np.ndarray]:
        seen = ~np.isnan(x)
        xv = np.where(seen, x, 0.0)
        self.total += np.stack([seen, xv, xv * xv], axis=-1)
        n, s = x.shape
        self.totals.push(self.total.reshape(n, -1))
        self.values.push(x)
        out = []
        for k, w in enumerate(self.windows):
            diff = (self.totals.ago(1) - self.totals.ago(w + 1)).reshape(n, s, 3)
            count, total, squares = diff[..., 0], diff[..., 1], diff[..., 2]
            mean = nan_div(total, count)
            out.append(mean)
            if not self.full:
                continue  # nor an EWMA: only full series show one
            a = self.alpha[k]
            e = self.ewma[k]
            self.ewma[k] = np.where(seen, np.where(np.isnan(e), x, e + a * (x - e)), e)
            var = np.maximum(nan_div(squares, count) - mean * mean, 0.0)
            recent = self.values.last(w)
            half = max(1, w // 2)
            new = (self.totals.ago(1) - self.totals.ago(half + 1)).reshape(n, s, 3)
            old = (self.totals.ago(half + 1) - self.totals.ago(min(2 * half, w) + 1)).reshape(n, s, 3)
            slope = (nan_div(new[..., 1], new[..., 0]) - nan_div(old[..., 1], old[..., 0])) / (
                half * self.cadence_s
            )
            out += [
                np.sqrt(var),
                np.fmin.reduce(recent, axis=0),
                np.fmax.reduce(recent, axis=0),
                slope,
                self.ewma[k].copy(),
            ]
        return out

    def skip(self, count: int, x: np.ndarray) -> None:
        """The state `count` calls of `update(x)` would leave, in O(window) work: for steps that
        read nothing (NaN), or 0 (the presence series of absent GPUs). Such steps only move the
        running count, by whole numbers, so the totals are exact; the EWMA does not move (it is
        only kept for full series, which read NaN here)."""
        seen = ~np.isnan(x)
        if np.any(x[seen] != 0.0) or (self.full and seen.any()):
            raise ValueError("only steps that read nothing, or 0 in a series without an EWMA, can be skipped")
        n, s = x.shape
        kept = min(count, self.totals.size)
        done = np.arange(count - kept + 1, count + 1, dtype=np.float64)  # pushes done, of the last kept
        step = np.stack([seen, np.zeros_like(x), np.zeros_like(x)], axis=-1)  # count, sum, squares
        totals = self.total[None] + done[:, None, None, None] * step[None]
        self.totals.push_many(totals.reshape(kept, n, s * 3), count)
        self.values.push_many(np.broadcast_to(x, (kept, n, s)), count)
        self.total = totals[-1]

    def names(self, series: Sequence[str], label: Sequence[str]) -> list[str]:
        out = []
        for lab in label:
            out += [f"{s}_mean_{lab}" for s in series]
            if self.full:
                for stat in ("std", "min", "max", "slope", "ewma"):
                    out += [f"{s}_{stat}_{lab}" for s in series]
        return out
