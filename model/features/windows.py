"""Rolling windows over a fixed time grid, for many series at once: the building blocks of the features.

`Ring` keeps the last rows of an (slots, series) array so any recent span is one slice; `Windowed`
keeps running totals over it, so a window's mean and spread cost O(1) per step whatever its length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class DerivedState:
    """A part of the engine's state with derived attributes (index arrays, running extremes: the
    names in `_DERIVED`) that `_derive` computes from the rest. They are not saved with a scoring
    state (service/scoring_state.py pickles the engine), so a saved state is what it always was, and
    one saved before they existed is taken back too."""

    _DERIVED: tuple[str, ...] = ()

    def _derive(self) -> None:
        """Compute the derived attributes from the state."""

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k not in self._DERIVED}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._derive()


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
    """a / b where b > 0, else NaN."""
    out = np.full(np.broadcast_shapes(a.shape, b.shape), math.nan)
    return _nan_div_into(a, b, out)


def _nan_div_into(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, positive: np.ndarray | None = None
) -> np.ndarray:
    """`nan_div` written into `out` (which may be a view into a larger array); `positive`: scratch for
    b > 0, of out's shape."""
    positive = np.greater(b, 0, out=positive)
    out[...] = math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(a, b, out=out, where=positive)
    return out


def split_columns(block: np.ndarray, *shape: int) -> np.ndarray:
    """An (n, prod(shape)) block of columns as an (n, *shape) view; never a copy (the writes must land)."""
    return np.reshape(block, (block.shape[0], *shape), copy=False)


class RunningExtremes:
    """The min and max (ignoring NaN) of the last `w` rows pushed into a Ring, O(1) a step amortised
    instead of a scan of the window (van Herk / Gil-Werman): pushes fall in blocks of `w`; the window
    ending at a push is the part of the previous block after its offset (a suffix extreme, computed
    once when that block completes) plus the current block so far (a running prefix extreme). fmin and
    fmax give the same value in any order (only the sign of a zero among equal zeros may differ), so
    the extremes are those of a scan. Derived state: rebuilt from the ring whenever the ring is changed
    otherwise than by one push (a skip, a reset, a restored state)."""

    def __init__(self, w: int, n: int, s: int) -> None:
        self.w = w
        self._prefix = np.full((2, n, s), math.nan)  # min, max of the current block so far
        self._suffix = np.full((2, w, n, s), math.nan)  # of the previous block from each offset on
        self._offset = w - 1  # of the last push within its block

    def rebuild(self, ring: Ring) -> None:
        """Start over from the ring's last `w` rows, taken as a completed block."""
        recent, low, high = ring.last(self.w), self._suffix[0], self._suffix[1]
        low[-1] = high[-1] = recent[-1]
        for j in range(self.w - 2, -1, -1):  # row by row: ufunc.accumulate along axis 0 is 30x slower
            np.fmin(recent[j], low[j + 1], out=low[j])
            np.fmax(recent[j], high[j + 1], out=high[j])
        self._offset = self.w - 1

    def push(self, x: np.ndarray, ring: Ring, low: np.ndarray, high: np.ndarray) -> None:
        """After `x` was pushed into `ring`: the window's min into `low`, its max into `high`."""
        o = self._offset = (self._offset + 1) % self.w
        if o == 0:
            self._prefix[0] = x
            self._prefix[1] = x
        else:
            np.fmin(self._prefix[0], x, out=self._prefix[0])
            np.fmax(self._prefix[1], x, out=self._prefix[1])
        if o == self.w - 1:  # the block is complete: it is the window
            low[...] = self._prefix[0]
            high[...] = self._prefix[1]
            self.rebuild(ring)
        else:
            np.fmin(self._suffix[0, o + 1], self._prefix[0], out=low)
            np.fmax(self._suffix[1, o + 1], self._prefix[1], out=high)


@dataclass(frozen=True)
class _Scratch:
    """Arrays a Windowed step works in."""

    seen: np.ndarray  # (n, s) bool
    xv: np.ndarray  # (n, s)
    diff: np.ndarray  # (spans, n, 3s): the totals over each span
    positive: np.ndarray  # (spans, n, s) bool
    work: np.ndarray  # (2 windows, n, s)
    other: np.ndarray  # (windows, n, s)


class Windowed(DerivedState):
    """Mean, std, min, max, slope and EWMA over time windows for s series of n slots.

    Sums come from running totals: a window's sum is the total now minus the total w steps ago,
    O(1) per step whatever the window; min and max come from RunningExtremes over the ring of raw
    values. Every window is computed in one array operation per statistic.
    """

    _DERIVED = ("_ago_end", "_ago_start", "_alpha", "_half_s", "_extremes", "_scratch")

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
        self._derive()

    @property
    def width(self) -> int:
        """Columns of the output: per window the mean (and std, min, max, slope, EWMA when full)."""
        return len(self.windows) * (6 if self.full else 1) * self.total.shape[1]

    def _derive(self) -> None:
        """The derived state (not saved with the engine): index arrays, the running extremes and the
        scratch arrays a step works in (fresh large temporaries every step cost more than the sums)."""
        n, s, _ = self.total.shape
        w = np.array(self.windows)
        half = np.maximum(1, w // 2)
        # How many pushes ago each difference of totals starts and ends: the windows, then (full only)
        # the newer and the older half of each window (the slope).
        ends = [np.ones_like(w), *([np.ones_like(w), half + 1] if self.full else [])]
        starts = [w + 1, *([half + 1, np.minimum(2 * half, w) + 1] if self.full else [])]
        self._ago_end, self._ago_start = np.concatenate(ends).tolist(), np.concatenate(starts).tolist()
        self._alpha = np.array(self.alpha)[:, None, None]
        self._half_s = (half * self.cadence_s).astype(np.float64)[:, None, None]
        self._extremes = [RunningExtremes(int(k), n, s) for k in self.windows] if self.full else []
        for extremes in self._extremes:
            extremes.rebuild(self.values)
        k = len(self.windows)
        self._scratch = _Scratch(
            seen=np.empty((n, s), dtype=bool),
            xv=np.empty((n, s)),
            diff=np.empty((len(self._ago_end), n, s * 3)),
            positive=np.empty((len(self._ago_end), n, s), dtype=bool),
            work=np.empty((2 * k, n, s)),
            other=np.empty((k, n, s)),
        )

    def reset(self, slots: np.ndarray) -> None:
        """Forget the history of these slots (a new GPU): their windows restart empty."""
        self.totals.fill_slots(slots, self.total[slots].reshape(len(slots), -1))
        self.values.fill_slots(slots, math.nan)
        self.ewma[:, slots] = math.nan
        for extremes in self._extremes:
            extremes.rebuild(self.values)

    def update(self, x: np.ndarray, out: np.ndarray | None = None) -> list[np.ndarray]:
        """Push a step's values (n, s); the statistics in `write`'s order, one (n, s) array each."""
        n, s = x.shape
        block = np.empty((n, self.width)) if out is None else out
        self.write(x, block)
        return [block[:, i * s : (i + 1) * s] for i in range(block.shape[1] // s)]

    def write(self, x: np.ndarray, out: np.ndarray) -> None:
        """Push a step's values (n, s) and write the statistics into `out` (n, width): per window the
        mean, then (full) the std, min, max, slope and a copy of the EWMA, each s columns."""
        n, s = x.shape
        t = self._scratch
        seen = np.logical_not(np.isnan(x, out=t.seen), out=t.seen)
        xv = t.xv
        xv[...] = 0.0
        np.copyto(xv, x, where=seen)
        total = self.total
        total[..., 0] += seen
        total[..., 1] += xv
        total[..., 2] += np.multiply(xv, xv, out=xv)
        self.totals.push(total.reshape(n, -1))
        self.values.push(x)
        ring, at = self.totals.data, self.totals.pos + self.totals.size
        for i, (end, start) in enumerate(zip(self._ago_end, self._ago_start, strict=True)):
            np.subtract(ring[at - end], ring[at - start], out=t.diff[i])
        # (spans, n, s, 3): count, sum and sum of squares over each span.
        diff = np.reshape(t.diff, (-1, n, s, 3), copy=False)
        k = len(self.windows)
        stats = split_columns(out, k, 6 if self.full else 1, s).transpose(1, 2, 0, 3)  # (k, stat, n, s)
        mean = _nan_div_into(diff[:k, ..., 1], diff[:k, ..., 0], stats[:, 0], t.positive[:k])
        if not self.full:
            return
        e, moved = self.ewma, t.work[:k]
        np.subtract(x, e, out=moved)
        moved *= self._alpha
        moved += e
        np.copyto(moved, x, where=np.isnan(e))
        np.copyto(e, moved, where=seen)
        stats[:, 5] = e
        var = _nan_div_into(diff[:k, ..., 2], diff[:k, ..., 0], t.work[:k], t.positive[:k])
        var -= np.multiply(mean, mean, out=t.other)
        np.maximum(var, 0.0, out=var)
        np.sqrt(var, out=stats[:, 1])
        halves = _nan_div_into(diff[k:, ..., 1], diff[k:, ..., 0], t.work, t.positive[k:])
        np.subtract(halves[:k], halves[k:], out=t.other)
        np.divide(t.other, self._half_s, out=stats[:, 4])
        for i, extremes in enumerate(self._extremes):
            extremes.push(x, self.values, stats[i, 2], stats[i, 3])

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
        for extremes in self._extremes:
            extremes.rebuild(self.values)

    def names(self, series: Sequence[str], label: Sequence[str]) -> list[str]:
        out = []
        for lab in label:
            out += [f"{s}_mean_{lab}" for s in series]
            if self.full:
                for stat in ("std", "min", "max", "slope", "ewma"):
                    out += [f"{s}_{stat}_{lab}" for s in series]
        return out
