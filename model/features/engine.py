"""Streaming features: ONE implementation, used offline over a table and online per sample.

The engine advances one step of a fixed time grid (the model's cadence) at a time and updates the
state of every GPU slot at once, in numpy arrays indexed by slot (slot = node * gpus_per_node +
gpu). Training drives it over the twin's files (`faultcast.model.features.offline`); the service drives it
with live samples resampled to the same grid (`faultcast.model.features.online`). Both call `update`, so a
feature means the same thing in both places; tests/test_features.py replays a simulated week both
ways and compares.

Windows are in time (5, 15 and 60 minutes by default) and counters become rates per second, so a
feature means the same at any cadence; the cadence is a parameter recorded with the model. Samples
sparser than the grid are held across their gap and frozen exporters are recognised
(`faultcast.model.features.inputs`); readings are also taken against the GPU's own history and its
peers' (`faultcast.model.features.relative`), so that a fleet's climate and workload cancel out.
The engine serves any number of GPUs per node: the node size is the data's, not the model's.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from faultcast.catalogue import TRACKED_XIDS
from faultcast.model.features.history import HISTORY_NAMES, NO_HISTORY
from faultcast.model.features.inputs import InputConditioner
from faultcast.model.features.relative import (
    BASELINE_TAU_S,
    OwnBaseline,
    RateBaseline,
    log_hourly,
    minus_node_mean,
    node_median,
)
from faultcast.model.features.steps import StepFeatures
from faultcast.model.features.windows import DerivedState, Ring, Windowed, split_columns

# -- the raw inputs ------------------------------------------------------------------------------

# Gauges summarised over windows (mean, std, min, max, slope, EWMA). thermal_residual and
# pcie_width_deficit are derived below; the rest are catalogue columns.
WINDOW_GAUGES = (
    "gpu_temp", "memory_temp", "power_usage", "sm_clock", "gpu_util", "thermal_residual",
    "nvml_call_seconds", "pcie_width_deficit",
)  # fmt: skip  # names packed, not one per line
# 0/1 states: the current value and the share of each window they were on.
FLAGS = (
    "throttle_hw_slowdown", "throttle_sw_thermal", "throttle_hw_thermal", "throttle_hw_power_brake",
    "throttle_sw_power_cap", "row_remap_pending", "row_remap_failure",
)  # fmt: skip  # names packed, not one per line
_MEMORY_XIDS = (48, 63, 64, 92, 94, 95)
# Inputs every collector reads: how many of them a GPU's row lacks is itself a feature.
_CORE_INPUTS = ("gpu_temp", "power_usage", "sm_clock", "gpu_util", "ecc_sbe_volatile", "pcie_replay")
# Counter groups: per-second rate now, and events per second over each window; robust to resets.
RATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sbe", ("ecc_sbe_volatile",)),
    ("dbe", ("ecc_dbe_volatile",)),
    ("row_remap", ("remapped_rows_correctable", "remapped_rows_uncorrectable")),
    ("pcie_replay", ("pcie_replay",)),
    ("nvlink_crc_flit", ("nvlink_crc_flit_errors",)),
    ("nvlink_crc_data", ("nvlink_crc_data_errors",)),
    ("nvlink_replay", ("nvlink_replay_errors",)),
    ("nvlink_recovery", ("nvlink_recovery_errors",)),
    ("xid_memory", tuple(f"xid_{c}_events" for c in _MEMORY_XIDS)),
    ("xid_nvlink", ("xid_74_events",)),
    ("xid_bus", ("xid_79_events",)),
    ("xid_gsp", ("xid_119_events", "xid_120_events")),
    ("xid_app", ("xid_13_events", "xid_31_events", "xid_43_events")),
    ("nvml_failed", ("nvml_failed_calls",)),
)
# The catalogue columns the engine reads, per GPU and per node (network.parquet's names).
GPU_INPUTS: tuple[str, ...] = tuple(
    dict.fromkeys(
        ["gpu_temp", "memory_temp", "power_usage", "power_limit", "sm_clock", "gpu_util", "nvml_call_seconds",
         "pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max", "nvml_unsupported_fields",
         *FLAGS, *(c for _, cs in RATES for c in cs)]
    )
)  # fmt: skip  # names packed, not one per line
NODE_RATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ib_symbol_error", ("ib_symbol_error",)),
    ("ib_link_error_recovery", ("ib_link_error_recovery",)),
    ("ib_port_rcv_errors", ("ib_port_rcv_errors",)),
    ("ib_local_ack_timeout", ("ib_local_ack_timeout_err",)),
    ("ib_link_downed", ("ib_link_downed",)),
    ("ib_xmit_discards", ("ib_port_xmit_discards",)),
    ("tcp_retrans", ("tcp_retrans_segs",)),
)
NODE_GAUGES = ("peer_rtt_p99_seconds", "peer_loss_ratio", "ib_port_state")
# Gauges also read against the GPU's own history, with the floor of a baseline's standard deviation
# in the series' units (sensor steps, a quiet card).
RELATIVE_GAUGES: tuple[tuple[str, float], ...] = (
    ("gpu_temp", 0.5), ("memory_temp", 0.5), ("power_usage", 5.0), ("sm_clock", 15.0), ("thermal_residual", 0.5),
)  # fmt: skip  # pairs packed, not one per line
# Counter groups that count hardware errors (not application Xids or NVML call failures): read as
# events per hour against the GPU's own background and its node's; more of them never means less risk.
_VS_NODE = ("gpu_temp", "memory_temp", "power_usage", "thermal_residual", "gpu_util", "sm_clock")
ERROR_GROUPS = tuple(name for name, _ in RATES if name not in ("xid_app", "nvml_failed"))
NODE_INPUTS: tuple[str, ...] = tuple(dict.fromkeys([*(c for _, cs in NODE_RATES for c in cs), *NODE_GAUGES]))
assert set(_MEMORY_XIDS) <= set(TRACKED_XIDS)

_BASELINE_TAU_S = 6 * 3600.0  # per-GPU thermal baseline: slow enough to let a 1 h drift show


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """The feature settings: the grid step, the rolling windows and the GPUs per node. A model records
    them (its manifest's `features`); features computed with other settings are other features."""

    cadence_s: float = 60.0
    windows_s: tuple[float, ...] = (300.0, 900.0, 3600.0)
    gpus_per_node: int = 8
    hold_s: float = 900.0  # the longest gap between samples a reading is held across
    # Gauges bit-identical this long: a frozen exporter, not a reading (the importer's default too; a
    # GPU held at its power cap, or idle, can sit still for most of an hour at a coarse cadence).
    frozen_s: float = 3600.0
    # The node-history features (faultcast.model.features.history) after the others: the drivers hand
    # their values in from a failure log. Off by default. Left out of repr: a saved scoring state's
    # signature (repr) of a model without them stays what it was; one with them differs by its names.
    node_history: bool = field(default=False, repr=False)

    def __setstate__(self, state: Sequence[object]) -> None:
        """Unpickle, a state saved before a field existed included (its default then)."""
        for f, value in zip(
            fields(self), (*state, *(f.default for f in fields(self)[len(state) :])), strict=True
        ):
            object.__setattr__(self, f.name, value)

    def steps(self, seconds: float) -> int:
        """`seconds` in grid steps, at least one."""
        return max(1, round(seconds / self.cadence_s))

    def window_steps(self) -> tuple[int, ...]:
        """Each window in grid steps."""
        return tuple(self.steps(w) for w in self.windows_s)

    def label(self, seconds: float) -> str:
        """A window's name in feature names: minutes, e.g. "5m"."""
        return f"{seconds / 60:g}m"


def _group_sum(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Sum of the group's columns per row; NaN only when every column is NaN."""
    if len(idx) == 1:
        return values[:, idx[0]]
    part = values[:, idx]
    return np.where(np.isnan(part).all(axis=1), np.nan, np.nansum(part, axis=1))


class _Rates(DerivedState):
    """Counter groups as rates per second, robust to resets and gaps, plus per-window rates."""

    _DERIVED = ("_single", "_single_columns", "_multi", "_ago", "_seconds")

    def __init__(
        self,
        n: int,
        groups: Sequence[tuple[str, tuple[str, ...]]],
        columns: Sequence[str],
        windows: Sequence[int],
        cadence_s: float,
    ) -> None:
        self.cadence_s = cadence_s
        self.windows = tuple(windows)
        self.column_index = [np.array([list(columns).index(c) for c in cs]) for _, cs in groups]
        c = len(columns)
        self.last = np.full((n, c), math.nan)
        self.last_step = np.full((n, c), -1, dtype=np.int64)
        g = len(groups)
        # Running totals of (increments, steps with a known increment) per group.
        self.total = np.zeros((n, 2 * g))
        self.totals = Ring(max(self.windows) + 1, n, 2 * g, 0.0)
        self.known_now = np.zeros((n, g), dtype=bool)
        self._derive()

    def _derive(self) -> None:
        # Groups of one counter are read in one gather; the others summed as they always were.
        single = [i for i, idx in enumerate(self.column_index) if len(idx) == 1]
        self._single = np.array(single, dtype=np.int64)
        self._single_columns = np.array([self.column_index[i][0] for i in single], dtype=np.int64)
        self._multi = [(i, idx) for i, idx in enumerate(self.column_index) if len(idx) > 1]
        self._ago = np.array(self.windows) + 1
        self._seconds = (np.array(self.windows) * self.cadence_s)[:, None, None]

    @property
    def width(self) -> int:
        """Columns of the output: the rate now, then the rate over each window, per group."""
        return (1 + len(self.windows)) * len(self.column_index)

    def reset(self, slots: np.ndarray) -> None:
        self.last[slots] = math.nan
        self.last_step[slots] = -1
        self.totals.fill_slots(slots, self.total[slots])

    def update(self, step: int, x: np.ndarray) -> list[np.ndarray]:
        """The rate now and over each window, one (n, groups) array each."""
        out = np.empty((len(x), self.width))
        self.write(step, x, out)
        g = len(self.column_index)
        return [out[:, i * g : (i + 1) * g] for i in range(1 + len(self.windows))]

    def write(self, step: int, x: np.ndarray, out: np.ndarray) -> None:
        """Read a step's counters (n, columns); `update`'s arrays side by side into `out` (n, width)."""
        seen = ~np.isnan(x)
        delta = x - self.last
        delta = np.where(delta < 0, x, delta)  # a counter reset (driver reload): it restarted from zero
        elapsed = (step - self.last_step) * self.cadence_s
        known = seen & ~np.isnan(self.last)
        rate = np.where(known, delta / np.where(known, elapsed, 1.0), np.nan)
        inc = np.where(known, delta, 0.0)
        np.copyto(self.last, x, where=seen)
        np.copyto(self.last_step, step, where=seen)
        g = len(self.column_index)
        parts = split_columns(out, 1 + len(self.windows), g)
        now = parts[:, 0]
        group_inc = np.empty((len(x), g))
        group_known = np.empty((len(x), g), dtype=bool)
        now[:, self._single] = rate[:, self._single_columns]
        group_inc[:, self._single] = inc[:, self._single_columns]
        group_known[:, self._single] = known[:, self._single_columns]
        for i, idx in self._multi:
            now[:, i] = _group_sum(rate, idx)
            group_inc[:, i] = inc[:, idx].sum(axis=1)
            group_known[:, i] = known[:, idx].any(axis=1)
        self.known_now = group_known  # which groups had a known increment in this step
        self.total[:, :g] += group_inc
        self.total[:, g:] += group_known
        self.totals.push(self.total)
        ring, at = self.totals.data, self.totals.pos + self.totals.size
        window = ring[at - 1] - ring[at - self._ago]  # (windows, n, 2g)
        # Events per second over the window; missing when the counter was never read in it.
        rates = parts[:, 1:].transpose(1, 0, 2)
        rates[...] = math.nan
        np.divide(window[..., :g], self._seconds, out=rates, where=window[..., g:] > 0)

    def skip(self, count: int) -> None:
        """The state `count` updates reading nothing would leave: the last values stay, the totals
        stand still, and the ring fills with them (O(window) work)."""
        kept = min(count, self.totals.size)
        self.totals.push_many(np.broadcast_to(self.total, (kept, *self.total.shape)), count)
        self.known_now[:] = False

    @staticmethod
    def names(groups: Sequence[tuple[str, tuple[str, ...]]], labels: Sequence[str]) -> list[str]:
        out = [f"{name}_rate" for name, _ in groups]
        for lab in labels:
            out += [f"{name}_rate_{lab}" for name, _ in groups]
        return out


class _Columns:
    """Hands out a step's output array a block of columns at a time, in the names' order."""

    def __init__(self, out: np.ndarray) -> None:
        self.out, self.at = out, 0

    def take(self, width: int) -> np.ndarray:
        block = self.out[:, self.at : self.at + width]
        self.at += width
        return block


class FeatureEngine(DerivedState):
    """Per-slot streaming state for `nodes` nodes of `config.gpus_per_node` GPUs.

    A step's features are written straight into the one array it returns, block by block; index arrays
    and scratch come from `_derive` and are not part of a saved state."""

    _DERIVED = ("_d",)

    def __init__(self, config: FeatureConfig, nodes: int, gpus_per_node: int | None = None) -> None:
        """`gpus_per_node`: the data's node size (default: the config's); the features do not depend on it."""
        self.config = config
        self.nodes = nodes
        g = self.gpus_per_node = gpus_per_node or config.gpus_per_node
        n = nodes * g
        self.slots = n
        windows = config.window_steps()
        held = tuple(c for c in GPU_INPUTS if c not in {c for _, cs in RATES for c in cs})
        self._inputs = InputConditioner(n, GPU_INPUTS, held, config.cadence_s, config.hold_s, config.frozen_s)
        self.present = np.zeros(n, dtype=bool)  # the GPUs with a reading (live or held) in the last step
        self._last_gauge_means = np.full((n, len(WINDOW_GAUGES)), math.nan)
        labels = [config.label(w) for w in config.windows_s]
        self._col = {name: i for i, name in enumerate(GPU_INPUTS)}
        self._node_col = {name: i for i, name in enumerate(NODE_INPUTS)}
        self._gauges = Windowed(n, len(WINDOW_GAUGES), windows, config.cadence_s, full=True)
        self._flags = Windowed(n, len(FLAGS), windows[1:], config.cadence_s, full=False)
        self._rates = _Rates(n, RATES, GPU_INPUTS, windows, config.cadence_s)
        self._node_rates = _Rates(nodes, NODE_RATES, NODE_INPUTS, windows, config.cadence_s)
        self._node_gauges = Windowed(nodes, len(NODE_GAUGES), windows[1:2], config.cadence_s, full=True)
        self._present = Windowed(n, 1, windows, config.cadence_s, full=False)
        self._last_seen = np.full(n, -1, dtype=np.int64)
        # Per-GPU thermal baseline: EWMA regression of temperature on power.
        self._base = np.full((n, 4), math.nan)  # mean power, mean temp, var power, cov
        self._base_alpha = 1.0 - math.exp(-config.cadence_s / _BASELINE_TAU_S)
        floors = np.array([f for _, f in RELATIVE_GAUGES])
        self._own = OwnBaseline(n, len(RELATIVE_GAUGES), config.cadence_s, BASELINE_TAU_S, floors)
        self._error_index = np.array([[name for name, _ in RATES].index(e) for e in ERROR_GROUPS])
        # The relative features read the middle and the longest window (the 15 and 60 minutes by default).
        self._mid, self._long = min(1, len(windows) - 1), len(windows) - 1
        hour = windows[self._long]
        self._rate_base = RateBaseline(n, len(ERROR_GROUPS), config.cadence_s, BASELINE_TAU_S, hour)
        self._node_rate_base = RateBaseline(nodes, len(NODE_RATES), config.cadence_s, BASELINE_TAU_S, hour)
        self._steps = StepFeatures(n, g, config.cadence_s, windows[self._mid], hour)

        names = ["is_h100", "power_limit"]
        names += [f"{s}_now" for s in WINDOW_GAUGES]
        names += self._gauges.names(WINDOW_GAUGES, labels)
        names += [f"{s}_now" for s in FLAGS]
        names += self._flags.names(FLAGS, labels[1:])
        names += _Rates.names(RATES, labels)
        names += [
            "pcie_gen_deficit",
            "unsupported_fields",
            "missing_inputs",
            "sample_late_ratio",
            "frozen_now",
        ]
        names += [f"missing_share_{lab}" for lab in labels]
        names += [f"{s}_vs_node" for s in _VS_NODE]
        names += [f"node_{n}" for n in _Rates.names(NODE_RATES, labels)]
        names += [f"node_{n}" for n in self._node_gauges.names(NODE_GAUGES, labels[1:2])]
        names += [f"node_{s}_now" for s in NODE_GAUGES]
        mid, long = labels[self._mid], labels[self._long]
        names += [f"{s}_z_own_{mid}" for s, _ in RELATIVE_GAUGES]
        for lab in dict.fromkeys((mid, long)):  # one window only: one of each
            names += [f"{e}_excess_{lab}" for e in ERROR_GROUPS]
        names += [f"{e}_vs_node_{long}" for e in ERROR_GROUPS]
        names += [f"node_{r}_excess_{long}" for r, _ in NODE_RATES]
        names += StepFeatures.names(mid, long)
        names += HISTORY_NAMES if config.node_history else ()
        self.names: tuple[str, ...] = tuple(names)
        self._derive()

    def _derive(self) -> None:
        """Index arrays into the inputs, computed once (a saved state from before them gets them too)."""
        col, node_col = self._col, self._node_col
        gauge_at = [i for i, s in enumerate(WINDOW_GAUGES) if s in col]
        self._d = _Indexes(
            gauge_at=np.array(gauge_at),
            gauge_columns=np.array([col[WINDOW_GAUGES[i]] for i in gauge_at]),
            residual_at=WINDOW_GAUGES.index("thermal_residual"),
            deficit_at=WINDOW_GAUGES.index("pcie_width_deficit"),
            flags=np.array([col[f] for f in FLAGS]),
            core=np.array([col[c] for c in _CORE_INPUTS]),
            vs_node=np.array([WINDOW_GAUGES.index(s) for s in _VS_NODE]),
            relative=np.array([WINDOW_GAUGES.index(s) for s, _ in RELATIVE_GAUGES]),
            node_gauges=np.array([node_col[s] for s in NODE_GAUGES]),
            mid_means=6 * self._mid * len(WINDOW_GAUGES),
        )

    @property
    def schema_hash(self) -> str:
        """The hash of the feature names and settings (`feature_schema_hash`), which a model records."""
        return feature_schema_hash(self.names, self.config)

    def reset_slots(self, slots: np.ndarray) -> None:
        """A different GPU now sits in these slots (replaced): its history starts over."""
        if len(slots) == 0:
            return
        for part in (self._gauges, self._flags, self._present):
            part.reset(slots)
        self._rates.reset(slots)
        self._last_seen[slots] = -1
        self._base[slots] = math.nan
        self._inputs.reset(slots)
        self._own.reset(slots)
        self._rate_base.reset(slots)  # the node's network baseline stays: the node is the same
        self._steps.reset(slots)

    def skip(self, step: int, count: int) -> None:
        """Advance `count` grid steps from `step` in which nothing was read (every GPU and node absent),
        in work independent of `count`: the state is exactly what `count` calls of `update` with all-NaN
        inputs would leave (windows empty once the gap outlasts them; EWMAs, counters' last values,
        last-seen steps and baselines held), so the features of the next step are too. The first
        steps, while readings may still be held across the gap, are computed as `update` would."""
        if count <= 0:
            return
        n, nodes = self.slots, self.nodes
        exact = min(count, self._inputs.hold_steps_left(step))  # at most hold_s worth of steps
        blank_gpu = np.full((n, len(GPU_INPUTS)), math.nan)
        blank_node = np.full((nodes, len(NODE_INPUTS)), math.nan)
        for k in range(exact):
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                self._update(step + k, blank_gpu, blank_node, np.zeros(n))
        count -= exact
        if count <= 0:
            return
        self.present[:] = False
        self._gauges.skip(count, np.full((n, len(WINDOW_GAUGES)), math.nan))
        self._flags.skip(count, np.full((n, len(FLAGS)), math.nan))
        self._rates.skip(count)
        self._present.skip(count, np.zeros((n, 1)))  # absent GPUs read 0 in the presence series
        self._node_rates.skip(count)
        self._node_gauges.skip(count, np.full((nodes, len(NODE_GAUGES)), math.nan))
        self._steps.skip(count)
        # _last_seen, the input conditioner and the baselines change only where a GPU is seen.

    def update(
        self,
        step: int,
        gpu: np.ndarray,
        node: np.ndarray,
        is_h100: np.ndarray,
        summary: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        """Advance one grid step. gpu: (slots, len(GPU_INPUTS)) with NaN rows for GPUs not seen this
        step; node: (nodes, len(NODE_INPUTS)); is_h100: (slots,); summary: (slots, feature_steps.WIDTH),
        each GPU's step summary (faultcast.step_summary; None: no summaries); history: (slots,
        len(HISTORY_NAMES)), with `config.node_history` (None: no failure known). Returns (slots, features),
        a new array; rows of absent GPUs are computed too but mean little (callers keep the present
        ones, `self.present`: live or held readings). The inputs are not modified. NaN, infinities and
        gaps are data here, not faults: no warnings."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._update(step, gpu, node, is_h100, summary, history)

    def _update(
        self,
        step: int,
        gpu: np.ndarray,
        node: np.ndarray,
        is_h100: np.ndarray,
        summary: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        col, d = self._col, self._d
        # The engine's own copy of the inputs, infinities as missing; the conditioner works on it in place.
        gpu = self._inputs.condition(step, np.where(np.isinf(gpu), np.nan, gpu), in_place=True)
        summary = self._steps.blank() if summary is None else np.where(np.isinf(summary), np.nan, summary)
        summary[self._inputs.frozen, 0] = 0.0  # a frozen exporter's summary is no reading either
        temp, power = gpu[:, col["gpu_temp"]], gpu[:, col["power_usage"]]
        present = ~np.isnan(temp) | ~np.isnan(power)
        self.present = present
        residual = self._thermal_residual(temp, power)

        out = np.empty((self.slots, len(self.names)))
        columns = _Columns(out)
        columns.take(1)[:, 0] = is_h100
        columns.take(1)[:, 0] = gpu[:, col["power_limit"]]
        gauges = columns.take(len(WINDOW_GAUGES))
        gauges[:, d.gauge_at] = gpu[:, d.gauge_columns]
        gauges[:, d.residual_at] = residual
        gauges[:, d.deficit_at] = gpu[:, col["pcie_link_width_max"]] - gpu[:, col["pcie_link_width"]]
        windowed = columns.take(self._gauges.width)
        self._gauges.write(gauges, windowed)
        # The middle window's means (Windowed's order: per window, the means first).
        self._last_gauge_means = windowed[:, d.mid_means : d.mid_means + len(WINDOW_GAUGES)]
        flags = columns.take(len(FLAGS))
        flags[...] = gpu[:, d.flags]
        self._flags.write(flags, columns.take(self._flags.width))
        rates = columns.take(self._rates.width)
        self._rates.write(step, gpu, rates)
        self._health(step, gpu, present, columns.take(5))
        share = columns.take(self._present.width)
        self._present.write(present[:, None].astype(np.float64), share)
        np.subtract(1.0, share, out=share)
        self._relative_to_node(gauges, columns.take(len(_VS_NODE)))
        node_long = self._node_features(step, node, columns)
        self._relative(step, gauges, rates, node_long, columns)
        self._steps.write(step, summary, columns.take(self._steps.width))
        if self.config.node_history:
            columns.take(len(HISTORY_NAMES))[...] = NO_HISTORY if history is None else history
        assert columns.at == out.shape[1]
        return out

    def _per_node(self, columns: _Columns, width: int) -> np.ndarray:
        """The next `width` columns as (nodes, gpus per node, width): a node's value for each GPU."""
        return np.reshape(columns.take(width), (self.nodes, self.gpus_per_node, width), copy=False)

    def _relative(
        self, step: int, gauges: np.ndarray, rates: np.ndarray, node_long: np.ndarray, columns: _Columns
    ) -> None:
        """The own-history and node-relative counter features (faultcast.model.features.relative);
        `node_long`: the nodes' rates over the longest window."""
        d = self._d
        now = gauges[:, d.relative]
        # The middle window's mean of each series.
        recent = self._last_gauge_means[:, d.relative]
        columns.take(len(RELATIVE_GAUGES))[...] = self._own.z(recent)
        self._own.update(now)
        e, groups = self._error_index, len(RATES)
        # rates: the rate now, then one per window; the mid and long windows' rates on a log scale.
        by_window = split_columns(rates, 1 + len(self._rates.windows), groups)
        log_mid = log_hourly(by_window[:, 1 + self._mid, e])
        log_long = log_hourly(by_window[:, 1 + self._long, e])
        if self._mid != self._long:
            columns.take(len(e))[...] = self._rate_base.excess(log_mid)
        columns.take(len(e))[...] = self._rate_base.excess(log_long)
        # The baseline learns only from steps where the counter was read: gaps leave it where it was.
        self._rate_base.update(step, np.where(self._rates.known_now[:, e], log_long, np.nan))
        columns.take(len(e))[...] = minus_node_mean(log_long, self.gpus_per_node)
        node_long = log_hourly(node_long)
        self._per_node(columns, len(NODE_RATES))[...] = self._node_rate_base.excess(node_long)[:, None, :]
        self._node_rate_base.update(step, np.where(self._node_rates.known_now, node_long, np.nan))

    def _health(self, step: int, gpu: np.ndarray, present: np.ndarray, out: np.ndarray) -> None:
        """(slots, 5) into `out`: PCIe generations below the maximum, unsupported NVML fields, how many
        of the core inputs are missing (NaN when the GPU is absent), the time since the last live sample
        in the GPU's own intervals between samples, and whether its exporter is frozen."""
        col = self._col
        np.copyto(self._last_seen, step, where=present)
        missing = np.isnan(gpu[:, self._d.core]).sum(axis=1)
        np.subtract(gpu[:, col["pcie_link_gen_max"]], gpu[:, col["pcie_link_gen"]], out=out[:, 0])
        out[:, 1] = gpu[:, col["nvml_unsupported_fields"]]
        out[:, 2] = np.where(present, missing, np.nan)
        out[:, 3] = self._inputs.late
        out[:, 4] = self._inputs.frozen

    def _relative_to_node(self, gauges: np.ndarray, out: np.ndarray) -> None:
        """(slots, 6) into `out`: each GPU's temperatures, power, residual, use and clock minus its
        node's median."""
        by_node = gauges[:, self._d.vs_node].reshape(self.nodes, self.gpus_per_node, -1)
        median = node_median(by_node)
        np.subtract(by_node, median[:, None, :], out=np.reshape(out, by_node.shape, copy=False))

    def _node_features(self, step: int, node: np.ndarray, columns: _Columns) -> np.ndarray:
        """The node's rates, windowed gauges and gauges now, repeated for each of its GPUs; returns the
        nodes' rates over the longest window."""
        rates, windowed = self._node_rates, self._node_gauges
        node_gauges = node[:, self._d.node_gauges]
        width = rates.width + windowed.width + len(NODE_GAUGES)
        block = np.empty((self.nodes, width))
        rates.write(step, node, block[:, : rates.width])
        windowed.write(node_gauges, block[:, rates.width : rates.width + windowed.width])
        block[:, rates.width + windowed.width :] = node_gauges
        self._per_node(columns, width)[...] = block[:, None, :]
        long = len(NODE_RATES) * (1 + self._long)
        return block[:, long : long + len(NODE_RATES)]

    def _thermal_residual(self, temp: np.ndarray, power: np.ndarray) -> np.ndarray:
        """Temperature minus what this GPU's own recent power-temperature relation predicts."""
        b, a = self._base, self._base_alpha
        seen = ~np.isnan(temp) & ~np.isnan(power)
        first = seen & np.isnan(b[:, 0])
        if first.any():
            b[first] = np.stack(
                [power[first], temp[first], np.zeros(first.sum()), np.zeros(first.sum())], axis=1
            )
        mp, mt, vp, cv = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        slope = np.where(vp > 1.0, cv / np.where(vp > 1.0, vp, 1.0), 0.0)
        residual = np.where(seen, temp - (mt + slope * (power - mp)), np.nan)
        dp, dt = power - mp, temp - mt
        update = seen & ~first
        b[update, 0] = mp[update] + a * dp[update]
        b[update, 1] = mt[update] + a * dt[update]
        b[update, 2] = (1 - a) * (vp[update] + a * dp[update] ** 2)
        b[update, 3] = (1 - a) * (cv[update] + a * dp[update] * dt[update])
        return residual


@dataclass(frozen=True)
class _Indexes:
    """The engine's index arrays into its inputs and its gauges (derived, never saved)."""

    gauge_at: np.ndarray  # WINDOW_GAUGES read straight from an input column...
    gauge_columns: np.ndarray  # ...and those columns
    residual_at: int
    deficit_at: int
    flags: np.ndarray  # FLAGS' input columns
    core: np.ndarray  # _CORE_INPUTS' input columns
    vs_node: np.ndarray  # _VS_NODE in WINDOW_GAUGES
    relative: np.ndarray  # RELATIVE_GAUGES in WINDOW_GAUGES
    node_gauges: np.ndarray  # NODE_GAUGES' node input columns
    mid_means: int  # the first column of the middle window's means in the gauges' windowed block


def feature_schema_hash(names: Sequence[str], config: FeatureConfig) -> str:
    """16 hex digits of SHA-256 over the settings and the names: equal only for the same features (the
    node size is not one of them: a model serves nodes of any size)."""
    text = f"{config.cadence_s}|{config.windows_s}|{config.hold_s}|{config.frozen_s}|" + ",".join(names)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
