"""The importer's second pass: spilled samples laid on the time grid a slice of steps at a time,
frozen exporters blanked, the plain dcgm-exporter gaps derived, and the data files written.

Each slice of `chunk_steps` grid steps is one row group of telemetry.parquet and of network.parquet,
written in time order (what faultcast.model.features.offline's replay reads). A slice reads the spill buckets
that overlap it (and `lookahead` steps past it, so a frozen span that crosses the slice's end is
judged whole), picks the last sample of every stream in each step (ties: the later in the export),
and holds (slice steps + lookahead) x GPUs x active columns values: memory follows the fleet's size
and the slice, never the length of the history.

Frozen exporters: a dcgm-exporter that hangs keeps serving its last readings, so Prometheus goes on
storing the same values (a real fleet's export held 37 hours of them). A working GPU never reports every gauge
bit-identical for long: board power is read at milliwatt resolution and moves by far more than that
from one read to the next even at idle (fans, VRM losses and leakage follow temperature), and the
temperatures follow the inlet air. A frozen exporter, by contrast, repeats itself for hours (37
in that export). The default threshold is an hour, not less, for exporters that round (integer degrees, a power
reading rounded to the watt at a power cap) and for the fleet twin, which clamps power at exactly the
cap: subsampled to 5 minutes, its integer temperature and capped power hold still for up to 50
minutes. So, per GPU, a run of steps in which every gauge it reports is identical to the step before
(at least one of them finite; steps with no finite gauge neither break nor extend it) that lasts
longer than `frozen_after_s` is a frozen exporter: its steps after the first are written as missing
(the first is the last real reading), counted per node in the manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast.catalogue import TRACKED_XIDS, Scope, metrics_for
from faultcast.model.importers.spill import Spill
from faultcast.rollup import NETWORK_COLUMNS, rollup_network
from faultcast.schemas import GPU_COLUMNS, NETWORK_SCHEMA, SUMMARISED_TELEMETRY_SCHEMA, TELEMETRY_SCHEMA
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARY_COLUMNS

NETWORK_SCOPES = (Scope.INTERFACE, Scope.IB_PORT, Scope.PEER, Scope.HOST)
GPU, NETWORK, SUMMARY, UNUSED = 0, 1, 2, -1  # stream kinds
SUMMARY_WIDTH = 1 + len(SUMMARY_COLUMNS)
"""A step summary block: the scrapes, then SUMMARY_COLUMNS (faultcast.step_summary)."""
XID_COLUMNS = {code: f"xid_{code}_events" for code in TRACKED_XIDS}
XID_ALL = (*XID_COLUMNS.values(), "xid_other_events")


@dataclass(frozen=True)
class Plan:
    """What the first pass learnt, arranged for the grid. Units are GPUs in output order."""

    start: float  # unix seconds of step 0
    interval: float
    steps: int
    nodes: list[str]
    unit_node: np.ndarray  # (U,) node index
    unit_gpu: np.ndarray  # (U,) gpu index
    identities: list[tuple[str, str]]  # (uuid, model), sorted; streams' `ident` index it
    columns: list[str]  # the GPU columns on the grid (raw or derivable), in GPU_COLUMNS order
    seen: np.ndarray  # (U, columns) bool: the unit has series of the column itself (not derived)
    gauges: list[int]  # indices into `columns` of the raw gauges (the frozen-exporter test)
    flag_bits: dict[str, int]  # throttle flag -> bit of clock_event_reasons
    # Per stream (the spill's numbering):
    kind: np.ndarray  # GPU, SUMMARY, NETWORK or UNUSED
    unit: np.ndarray  # GPU and SUMMARY: unit
    column: np.ndarray  # GPU: index into `columns`; SUMMARY: into the summary block (SUMMARY_WIDTH)
    ident: np.ndarray  # GPU: index into `identities`
    factor: np.ndarray  # values x factor (units settled after the first pass)
    net_node: np.ndarray  # NETWORK: node index
    net_scope: np.ndarray  # NETWORK: index into NETWORK_SCOPES
    net_device: np.ndarray  # NETWORK: the device's index among the node's devices of that scope
    net_metric: np.ndarray  # NETWORK: index into metrics_for(scope)
    net_devices: np.ndarray  # (nodes, scopes) devices per node and scope
    summarised: bool = False  # step summary streams: the files get SUMMARISED_TELEMETRY_SCHEMA


@dataclass
class Written:
    """What the second pass wrote and found."""

    telemetry_rows: int = 0
    network_rows: int = 0
    row_groups: int = 0
    gpu_steps: int = 0  # telemetry rows (GPU-steps with a finite value)
    chunk_steps: int = 0
    largest_chunk_rows: int = 0  # grid rows (steps x GPUs) held at once, lookahead included
    flag_units: dict[str, int] = field(default_factory=dict)  # derived flag -> GPUs that got it
    xid_units: int = 0  # GPUs whose Xid counters were derived
    frozen_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (U,)
    frozen_spans: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (U,)
    identity_changes: list[list[tuple[int, int]]] = field(default_factory=list)  # per unit (step, ident)


def _last(cell: np.ndarray, times: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Indices of the last sample of each (cell, step), by time, ties to the later index."""
    order = np.lexsort((times, cell))  # stable: equal times keep the export's order
    c, s = cell[order], step[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (c[1:] != c[:-1]) | (s[1:] != s[:-1])
    return order[last]


@dataclass
class _Frozen:
    """Per unit, across slices: the last step with a finite gauge, its gauges, the start of its run
    of identical steps, and whether it was judged frozen."""

    values: np.ndarray  # (U, gauges)
    step: np.ndarray  # (U,) -1: none yet
    run_start: np.ndarray  # (U,)
    frozen: np.ndarray  # (U,) bool

    @staticmethod
    def empty(units: int, gauges: int) -> _Frozen:
        return _Frozen(
            np.full((units, gauges), np.nan),
            np.full(units, -1, np.int64),
            np.full(units, -1, np.int64),
            np.zeros(units, dtype=bool),
        )


def frozen_steps(
    gauges: np.ndarray, first: int, own: int, carry: _Frozen, interval: float, after_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """(own, U) bool: which of the steps first..first+own-1 are a frozen exporter's, from `gauges`
    (W, U, G) for the steps from `first` (W >= own: the rest is lookahead); and (U,) how many frozen
    spans begin in them. Steps with no finite gauge neither break nor extend a run. Updates `carry`
    to the state after step first+own-1."""
    width, units = gauges.shape[0], gauges.shape[1]
    values = np.concatenate([carry.values[None], gauges], axis=0)  # row 0: the carry
    rows = np.arange(width + 1)
    cols = np.arange(units)[None, :]
    stepnum = np.broadcast_to((first - 1 + rows)[:, None], (width + 1, units)).copy()
    stepnum[0] = carry.step
    present = np.zeros((width + 1, units), dtype=bool)
    for g in range(values.shape[2]):
        present |= np.isfinite(values[:, :, g])
    present[0] = carry.step >= 0
    last = np.maximum.accumulate(np.where(present, rows[:, None], -1), axis=0)
    prev = np.vstack([np.full((1, units), -1), last[:-1]])  # the previous row with a finite gauge
    same = present & (prev >= 0)
    index = np.maximum(prev, 0)
    for g in range(values.shape[2]):  # column by column: no (W, U, G) temporaries
        now, before = values[:, :, g], values[index, cols, g]
        same &= (now == before) | (np.isnan(now) & np.isnan(before))
    same[0] = False
    origin = np.where(present & ~same, stepnum, -1)
    origin[0] = np.where(present[0], carry.run_start, -1)
    start = np.maximum.accumulate(origin, axis=0)  # the first step of each run
    duration = (stepnum - start) * interval
    run = np.cumsum(present & ~same, axis=0)
    key = cols * (width + 2) + run
    longest = np.zeros(units * (width + 2))
    np.maximum.at(longest, key[same], duration[same])
    frozen = same & (longest[key] > after_s)
    frozen[0] = carry.frozen
    was = frozen[np.maximum(prev, 0), cols] & (prev >= 0)
    begins = frozen & ~was
    begins[0] = False
    at = last[own]  # the state after the last own step
    has = np.flatnonzero(at >= 0)
    carry.values[has] = values[at[has], has]
    carry.step[has] = stepnum[at[has], has]
    carry.run_start[has] = start[at[has], has]
    carry.frozen[has] = frozen[at[has], has]
    return frozen[1 : own + 1], begins[1 : own + 1].sum(axis=0)


def write_grid(
    out: Path,
    spill: Spill,
    plan: Plan,
    *,
    chunk_steps: int,
    frozen_after_s: float,
    observe: Callable[[int], None] | None = None,
) -> Written:
    """Write telemetry.parquet and network.parquet under `out` from the spill; `observe` (tests,
    benchmarks) is told the grid rows each slice holds."""
    units, steps, interval = len(plan.unit_node), plan.steps, plan.interval
    written = Written(chunk_steps=chunk_steps)
    written.frozen_steps = np.zeros(units, np.int64)
    written.frozen_spans = np.zeros(units, np.int64)
    written.identity_changes = [[] for _ in range(units)]
    lookahead = int(frozen_after_s // interval) + 1 if frozen_after_s > 0 and plan.gauges else 0
    col = {name: i for i, name in enumerate(plan.columns)}
    frozen = _Frozen.empty(units, len(plan.gauges))
    xid_prev = np.full(units, np.nan)
    xid_counts = np.zeros((units, len(XID_ALL)))
    derive_xids = "xid_last" in col and not any(c in col and plan.seen[:, col[c]].any() for c in XID_ALL)
    xid_units = np.zeros(units, dtype=bool)
    flag_units = {name: np.zeros(units, dtype=bool) for name in plan.flag_bits if name in col}
    last_ident = np.full(units, -1, np.int64)
    net_streams = np.flatnonzero(plan.kind == NETWORK)
    net_index = np.full(len(plan.kind), -1, np.int64)
    net_index[net_streams] = np.arange(len(net_streams))
    uuids = [u for u, _ in plan.identities]
    models = sorted({m for _, m in plan.identities})
    model_of = np.array([models.index(m) for _, m in plan.identities] or [0], dtype=np.int64)
    schema = SUMMARISED_TELEMETRY_SCHEMA if plan.summarised else TELEMETRY_SCHEMA
    with (
        pq.ParquetWriter(out / "telemetry.parquet", schema, compression="zstd") as telemetry,
        pq.ParquetWriter(out / "network.parquet", NETWORK_SCHEMA, compression="zstd") as network,
    ):
        for a in range(0, steps, chunk_steps):
            b = min(a + chunk_steps, steps)
            e = min(b + lookahead, steps)
            own = b - a
            written.largest_chunk_rows = max(written.largest_chunk_rows, (e - a) * units)
            if observe is not None:
                observe((e - a) * units)
            grid = np.full((e - a, units, len(plan.columns)), np.nan)
            ident = np.full((e - a, units), -1, np.int64)
            summ = np.full((own, units, SUMMARY_WIDTH), np.nan) if plan.summarised else None
            net = np.full((own, len(net_streams)), np.nan) if len(net_streams) else None
            t0, t1 = plan.start + (a - 1) * interval, plan.start + (e + 1) * interval
            for records in spill.read(t0, t1):  # later buckets overwrite: their samples are later
                _scatter(plan, records, a, e, own, grid, ident, net, net_index, summ)
            if lookahead and plan.gauges:
                blank, spans = frozen_steps(grid[:, :, plan.gauges], a, own, frozen, interval, frozen_after_s)
                grid[:own][blank] = np.nan
                if summ is not None:
                    summ[blank] = np.nan
                written.frozen_steps += blank.sum(axis=0)
                written.frozen_spans += spans
            grid, ident = grid[:own], ident[:own]
            for name, bit in plan.flag_bits.items():
                if name in col:
                    flag_units[name] |= _derive_flag(grid, col, plan.seen[:, col[name]], name, bit)
            if derive_xids:
                xid_units |= _derive_xids(grid, col, xid_prev, xid_counts)
            _identity_changes(ident, a, last_ident, written.identity_changes)

            present = np.isfinite(grid).any(axis=2) & (ident >= 0)
            step_of, unit_of = np.nonzero(present)
            if len(step_of):
                table = _telemetry_table(plan, grid, ident, step_of, unit_of, a, uuids, models, model_of, col)
                if summ is not None:
                    table = _with_summaries(table, summ[step_of, unit_of])
                telemetry.write_table(table)
                written.telemetry_rows += len(step_of)
                written.row_groups += 1
            node_rows = _network_rows(plan, net, net_streams, own)
            net_present = np.isfinite(node_rows).any(axis=2)
            n_step, n_node = np.nonzero(net_present)
            if len(n_step):
                network.write_table(_network_table(plan, node_rows, n_step, n_node, a))
                written.network_rows += len(n_step)
    written.gpu_steps = written.telemetry_rows
    written.flag_units = {name: int(units_.sum()) for name, units_ in flag_units.items() if units_.any()}
    written.xid_units = int(xid_units.sum())
    return written


def _scatter(
    plan: Plan,
    records: np.ndarray,
    a: int,
    e: int,
    own: int,
    grid: np.ndarray,
    ident: np.ndarray,
    net: np.ndarray | None,
    net_index: np.ndarray,
    summ: np.ndarray | None = None,
) -> None:
    """One bucket's samples of steps a..e-1 onto the slice: the last sample of each stream in a step
    into `grid` (W, U, columns), `net` (own, network streams by `net_index`) and `summ` (own, U,
    SUMMARY_WIDTH), the GPU's last sample's identity into `ident` (W, U)."""
    step = np.floor((records["t"] - plan.start) / plan.interval).astype(np.int64)
    kind = plan.kind[records["stream"]]
    gpu = np.flatnonzero((kind == GPU) & (step >= a) & (step < e))
    if len(gpu):
        stream, at, times = records["stream"][gpu], step[gpu] - a, records["t"][gpu]
        unit, column = plan.unit[stream], plan.column[stream]
        win = _last(unit * len(plan.columns) + column, times, at)
        grid[at[win], unit[win], column[win]] = records["v"][gpu[win]] * plan.factor[stream[win]]
        win = _last(unit, times, at)  # identity: the GPU's last sample in the step, whatever its column
        ident[at[win], unit[win]] = plan.ident[stream[win]]
    if summ is not None:
        picked = np.flatnonzero((kind == SUMMARY) & (step >= a) & (step < a + own))
        if len(picked):
            stream, at = records["stream"][picked], step[picked] - a
            unit, column = plan.unit[stream], plan.column[stream]
            win = _last(unit * SUMMARY_WIDTH + column, records["t"][picked], at)
            summ[at[win], unit[win], column[win]] = records["v"][picked[win]]
    if net is not None:
        picked = np.flatnonzero((kind == NETWORK) & (step >= a) & (step < a + own))
        if len(picked):
            stream, at = records["stream"][picked], step[picked] - a
            win = _last(stream, records["t"][picked], at)
            net[at[win], net_index[stream[win]]] = records["v"][picked[win]]


def _derive_flag(grid: np.ndarray, col: dict[str, int], seen: np.ndarray, name: str, bit: int) -> np.ndarray:
    """A throttle flag from the clock-event-reasons bitmask, for the units that lack it; returns
    the units that got a value."""
    if "clock_event_reasons" not in col:
        return np.zeros(grid.shape[1], dtype=bool)
    mask = grid[:, :, col["clock_event_reasons"]]
    finite = np.isfinite(mask)
    units: np.ndarray = ~seen & finite.any(axis=0)
    if not units.any():
        return units
    bits = np.where(finite, mask, 0).astype(np.int64)
    flag = np.where(finite, ((bits & bit) != 0).astype(np.float64), np.nan)
    grid[:, units, col[name]] = flag[:, units]
    return units


def _derive_xids(grid: np.ndarray, col: dict[str, int], prev: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Xid counters by code from the changes of the last-Xid gauge (the first value seen is history,
    not an event), carried across slices in `prev` and `counts`; returns the units that got values."""
    last = grid[:, :, col["xid_last"]]
    finite = np.isfinite(last)
    units: np.ndarray = finite.any(axis=0)
    targets = [col[name] for name in XID_ALL]
    for u in np.flatnonzero(units).tolist():
        at = np.flatnonzero(finite[:, u])
        codes = last[at, u]
        before = np.r_[codes[0] if np.isnan(prev[u]) else prev[u], codes[:-1]]
        events = (codes != before) & (codes != 0)
        distinct, inverse = np.unique(codes, return_inverse=True)
        column_of = np.array([XID_ALL.index(XID_COLUMNS.get(int(c), "xid_other_events")) for c in distinct])[
            inverse
        ]
        for i, target in enumerate(targets):
            grid[at, u, target] = counts[u, i] + np.cumsum(events & (column_of == i))
            counts[u, i] = grid[at[-1], u, target]
        prev[u] = codes[-1]
    return units


def _identity_changes(
    ident: np.ndarray, first: int, last: np.ndarray, changes: list[list[tuple[int, int]]]
) -> None:
    """Record (step, identity) wherever a unit's known identity differs from the one before."""
    known = ident >= 0
    low = np.where(known, ident, np.iinfo(np.int64).max).min(axis=0)
    high = np.where(known, ident, -1).max(axis=0)
    steady = ~known.any(axis=0) | ((low == high) & (low == last))
    for u in np.flatnonzero(~steady).tolist():
        at = np.flatnonzero(known[:, u])
        codes = ident[at, u]
        before = np.r_[last[u], codes[:-1]]
        for k in np.flatnonzero(codes != before).tolist():
            changes[u].append((first + int(at[k]), int(codes[k])))
        last[u] = codes[-1]


def _network_rows(plan: Plan, net: np.ndarray | None, streams: np.ndarray, width: int) -> np.ndarray:
    """(width, nodes, NETWORK_COLUMNS) from the slice's network streams: each node's devices rolled
    up as the twin and the service do (faultcast.rollup); interfaces in the order of their names,
    the first standing for the node's Ethernet."""
    out = np.full((width, len(plan.nodes), len(NETWORK_COLUMNS)), np.nan)
    if net is None:
        return out
    for n in np.unique(plan.net_node[streams]).tolist():
        here = np.flatnonzero(plan.net_node[streams] == n)
        mine = streams[here]
        arrays = []
        for s, scope in enumerate(NETWORK_SCOPES):
            metrics = metrics_for(scope)
            dense = np.full((width, max(1, int(plan.net_devices[n, s])), len(metrics)), np.nan)
            chosen = plan.net_scope[mine] == s
            picked = mine[chosen]
            dense[:, plan.net_device[picked], plan.net_metric[picked]] = net[:, here[chosen]]
            arrays.append(dense)
        with np.errstate(invalid="ignore"):
            rolled = rollup_network(arrays[1], arrays[0], arrays[2], arrays[3][:, 0])
        out[:, n] = np.stack([rolled[name].astype(np.float64) for name in NETWORK_COLUMNS], axis=1)
    return out


def _dictionary(indices: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(names, pa.string()))


def _stamps(plan: Plan, step_of: np.ndarray, first: int) -> pa.Array:
    stamps = np.round((plan.start + (step_of + first) * plan.interval) * 1e9).astype(np.int64)
    return pa.array(stamps, TELEMETRY_SCHEMA.field("timestamp").type)


def _telemetry_table(
    plan: Plan,
    grid: np.ndarray,
    ident: np.ndarray,
    step_of: np.ndarray,
    unit_of: np.ndarray,
    first: int,
    uuids: list[str],
    models: list[str],
    model_of: np.ndarray,
    col: dict[str, int],
) -> pa.Table:
    codes = ident[step_of, unit_of]
    columns: list[pa.Array] = [
        _stamps(plan, step_of, first),
        _dictionary(plan.unit_node[unit_of], plan.nodes),
        pa.array(plan.unit_gpu[unit_of].astype(np.int16)),
        _dictionary(codes, uuids),
        _dictionary(model_of[codes], models),
    ]
    for name in GPU_COLUMNS:
        kind = TELEMETRY_SCHEMA.field(name).type
        dtype = kind.to_pandas_dtype()
        if name in col:
            columns.append(pa.array(grid[step_of, unit_of, col[name]].astype(dtype), kind))
        else:
            columns.append(pa.array(np.full(len(step_of), np.nan, dtype), kind))
    return pa.Table.from_arrays(columns, schema=TELEMETRY_SCHEMA)


def _with_summaries(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """The telemetry table with its rows' step summaries (rows, SUMMARY_WIDTH) appended as
    SUMMARISED_TELEMETRY_SCHEMA has them: no scrapes counted is 0 (and then no summary)."""
    scrapes = np.nan_to_num(rows[:, 0], nan=0.0)
    arrays = [pa.array(np.clip(scrapes, 0, np.iinfo(np.int16).max).astype(np.int16))]
    arrays += [pa.array(rows[:, 1 + k].astype(np.float32)) for k in range(len(SUMMARY_COLUMNS))]
    names = [SCRAPES_COLUMN, *SUMMARY_COLUMNS]
    out = pa.Table.from_arrays([*table.columns, *arrays], names=[*table.column_names, *names])
    return out.cast(SUMMARISED_TELEMETRY_SCHEMA)


def _network_table(
    plan: Plan, rows: np.ndarray, step_of: np.ndarray, node_of: np.ndarray, first: int
) -> pa.Table:
    columns: list[pa.Array] = [_stamps(plan, step_of, first), _dictionary(node_of, plan.nodes)]
    for c, name in enumerate(NETWORK_COLUMNS):
        kind = NETWORK_SCHEMA.field(name).type
        columns.append(pa.array(rows[step_of, node_of, c].astype(kind.to_pandas_dtype()), kind))
    return pa.Table.from_arrays(columns, schema=NETWORK_SCHEMA)


def default_chunk_steps(units: int, rows: int = 262_144, most: int = 1440) -> int:
    """Grid steps per slice: about `rows` GPU rows, at most `most` steps (a day at 60 s)."""
    return max(1, min(most, rows // max(1, units)))
