"""How far one signal alone separates a world's precursor-bearing failures from its healthy look-alikes.

From a dataset's telemetry and failure log only (no model): for every mode that can carry a
precursor, its primary signal (the one its precursor always drives, sim/precursors.py) is laid on
the 60 s grid per GPU (per node for node-level modes) and turned into a causal window statistic:

- counters (SBE, NVLink CRC, PCIe replays, IB symbol errors): the increase over the last 30 min,
  a negative step (a counter reset) counting 0 and missing samples skipped;
- gauges (temperature, NVML call seconds, peer latency p99): the mean of the last 30 min minus the
  unit's own median over the 6 h before that window;
- power brakes: the number of minutes in the last 30 with a brake (the precursor brakes more often).

A failure's peak is the statistic's maximum over its catch window [failure - 2 h, failure - 5 min].
Healthy windows are every unit's minutes that are not within 24 h before a failure of the unit (or of
its node, or for a node of any of its GPUs) and not after a failure of the unit itself (a replaced
part). Against them a failure counts separable when its peak rises above the loudest healthy value
(no false alarm at all), or above the budget level: the lowest threshold whose healthy crossings
form at most `budget` episodes per 1,000 healthy unit-days (runs of crossing minutes of one unit,
merged when under 10 min apart).

Neither an upper nor a lower bound of what a model can do: a model combines signals (a weak primary
signal may be carried by another) and cannot pick thresholds per world after the fact as this does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from faultcast.model.evaluation.evaluate import json_safe
from faultcast.model.features.offline import Dataset, Failure, unix_seconds
from faultcast.model.features.parquet_parts import ParquetParts, table_exists
from faultcast.model.features.relative import node_median

Kind = Literal["counter", "gauge", "events"]
Level = Literal["gpu", "node"]

WINDOW_S = 30 * 60.0  # the window a detector sums or averages over
BASELINE_S = 6 * 3600.0  # a gauge's own normal: its median over this long before the window
CATCH_S = (2 * 3600.0, 5 * 60.0)  # catch window: from 2 h to 5 min before the failure
QUIET_BEFORE_S = 24 * 3600.0  # a unit this close before its failure is not healthy
MERGE_S = 10 * 60.0  # crossing runs closer than this are one episode (one alarm)
DEFAULT_BUDGET = 0.5  # false-alarm episodes per 1,000 healthy unit-days
RETAINED_EPISODES = 1000  # per dataset, enough healthy intervals for any pooled budget below this


@dataclass(frozen=True)
class Signal:
    """A mode's primary signal: where it is, how it is turned into a window statistic."""

    column: str
    source: Literal["telemetry", "network"]
    kind: Kind
    level: Level
    statistic: str  # in words, for the report
    fallback: str | None = None  # an older column with the same meaning, when `column` is absent


_SBE = Signal("ecc_sbe_volatile", "telemetry", "counter", "gpu", "SBE increase in 30 min")
SIGNALS: dict[str, Signal] = {
    "hbm_wear": _SBE,
    "gpu_sram": _SBE,
    "cooling": Signal("gpu_temp", "telemetry", "gauge", "gpu", "30-min mean temp minus own 6 h median (C)"),
    "power": Signal(
        "throttle_hw_power_brake_step_mean", "telemetry", "events", "gpu",
        "minutes with a power brake in 30 min", fallback="throttle_hw_power_brake",
    ),
    "nvlink": Signal("nvlink_crc_flit_errors", "telemetry", "counter", "gpu", "NVLink CRC flit increase in 30 min"),
    "pcie": Signal("pcie_replay", "telemetry", "counter", "gpu", "PCIe replay increase in 30 min"),
    "detachment": Signal(
        "nvml_call_seconds", "telemetry", "gauge", "gpu", "30-min mean NVML call s minus own 6 h median"
    ),
    "infiniband": Signal("ib_symbol_error", "network", "counter", "node", "IB symbol error increase in 30 min"),
    "host": Signal(
        "nvml_call_seconds", "telemetry", "gauge", "node",
        "node's median-GPU NVML call s: 30-min mean minus own 6 h median",
    ),
    "nccl_timeout": Signal(
        "peer_rtt_p99_seconds", "network", "gauge", "node", "30-min mean peer p99 s minus own 6 h median"
    ),
}  # fmt: skip
"""Per mode that can carry a precursor: the signal its precursor always shows (sim/precursors.py)."""


# -- the window statistics (each uses only the unit's past: row t depends on rows <= t) --------------


def counter_increase(x: np.ndarray, window: int) -> np.ndarray:
    """(T, U) cumulative counters -> their increase over the last `window` steps. Missing samples are
    carried over (the increase lands when the counter is seen again); a drop is a reset and counts 0;
    NaN where the unit reported nothing in the window."""
    filled = pd.DataFrame(x).ffill().to_numpy()
    delta = np.diff(filled, axis=0, prepend=filled[:1])
    delta = np.where(np.isfinite(delta) & (delta > 0), delta, 0.0)
    total = _trailing_sum(delta, window)
    seen = _trailing_sum(np.isfinite(x).astype(np.float64), window)
    return np.where(seen > 0, total, np.nan)


def gauge_excess(x: np.ndarray, window: int, baseline: int) -> np.ndarray:
    """(T, U) gauges -> the mean of the last `window` steps minus the unit's median over the `baseline`
    steps before that window (its own normal, so a hot card or a slow host is not an alarm for life).
    NaN until a third of the window and a sixth of the baseline were seen."""
    frame = pd.DataFrame(x)
    recent = frame.rolling(window, min_periods=max(1, window // 3)).mean()
    normal = frame.rolling(baseline, min_periods=max(1, baseline // 6)).median().shift(window)
    return np.asarray((recent - normal).to_numpy(), dtype=np.float64)


def event_minutes(x: np.ndarray, window: int) -> np.ndarray:
    """(T, U) per-step event shares (a brake's share of the step) -> the number of steps in the last
    `window` with any event; NaN where the unit reported nothing in the window."""
    seen = np.isfinite(x)
    hits = _trailing_sum((seen & (np.nan_to_num(x) > 0)).astype(np.float64), window)
    return np.where(_trailing_sum(seen.astype(np.float64), window) > 0, hits, np.nan)


def _trailing_sum(x: np.ndarray, window: int) -> np.ndarray:
    """Sum of rows (t - window, t] per column, by cumulative sums (exact for the integers it sums)."""
    total = np.cumsum(x, axis=0)
    total[window:] = total[window:] - total[:-window]
    return total


def memory_steps(kind: Kind, cadence_s: float) -> int:
    """How many steps back a statistic of `kind` looks (its window, and a gauge's baseline)."""
    seconds = WINDOW_S + (BASELINE_S if kind == "gauge" else 0.0)
    return round(seconds / cadence_s)


def statistic(x: np.ndarray, kind: Kind, cadence_s: float) -> np.ndarray:
    """The window statistic of a signal of `kind` on a grid of `cadence_s`."""
    window = max(1, round(WINDOW_S / cadence_s))
    if kind == "counter":
        return counter_increase(x, window)
    if kind == "events":
        return event_minutes(x, window)
    return gauge_excess(x, window, max(1, round(BASELINE_S / cadence_s)))


# -- episodes and the budget level -------------------------------------------------------------------


def episode_intervals(healthy: np.ndarray, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Each step that starts an episode for some thresholds: the thresholds thr with lo <= thr < hi.
    A healthy value hi (NaN where not healthy) starts one when thr < hi and none of the `merge`
    values before it exceeds thr (lo: their max). So the episodes at thr are the intervals holding it."""
    values = np.where(np.isfinite(healthy), healthy, -np.inf)
    padded = np.vstack([np.full((merge, values.shape[1]), -np.inf), values])
    before = np.lib.stride_tricks.sliding_window_view(padded[:-1], merge, axis=0).max(axis=-1)
    keep = values > before
    return before[keep], values[keep]


def budget_level(lo: np.ndarray, hi: np.ndarray, allowed: int) -> float:
    """The lowest threshold at and above which the intervals (episodes) holding it number at most
    `allowed`: just at the highest upper end below which more than `allowed` are open. -inf when no
    threshold has more (then the caller bounds it by the healthy values)."""
    if len(hi) == 0:
        return -math.inf
    ends = np.unique(hi)
    open_below = np.searchsorted(np.sort(lo), ends, "left") - np.searchsorted(np.sort(hi), ends, "left")
    over = ends[open_below > allowed]
    return float(over.max()) if len(over) else -math.inf


def allowed_episodes(budget: float, healthy_days: float) -> int:
    """Episodes a budget of `budget` per 1,000 unit-days allows over `healthy_days`."""
    return math.floor(budget * healthy_days / 1000.0 + 1e-9)


# -- laying a dataset on the grid ----------------------------------------------------------------------


@dataclass
class _Grid:
    """A dataset's columns on its (steps, units) grid, read once per column."""

    data: Dataset
    steps: int
    cache: dict[tuple[str, str], np.ndarray | None] = field(default_factory=dict)
    cells: dict[str, tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)  # per file
    stats: dict[Signal, np.ndarray | None] = field(default_factory=dict)  # hbm_wear and gpu_sram share one
    tables: dict[str, ParquetParts | None] = field(default_factory=dict)  # per file; None: absent

    def column(self, source: str, name: str) -> np.ndarray | None:
        """(steps, units) of `name` (GPU units for telemetry, node units for network); None if absent."""
        key = (source, name)
        if key not in self.cache:
            self.cache[key] = self._read(source, name)
        return self.cache[key]

    def _read(self, source: str, name: str) -> np.ndarray | None:
        if source not in self.tables:  # a file or a directory of them (model/features/parquet_parts.py)
            path = self.data.path / f"{source}.parquet"
            self.tables[source] = ParquetParts(path) if table_exists(path) else None
        table = self.tables[source]
        if table is None or name not in table.schema_arrow.names:
            return None
        if source not in self.cells:
            self.cells[source] = _cells(self.data, self.steps, table, source == "telemetry")
        rows, flat, units = self.cells[source]
        values = table.read([name]).column(0).to_numpy(zero_copy_only=False)
        grid = np.full(self.steps * units, np.nan)
        grid[flat] = np.asarray(values, dtype=np.float64)[rows]
        return grid.reshape(self.steps, units)


def _cells(
    data: Dataset, steps: int, table: ParquetParts, per_gpu: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Which rows of a table land in which grid cell (step * units + unit): the last sample of a unit
    within a step wins, as online; rows off the grid or of unknown nodes are dropped."""
    frame = table.read(["timestamp", "node", *(["gpu"] if per_gpu else [])]).to_pandas()
    nodes = frame["node"].astype("category")
    index = {n: i for i, n in enumerate(data.nodes)}
    known = np.array([index.get(str(c), -1) for c in nodes.cat.categories] + [-1], dtype=np.int64)
    node = known[nodes.cat.codes.to_numpy()]  # code -1 (missing) takes the trailing -1
    unit = node * data.gpus_per_node + frame["gpu"].to_numpy(dtype=np.int64) if per_gpu else node
    step = np.round((unix_seconds(frame["timestamp"]) - data.start_s) / data.cadence_s)
    units = len(data.nodes) * (data.gpus_per_node if per_gpu else 1)
    ok = (node >= 0) & (step >= 0) & (step < steps)
    rows = np.nonzero(ok)[0]
    flat = step[ok].astype(np.int64) * units + unit[ok]
    order = np.argsort(flat, kind="stable")
    rows, flat = rows[order], flat[order]
    last = np.append(flat[1:] != flat[:-1], True)
    return rows[last], flat[last], units


def signal_grid(grid: _Grid, signal: Signal) -> np.ndarray | None:
    """The signal per unit of its level on the grid; None when the data lacks it."""
    values = grid.column(signal.source, signal.column)
    if values is None and signal.fallback is not None:
        values = grid.column(signal.source, signal.fallback)
    if values is None:
        return None
    if signal.level == "node" and signal.source == "telemetry":
        # (T, N*G) -> (N, G, T): each node's median over its reporting GPUs, the engine's own median.
        steps, gpus = len(values), grid.data.gpus_per_node
        by_node = values.reshape(steps, -1, gpus).transpose(1, 2, 0)
        return np.asarray(node_median(by_node).T)
    return values


# -- healthy windows and failure peaks ----------------------------------------------------------------


def _unit_of(f: Failure, level: Level, gpus: int) -> int | None:
    """The unit a failure happened on at `level`; None when the failure is not of that level."""
    if level == "node":
        return f.node if f.gpu < 0 else None
    return f.node * gpus + f.gpu if f.gpu >= 0 else None


def healthy_mask(
    data: Dataset, level: Level, steps: int, memory: int = 0, exclude_after: bool = True
) -> np.ndarray:
    """(steps, units) True where a unit counts healthy: its statistic (which looks `memory` steps
    back) sees nothing of the QUIET_BEFORE_S before a failure of it or of its node (for a node: of any
    of its GPUs), and (`exclude_after`) not after a failure of the unit itself: a replaced part."""
    gpus = data.gpus_per_node
    units = len(data.nodes) * (gpus if level == "gpu" else 1)
    mask = np.ones((steps, units), dtype=bool)
    quiet = round(QUIET_BEFORE_S / data.cadence_s)
    for f in data.failures.rows():
        at = math.floor((f.time_s - data.start_s) / data.cadence_s)
        own = _unit_of(f, level, gpus)
        if own is not None:
            touched = [own]
        elif level == "gpu":  # a node-level failure: every GPU of the node
            touched = list(range(f.node * gpus, (f.node + 1) * gpus))
        else:  # a GPU failure: its node
            touched = [f.node]
        end = (
            steps if own is not None and exclude_after else at + 1 + memory
        )  # only the unit's own failure replaces it
        mask[max(0, at - quiet) : max(0, end), touched] = False
    return mask


def catch_peak(stat: np.ndarray, data: Dataset, unit: int, time_s: float) -> float:
    """The statistic's max over the catch window before `time_s` on `unit`; NaN without data."""
    first = math.ceil((time_s - CATCH_S[0] - data.start_s) / data.cadence_s)
    last = math.floor((time_s - CATCH_S[1] - data.start_s) / data.cadence_s)
    window = stat[max(0, first) : max(0, min(last + 1, len(stat))), unit]
    finite = window[np.isfinite(window)]
    return float(finite.max()) if len(finite) else math.nan


# -- the measure ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailurePeak:
    """One precursor-bearing failure and its signal's peak in its catch window."""

    time_s: float
    node: int
    gpu: int
    precursor_s: float
    peak: float  # NaN when the unit had no data in the catch window


@dataclass(frozen=True)
class ModeSeparability:
    """One mode's failures against its signal's healthy look-alikes in one dataset (or pooled)."""

    mode: str
    statistic: str
    level: Level
    peaks: tuple[FailurePeak, ...]
    loudest: float  # the max healthy value (NaN without healthy data)
    budget_level: float
    healthy_days: float  # healthy unit-days (GPU-days or node-days) with a defined statistic
    allowed: int  # episodes the budget allows over them
    # The healthy episode intervals above the dataset's level at RETAINED_EPISODES, for pooling.
    intervals: tuple[np.ndarray, np.ndarray] = field(repr=False, compare=False)

    @property
    def failures(self) -> int:
        return len(self.peaks)

    @property
    def above_loudest(self) -> int:
        """Failures whose peak rises above every healthy window: separable with no false alarm."""
        return sum(p.peak > self.loudest for p in self.peaks)

    @property
    def above_budget(self) -> int:
        """Failures whose peak rises above the budget level."""
        return sum(p.peak > self.budget_level for p in self.peaks)

    @property
    def no_data(self) -> int:
        """Failures whose unit reported nothing in the catch window."""
        return sum(math.isnan(p.peak) for p in self.peaks)


def _levels(lo: np.ndarray, hi: np.ndarray, healthy_days: float, budget: float) -> tuple[float, float, int]:
    """(loudest, budget level, allowed episodes) of healthy episode intervals."""
    if len(hi) == 0:
        return math.nan, math.nan, 0
    loudest, floor = float(hi.max()), float(hi.min())
    allowed = allowed_episodes(budget, healthy_days)
    return loudest, max(budget_level(lo, hi, allowed), floor), allowed


def mode_separability(
    data: Dataset, grid: _Grid, mode: str, budget: float = DEFAULT_BUDGET, exclude_after: bool = True
) -> ModeSeparability:
    """One mode of one dataset: its precursor-bearing failures' peaks against its healthy windows."""
    signal = SIGNALS[mode]
    log = data.failures
    rows = log.rows((log.mode == mode) & (log.precursor_s > 0))
    if signal not in grid.stats:
        values = signal_grid(grid, signal)
        grid.stats[signal] = None if values is None else statistic(values, signal.kind, data.cadence_s)
    stat = grid.stats[signal]
    if stat is None:
        peaks = tuple(FailurePeak(f.time_s, f.node, f.gpu, f.precursor_s, math.nan) for f in rows)
        empty = np.empty(0)
        return ModeSeparability(
            mode, signal.statistic, signal.level, peaks, math.nan, math.nan, 0.0, 0, (empty, empty)
        )
    peaks = tuple(
        FailurePeak(
            f.time_s, f.node, f.gpu, f.precursor_s,
            math.nan if (u := _unit_of(f, signal.level, data.gpus_per_node)) is None
            else catch_peak(stat, data, u, f.time_s),
        )
        for f in rows
    )  # fmt: skip
    memory = memory_steps(signal.kind, data.cadence_s)
    healthy = np.where(healthy_mask(data, signal.level, grid.steps, memory, exclude_after), stat, np.nan)
    days = float(np.isfinite(healthy).sum()) * data.cadence_s / 86_400.0
    lo, hi = episode_intervals(healthy, max(1, round(MERGE_S / data.cadence_s)))
    loudest, level, allowed = _levels(lo, hi, days, budget)
    keep = hi > budget_level(lo, hi, RETAINED_EPISODES)
    return ModeSeparability(mode, signal.statistic, signal.level, peaks, loudest, level, days, allowed,
                            (lo[keep], hi[keep]))  # fmt: skip


def separability(
    data: Dataset,
    *,
    budget: float = DEFAULT_BUDGET,
    modes: Sequence[str] = tuple(SIGNALS),
    exclude_after: bool = True,
) -> list[ModeSeparability]:
    """Every mode of `modes` in one dataset (`exclude_after`: see healthy_mask)."""
    grid = _Grid(data, math.ceil((data.end_s - data.start_s) / data.cadence_s - 1e-9))
    return [mode_separability(data, grid, mode, budget, exclude_after) for mode in modes]


def pooled(
    per_dataset: Sequence[Sequence[ModeSeparability]], budget: float = DEFAULT_BUDGET
) -> list[ModeSeparability]:
    """One common threshold per mode across the datasets (their healthy windows and days together):
    what a single fleet-wide threshold separates. Exact while the pooled budget allows at most
    RETAINED_EPISODES episodes."""
    out = []
    for parts in zip(*per_dataset, strict=True):
        first = parts[0]
        lo = np.concatenate([p.intervals[0] for p in parts])
        hi = np.concatenate([p.intervals[1] for p in parts])
        days = sum(p.healthy_days for p in parts)
        loudest, level, allowed = _levels(lo, hi, days, budget)
        if allowed > RETAINED_EPISODES:
            raise ValueError(f"a pooled budget of {allowed} episodes is past the {RETAINED_EPISODES} kept")
        peaks = tuple(p for part in parts for p in part.peaks)
        out.append(ModeSeparability(first.mode, first.statistic, first.level, peaks, loudest, level, days,
                                    allowed, (lo, hi)))  # fmt: skip
    return out


def report_rows(result: Sequence[ModeSeparability]) -> list[dict[str, object]]:
    """JSON-ready rows (without the episode intervals; NaN as null)."""
    rows: list[dict[str, object]] = json_safe([
        {
            "mode": m.mode, "statistic": m.statistic, "level": m.level,
            "precursor_failures": m.failures, "above_loudest": m.above_loudest,
            "above_budget": m.above_budget, "no_data": m.no_data,
            "loudest_healthy": m.loudest, "budget_level": m.budget_level,
            "healthy_unit_days": round(m.healthy_days, 2), "allowed_episodes": m.allowed,
            "peaks": [
                {"time_s": p.time_s, "node": p.node, "gpu": p.gpu, "precursor_s": p.precursor_s,
                 "peak": p.peak}
                for p in m.peaks
            ],
        }
        for m in result
    ])  # fmt: skip
    return rows
