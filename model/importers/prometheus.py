"""Import of real history: a Prometheus range-query export and a failure log, written as the data
directory the model reads (the fleet twin's four files), so operators can train, evaluate and
score on their own clusters.

The export is what `GET /api/v1/query_range` answers (`{"status": "success", "data": {"resultType":
"matrix", "result": [...]}}`), a JSON list of such answers (one per query), or a directory of
`.json` files holding either; a series may be split across answers and files (by time, say).
Series are matched to the metric catalogue by name: dcgm-exporter's in either vocabulary of
faultcast.dcgm, its default CSV's (`DCGM_FI_DEV_GPU_TEMP`, ...) or DCGM 4.6's canonical fields
(`DCGM_FI_DEV_GPU_TEMP_CELSIUS`, `DCGM_FI_DEV_SM_CLOCK_HERTZ`, ..., converted back to the catalogue's
units: hertz to megahertz, joules to millijoules, ratios to percent), node_exporter's InfiniBand,
TCP and interface series (faultcast.model.importers.names), and faultcast's own (`faultcast_*`, the Xid
family told apart by its `xid` label). The node is the `Hostname` label (dcgm-exporter 4.8), else
`hostname` (its main branch after 4.8.2), else `instance` without its port; the GPU is the `gpu`
label. Samples at any cadence are laid on a grid of `cadence_s` seconds aligned to the epoch, the
last sample of a step winning (what the model does online). Non-finite values ("NaN", "+Inf")
become missing.

What a plain dcgm-exporter lacks is filled from what it does export, and the manifest says so: the
throttle flags come from the clock-event-reasons bitmask, the Xid counters by code from the changes
of DCGM_FI_DEV_XID_ERRORS (the last Xid seen; an Xid repeating the previous code is invisible there,
so those counts are a lower bound), and gpu_util from DCGM_FI_PROF_GR_ENGINE_ACTIVE x 100 on a GPU
without DCGM_FI_DEV_GPU_UTIL. Every series left out is reported once, by name, with the reason and
a count (the manifest's `not_used`). A frozen dcgm-exporter (every gauge of a GPU bit-identical for
over an hour) is written as missing and counted per node (faultcast.model.importers.grid).

Memory and disk: the export is streamed (faultcast.model.importers.export_reader), one series at a time; its
samples go to a temporary spill on disk by time bucket (about 20 bytes a sample, in `spill_dir`,
by default the system's temporary directory) and are then gridded and written a slice of time at a
time. Peak memory follows the fleet's size (GPUs x slice) and the longest single series, not the
length of the history.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import math
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from faultcast.catalogue import (
    CATALOGUE_VERSION,
    METRICS,
    SCHEMA_HASH,
    Kind,
    Metric,
    Scope,
    by_name,
    metrics_for,
)
from faultcast.dcgm import RATIO_OR_PERCENT, readable_names
from faultcast.model.features.offline import DataError
from faultcast.model.importers.export_reader import Series, read_export
from faultcast.model.importers.fetch import (
    MAX_POINTS,
    PER_ANSWER,
    STEP_LABEL,
    STEP_STATS,
    Client,
    FetchReport,
    fetch,
)
from faultcast.model.importers.grid import (
    GPU,
    NETWORK,
    NETWORK_SCOPES,
    SUMMARY,
    UNUSED,
    XID_ALL,
    Plan,
    Written,
    default_chunk_steps,
    write_grid,
)
from faultcast.model.importers.names import (
    GR_ENGINE_ACTIVE,
    GR_ENGINE_FACTOR,
    NODE_EXPORTER,
    virtual_interface,
    why_unknown,
)
from faultcast.model.importers.spill import Spill
from faultcast.rollup import NETWORK_COLUMNS
from faultcast.schemas import FAILURE_FIELDS, GPU_COLUMNS, NETWORK_SCHEMA, TELEMETRY_SCHEMA
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARISED, SUMMARY_COLUMNS

log = logging.getLogger(__name__)

KIND = "prometheus import"
DEFAULT_NODE_LABELS: tuple[str, ...] = ("Hostname", "hostname", "instance")
DEFAULT_FROZEN_AFTER_S = 3600.0
"""A GPU whose every gauge stays bit-identical for longer than this is a frozen exporter (see
faultcast.model.importers.grid for why an hour)."""
_REQUIRED_FAILURE_FIELDS = ("timestamp", "node", "gpu", "mode")
_BITMASK = re.compile(r"^clock_event_reasons & (0x[0-9a-fA-F]+)$")
_PLAIN, _RATIO_OR_PERCENT, _FALLBACK = 0, 1, 2  # how a GPU series' values become the column's


def _lookup() -> tuple[dict[str, Metric], dict[tuple[str, str], Metric]]:
    """Series name -> metric, and (family, label value) -> metric for labelled families."""
    by_name: dict[str, Metric] = {}
    by_family: dict[tuple[str, str], Metric] = {}
    for metric in METRICS:
        if metric.family_label is not None:
            by_family[(metric.prometheus_name, metric.family_label[1])] = metric
            continue
        by_name[metric.prometheus_name] = metric
    catalogue = {m.name: m for m in METRICS}
    for named in readable_names().values():  # dcgm-exporter's names, in both vocabularies
        by_name[named.name] = catalogue[named.metric]
    for name, other in NODE_EXPORTER.items():
        by_name[name] = catalogue[other.metric]
    by_name[GR_ENGINE_ACTIVE] = catalogue["gpu_util"]
    return by_name, by_family


_BY_NAME, _BY_FAMILY = _lookup()
# Series named in other units than the catalogue's: catalogue value = series value x factor.
_TO_CATALOGUE: dict[str, tuple[float, str]] = {
    n.name: (1.0 / n.scale, f"{n.unit} -> {m.unit}")
    for n in readable_names().values()
    if n.scale != 1.0
    for m in METRICS
    if m.name == n.metric
}
_TO_CATALOGUE.update({name: (o.factor, o.conversion) for name, o in NODE_EXPORTER.items() if o.factor != 1.0})
_FAMILY_LABEL = {m.prometheus_name: m.family_label[0] for m in METRICS if m.family_label is not None}
# Throttle flags the collector derives from the bitmask (the catalogue's `read` says which bit).
_FLAG_BITS: dict[str, int] = {
    m.name: int(match.group(1), 16)
    for m in METRICS
    if m.scope is Scope.GPU and (match := _BITMASK.match(m.read)) is not None
}
# A step summary series' column in the grid's summary block: 0 the scrapes, then SUMMARY_COLUMNS.
_SUMMARY_SLOT = {
    (metric, stat): 1 + SUMMARY_COLUMNS.index(f"{metric}_step_{stat}")
    for metric in SUMMARISED
    for stat in STEP_STATS
    if stat != "scrapes"
}
_GAUGES = frozenset(m.name for m in metrics_for(Scope.GPU) if m.kind is Kind.GAUGE) - set(_FLAG_BITS)
_SCOPE_INDEX = {scope: i for i, scope in enumerate(NETWORK_SCOPES)}
_METRIC_INDEX = {m.name: (m.scope, k) for scope in NETWORK_SCOPES for k, m in enumerate(metrics_for(scope))}


def _fetchable(name: str) -> bool:
    """Whether series of this name may hold something the import reads."""
    metric = _BY_NAME.get(name)
    return metric.scope is not Scope.COLLECTOR if metric is not None else name in _FAMILY_LABEL


def fetch_prometheus(
    url: str,
    since: float,
    until: float,
    step_s: float,
    folder: Path,
    *,
    points: int = MAX_POINTS,
    per_answer: int = PER_ANSWER,
    client: Client | None = None,
    keep: Callable[[str], bool] | None = None,
) -> FetchReport:
    """The series a running Prometheus holds in [since, until] that the import reads, with the step
    summaries where the raw series is finer than `step_s`, as export files in `folder`
    (faultcast.model.importers.fetch); `import_prometheus(folder, ...)` reads them. `keep` narrows
    the names further (e.g. to dcgm-exporter's alone)."""
    summarised = {name: m.name for name, m in _BY_NAME.items() if m.name in SUMMARISED}
    flags = {by_name(flag).prometheus_name: bit for flag, bit in _FLAG_BITS.items() if flag in SUMMARISED}
    masks = sorted(name for name, m in _BY_NAME.items() if m.name == "clock_event_reasons")
    return fetch(
        url,
        since,
        until,
        step_s,
        folder,
        known=_fetchable if keep is None else (lambda name: _fetchable(name) and keep(name)),
        summarised=summarised,
        flag_bits=flags,
        bitmask_names=masks,
        points=points,
        per_answer=per_answer,
        client=client,
    )


@dataclass
class _Parsed:
    """What the first pass learnt; the samples themselves are in the spill."""

    units: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, gpu) -> unit, first seen
    streams: dict[tuple[Any, ...], int] = field(default_factory=dict)  # key -> the spill's stream
    unit_columns: dict[int, set[str]] = field(default_factory=dict)  # columns a unit has series of
    fallback_series: Counter[int] = field(default_factory=Counter)  # unit -> GR_ENGINE_ACTIVE series
    devices: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # node -> column -> devices
    network_nodes: set[str] = field(default_factory=set)
    identities: dict[tuple[str, str], int] = field(default_factory=dict)
    mapped: dict[str, Counter[str]] = field(default_factory=dict)  # column -> series name -> series
    summaries: dict[str, set[int]] = field(default_factory=dict)  # summary column -> units with it
    unknown: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> series
    ratio_or_percent_max: dict[str, float] = field(default_factory=dict)  # decided once all are read
    converted: dict[str, str] = field(default_factory=dict)  # series name -> the conversion applied
    spacings: Counter[int] = field(default_factory=Counter)  # milliseconds -> how many
    samples: int = 0
    not_finite: int = 0
    t_min: float = math.inf
    t_max: float = -math.inf
    sources: list[str] = field(default_factory=list)


def _node_of(labels: dict[str, str], node_labels: Sequence[str]) -> str | None:
    for label in node_labels:
        value = labels.get(label)
        if value:
            if label == "instance":  # host:port or [v6]:port; a bare IPv6 address stays whole
                if value.startswith("[") and "]" in value:
                    value = value[1 : value.index("]")]
                elif value.count(":") == 1 and value.rpartition(":")[2].isdigit():
                    value = value.rpartition(":")[0]
            return value
    return None


def _values(source: str, name: str, raw: Any) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{source}: series {name} has no `values` list (a range query's samples)")
    try:
        times = np.fromiter((float(pair[0]) for pair in raw), dtype=np.float64, count=len(raw))
        values = np.array([pair[1] for pair in raw], dtype=str).astype(np.float64)
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise DataError(
            f'{source}: series {name}: samples must be [unix_seconds, "value"] pairs ({exc})'
        ) from exc
    return times, values


def _metric_of(name: str, labels: dict[str, str]) -> tuple[Metric | None, str]:
    """The catalogue metric a series is (None: unknown) and its name as messages show it (with the
    label that picks a family member, for a family name)."""
    metric = _BY_NAME.get(name)
    if metric is None and name in _FAMILY_LABEL:
        value = labels.get(_FAMILY_LABEL[name], "")
        return _BY_FAMILY.get((name, value)), f'{name}{{{_FAMILY_LABEL[name]}="{value}"}}'
    return metric, name


def _wanted(labels: Any) -> bool:
    """Whether a series with this label set is read (the others are counted, their samples skipped)."""
    if not isinstance(labels, dict):
        return True  # the caller raises
    metric, _ = _metric_of(str(labels.get("__name__", "")), {str(k): str(v) for k, v in labels.items()})
    return metric is not None and metric.scope is not Scope.COLLECTOR


def _gpu_index(source: str, display: str, node: str, label: str) -> int:
    """The gpu label as an index; raises DataError when it is not a whole number >= 0."""
    try:
        gpu = int(label)
    except ValueError as exc:
        raise DataError(f"{source}: {display} on {node}: gpu label {label!r} is not an index") from exc
    if gpu < 0:
        raise DataError(f"{source}: {display} on {node}: negative gpu label {gpu}")
    return gpu


def _parse(export: Path, node_labels: Sequence[str], spill: Spill) -> _Parsed:
    """Every series of the export into the spill, sorted into GPU and network streams, with what was
    left out and why; raises DataError on a malformed series."""
    parsed = _Parsed()
    for series in read_export(export, _wanted, parsed.sources):
        _add_series(parsed, series, node_labels, spill)
    spill.flush()
    return parsed


def _add_series(parsed: _Parsed, series: Series, node_labels: Sequence[str], spill: Spill) -> None:
    """One series of a range-query answer into the spill (or into the counts of what was left out)."""
    source = series.source
    if series.element is not None or not isinstance(series.labels, dict):
        raise DataError(f"{source}: a result without a `metric` label set")
    labels = {str(k): str(v) for k, v in series.labels.items()}
    name = labels.get("__name__", "")
    if not name:
        raise DataError(f"{source}: a series without __name__ (export raw series, not expressions)")
    metric, display = _metric_of(name, labels)
    if metric is None:
        parsed.unknown[display] += 1
        return
    if metric.scope is Scope.COLLECTOR:
        parsed.ignored[name] += 1
        return
    node = _node_of(labels, node_labels)
    if node is None:
        parsed.skipped[f"no node label ({' or '.join(node_labels)})"] += 1
        return
    gpu = -1
    if metric.scope is Scope.GPU:
        if "gpu" not in labels:
            parsed.skipped["GPU metric without a gpu label"] += 1
            return
        gpu = _gpu_index(source, display, node, labels["gpu"])
    elif (
        metric.scope is Scope.INTERFACE
        and name in NODE_EXPORTER
        and virtual_interface(labels.get("device", ""))
    ):
        parsed.skipped["loopback or virtual interface (node_exporter's lo, docker0, veth*, ...)"] += 1
        return
    stat = labels.get(STEP_LABEL)
    if stat is not None and not _summary_known(parsed, source, display, metric, stat):
        return
    if series.samples is not None:
        times, values = series.samples
    else:
        times, values = _values(source, display, series.raw_values)
    if not np.isfinite(times).all():
        raise DataError(f"{source}: series {display} has non-finite timestamps")
    if stat == "scrapes":  # a count: no unit to convert
        parsed.not_finite += int((~np.isfinite(values)).sum())
        values, how = np.where(np.isfinite(values), values, np.nan), _PLAIN
    else:
        values, how = _in_catalogue_units(parsed, name, values)
    parsed.samples += len(times)
    parsed.t_min, parsed.t_max = min(parsed.t_min, times.min()), max(parsed.t_max, times.max())
    if len(times) > 1:
        spacing = np.round(np.diff(np.unique(times)) * 1000.0).astype(np.int64)
        distinct, counts = np.unique(spacing, return_counts=True)
        parsed.spacings.update(dict(zip(distinct.tolist(), counts.tolist(), strict=True)))
    if stat is not None:  # a step summary: its own stream, no identity (the raw series give that)
        unit = parsed.units.setdefault((node, gpu), len(parsed.units))
        slot = 0 if stat == "scrapes" else _SUMMARY_SLOT[(metric.name, stat)]
        key: tuple[Any, ...] = ("sum", unit, slot)
        parsed.summaries.setdefault(SCRAPES_COLUMN if slot == 0 else SUMMARY_COLUMNS[slot - 1], set()).add(
            unit
        )
    elif metric.scope is Scope.GPU:
        unit = parsed.units.setdefault((node, gpu), len(parsed.units))
        identity = (labels.get("UUID", f"{node}/gpu{gpu}"), labels.get("modelName", "unknown"))
        code = parsed.identities.setdefault(identity, len(parsed.identities))
        key = ("gpu", unit, metric.name, how, code)
        if how == _FALLBACK:
            parsed.fallback_series[unit] += 1
        else:
            parsed.unit_columns.setdefault(unit, set()).add(metric.name)
            parsed.mapped.setdefault(metric.name, Counter())[name] += 1
    else:
        device = "|".join(labels.get(k, "") for k in ("device", "port", "peer"))
        key = ("net", node, metric.name, device)
        parsed.network_nodes.add(node)
        parsed.devices.setdefault(node, {}).setdefault(metric.name, set()).add(device)
        parsed.mapped.setdefault(metric.name, Counter())[name] += 1
    spill.add(parsed.streams.setdefault(key, len(parsed.streams)), times, values)


def _summary_known(parsed: _Parsed, source: str, display: str, metric: Metric, stat: str) -> bool:
    """Whether a series labelled as a step summary is one the grid keeps (else it is counted as
    skipped); DataError on a label value that is no summary statistic."""
    if stat not in STEP_STATS:
        raise DataError(
            f"{source}: series {display} has {STEP_LABEL}={stat!r}; expected one of {', '.join(STEP_STATS)}"
        )
    if metric.scope is not Scope.GPU or (stat != "scrapes" and metric.name not in SUMMARISED):
        parsed.skipped[f"step summary of a metric the model does not summarise ({STEP_LABEL})"] += 1
        return False
    return True


def _in_catalogue_units(parsed: _Parsed, name: str, values: np.ndarray) -> tuple[np.ndarray, int]:
    """NaN for non-finite samples (counted), and the catalogue's units (conversions recorded); a
    ratio-or-percent series is scaled once the whole export has been read."""
    finite = np.isfinite(values)
    parsed.not_finite += int((~finite).sum())
    values = np.where(finite, values, np.nan)
    if name in RATIO_OR_PERCENT:
        top = float(np.nanmax(values, initial=0.0))
        parsed.ratio_or_percent_max[name] = max(parsed.ratio_or_percent_max.get(name, 0.0), top)
        return values, _RATIO_OR_PERCENT
    if name == GR_ENGINE_ACTIVE:
        return values * GR_ENGINE_FACTOR, _FALLBACK
    if name in _TO_CATALOGUE:
        factor, what = _TO_CATALOGUE[name]
        values = values * factor
        parsed.converted[name] = f"x {factor:g} ({what})"
    return values, _PLAIN


def _ratio_factors(parsed: _Parsed) -> dict[str, float]:
    """DCGM_FI_DEV_GPU_UTIL_RATIO is a percent from DCGM 4.6 (field 203 renamed) and a 0-1 ratio
    from DCGM 4.7: a value above 1 anywhere in the export says percent, else it is a ratio."""
    factors = {}
    for name, top in parsed.ratio_or_percent_max.items():
        if top > 1.0:
            parsed.converted[name] = "x 1 (values above 1: a percent already, DCGM 4.6)"
            factors[name] = 1.0
        else:
            factor, what = _TO_CATALOGUE[name]
            parsed.converted[name] = f"x {factor:g} ({what})"
            factors[name] = factor
    return factors


def _interval(parsed: _Parsed, cadence_s: float | None) -> float:
    if cadence_s is not None:
        if not (cadence_s > 0 and math.isfinite(cadence_s)):
            raise DataError(f"the interval must be a positive number of seconds, got {cadence_s}")
        return float(cadence_s)
    total = sum(parsed.spacings.values())
    if total == 0:
        raise DataError("every series has a single sample: give the interval (--interval) explicitly")
    middle = sorted(parsed.spacings.items())
    wanted = [(total - 1) // 2, total // 2]  # np.median: the mean of the middle one or two
    found: list[float] = []
    seen = 0
    for value, count in middle:
        while wanted and wanted[0] < seen + count:
            found.append(value / 1000.0)
            wanted.pop(0)
        seen += count
    return float(max(1, round((found[0] + found[1]) / 2.0)))


@dataclass(frozen=True)
class _Grid:
    """The time grid the import resamples to, and the nodes in file order."""

    start: float  # unix seconds, a multiple of the interval
    interval: float
    steps: int
    gpus_per_node: int
    nodes: list[str]
    node_index: dict[str, int]


def _grid(export: Path, parsed: _Parsed, cadence_s: float | None, gpus_per_node: int | None) -> _Grid:
    """The grid and the nodes; raises DataError when the export has no GPU series or a GPU index
    beyond `gpus_per_node`."""
    if not parsed.units:
        shown = ", ".join(name for name, _ in parsed.unknown.most_common(5)) or "none"
        raise DataError(
            f"{export}: no series of a GPU metric the catalogue knows (DCGM_FI_DEV_GPU_TEMP, ...) with a node "
            f"and a gpu label; most common unknown names: {shown}"
        )
    interval = _interval(parsed, cadence_s)
    start = math.floor(parsed.t_min / interval) * interval
    steps = int((parsed.t_max - start) // interval) + 1
    largest = max(gpu for _, gpu in parsed.units) + 1
    if gpus_per_node is None:
        gpus_per_node = largest
    elif gpus_per_node < largest:
        raise DataError(
            f"the export has GPU index {largest - 1}, more than --gpus-per-node {gpus_per_node} allows"
        )
    nodes = sorted({node for node, _ in parsed.units} | parsed.network_nodes)
    return _Grid(start, interval, steps, gpus_per_node, nodes, {name: i for i, name in enumerate(nodes)})


def _plan(parsed: _Parsed, grid: _Grid) -> tuple[Plan, dict[str, Any]]:
    """The second pass's arrays, and the use made of GR_ENGINE_ACTIVE (for the manifest)."""
    keys = sorted(parsed.units, key=lambda k: (grid.node_index[k[0]], k[1]))
    position = np.empty(len(keys), np.int64)
    for k, key in enumerate(keys):
        position[parsed.units[key]] = k
    with_util = {u for u, columns in parsed.unit_columns.items() if "gpu_util" in columns}
    fallback = {u for u in parsed.fallback_series if u not in with_util}
    raw = set().union(*parsed.unit_columns.values()) | ({"gpu_util"} if fallback else set())
    derivable = set(_FLAG_BITS) if "clock_event_reasons" in raw else set()
    derivable |= set(XID_ALL) if "xid_last" in raw else set()
    columns = [c for c in GPU_COLUMNS if c in raw | derivable]
    col = {c: i for i, c in enumerate(columns)}
    seen = np.zeros((len(keys), len(columns)), dtype=bool)
    for unit, names in parsed.unit_columns.items():
        for name in names:
            seen[position[unit], col[name]] = True
    for unit in fallback:
        seen[position[unit], col["gpu_util"]] = True
    identities = list(parsed.identities)
    rank = np.empty(len(identities), dtype=np.int64)
    rank[sorted(range(len(identities)), key=identities.__getitem__)] = np.arange(len(identities))
    ratio = _ratio_factors(parsed)
    n = len(parsed.streams)
    kind = np.full(n, UNUSED, np.int8)
    unit_, column, ident = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    factor = np.ones(n)
    net = [np.zeros(n, np.int64) for _ in range(4)]
    devices = np.zeros((len(grid.nodes), len(NETWORK_SCOPES)), np.int64)
    device_lists: dict[tuple[str, Scope], list[str]] = {}
    for node, by_column in parsed.devices.items():
        for scope in NETWORK_SCOPES:
            listed = sorted({d for m in metrics_for(scope) for d in by_column.get(m.name, ())})
            device_lists[(node, scope)] = listed
            devices[grid.node_index[node], _SCOPE_INDEX[scope]] = len(listed)
    for what, stream in parsed.streams.items():
        if what[0] == "sum":
            kind[stream] = SUMMARY
            unit_[stream], column[stream] = position[what[1]], what[2]
        elif what[0] == "gpu":
            unit, name, how, code = what[1], what[2], what[3], what[4]
            if how == _FALLBACK and unit not in fallback:
                continue  # the GPU has DCGM_FI_DEV_GPU_UTIL: GR_ENGINE_ACTIVE goes unused
            kind[stream] = GPU
            unit_[stream], column[stream], ident[stream] = position[unit], col[name], rank[code]
            if how == _RATIO_OR_PERCENT:
                factor[stream] = ratio["DCGM_FI_DEV_GPU_UTIL_RATIO"]
        else:
            node, name, device = what[1], what[2], what[3]
            scope, metric_index = _METRIC_INDEX[name]
            kind[stream] = NETWORK
            net[0][stream] = grid.node_index[node]
            net[1][stream] = _SCOPE_INDEX[scope]
            net[2][stream] = device_lists[(node, scope)].index(device)
            net[3][stream] = metric_index
    plan = Plan(
        start=grid.start,
        interval=grid.interval,
        steps=grid.steps,
        nodes=grid.nodes,
        unit_node=np.array([grid.node_index[n] for n, _ in keys], np.int64),
        unit_gpu=np.array([g for _, g in keys], np.int64),
        identities=sorted(identities),
        columns=columns,
        seen=seen,
        gauges=[i for i, c in enumerate(columns) if c in _GAUGES],
        flag_bits=dict(_FLAG_BITS),
        kind=kind,
        unit=unit_,
        column=column,
        ident=ident,
        factor=factor,
        net_node=net[0],
        net_scope=net[1],
        net_device=net[2],
        net_metric=net[3],
        net_devices=devices,
        summarised=bool(parsed.summaries),
    )
    used = sum(parsed.fallback_series[u] for u in fallback)
    unused = sum(parsed.fallback_series.values()) - used
    gr = {"gpus_used": len(fallback), "series_used": used, "series_unused": unused}
    return plan, {"keys": keys, **gr}


def import_prometheus(
    export: Path,
    failures_csv: Path | None,
    out: Path,
    *,
    cadence_s: float | None = None,
    gpus_per_node: int | None = None,
    node_labels: Sequence[str] = DEFAULT_NODE_LABELS,
    frozen_after_s: float = DEFAULT_FROZEN_AFTER_S,
    chunk_steps: int | None = None,
    spill_dir: Path | None = None,
    bucket_s: float = 3600.0,
    flush_samples: int = 2_000_000,
    observe: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write `out` (telemetry.parquet, network.parquet, failures.csv, manifest.json) from a Prometheus
    range-query export and a failure log; return the manifest. Raises DataError on malformed input.

    Without a failure log (`failures_csv=None`) the failure file is empty and the manifest says so:
    such data can be scored but not trained or evaluated on. `frozen_after_s` <= 0 keeps frozen
    exporters' values. `chunk_steps` (grid steps per row group; default: about 262,144 GPU rows),
    `spill_dir`, `bucket_s` and `flush_samples` size the streaming; `observe` is told the grid rows
    each slice holds (tests and benchmarks)."""
    if not math.isfinite(frozen_after_s):
        raise DataError(
            f"the frozen-exporter threshold must be a finite number of seconds, got {frozen_after_s}"
        )
    with tempfile.TemporaryDirectory(dir=spill_dir, prefix="faultcast-import-") as folder:
        spill = Spill(Path(folder), bucket_s=bucket_s, flush_samples=flush_samples)
        parsed = _parse(export, node_labels, spill)
        grid = _grid(export, parsed, cadence_s, gpus_per_node)
        plan, use = _plan(parsed, grid)
        failures = (
            _failures(failures_csv, grid.nodes, grid.gpus_per_node) if failures_csv else []
        )  # checked before anything is written
        steps = chunk_steps if chunk_steps is not None else default_chunk_steps(len(use["keys"]))
        if steps < 1:
            raise DataError(f"chunk_steps must be at least 1, got {steps}")
        out.mkdir(parents=True, exist_ok=True)
        written = write_grid(
            out, spill, plan, chunk_steps=steps, frozen_after_s=frozen_after_s, observe=observe
        )
        streaming = {
            "chunk_steps": steps,
            "row_groups": written.row_groups,
            "largest_chunk_rows": written.largest_chunk_rows,
            "largest_read_samples": spill.largest_read,
            "spill_bytes": spill.bytes,
        }
    uuids = [u for u, _ in plan.identities]
    unit_of = {key: k for k, key in enumerate(use["keys"])}
    rows_out = []
    for when, node, gpu, row in failures:
        if not row["uuid"] and gpu >= 0 and (node, gpu) in unit_of:
            row["uuid"] = _uuid_before(written.identity_changes[unit_of[(node, gpu)]], uuids, when, grid)
        rows_out.append(row)
    with (out / "failures.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FAILURE_FIELDS)
        writer.writeheader()
        writer.writerows(rows_out)
    rows = {"telemetry": written.telemetry_rows, "network": written.network_rows, "failures": len(rows_out)}
    manifest = _data_manifest(export, failures_csv, parsed, grid, plan, use, written, rows_out, rows)
    manifest["frozen"] = _frozen_report(use["keys"], written, grid, frozen_after_s)
    manifest["streaming"] = streaming
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log.info(
        "imported %d samples of %d GPUs on %d nodes at %.0f s: %d telemetry rows, %d failures; %d series not used",
        parsed.samples,
        len(use["keys"]),
        len(grid.nodes),
        grid.interval,
        written.telemetry_rows,
        len(rows_out),
        sum(v["series"] for v in manifest["not_used"].values()),
    )
    return manifest


def _frozen_report(
    keys: list[tuple[str, int]], written: Written, grid: _Grid, after_s: float
) -> dict[str, Any]:
    by_node: dict[str, dict[str, float]] = {}
    for k, (node, _) in enumerate(keys):
        steps = int(written.frozen_steps[k])
        if steps:
            entry = by_node.setdefault(node, {"gpus": 0, "spans": 0, "samples_blanked": 0, "hours": 0.0})
            entry["gpus"] += 1
            entry["spans"] += int(written.frozen_spans[k])
            entry["samples_blanked"] += steps
            entry["hours"] += steps * grid.interval / 3600.0
    return {
        "threshold_s": after_s if after_s > 0 else None,
        "rule": "every gauge a GPU reports bit-identical to the step before for longer than the threshold: "
        "the steps after the first are written as missing",
        "gpus": sum(int(v["gpus"]) for v in by_node.values()),
        "samples_blanked": int(written.frozen_steps.sum()),
        "by_node": by_node,
    }


def _data_manifest(
    export: Path,
    failures_csv: Path | None,
    parsed: _Parsed,
    grid: _Grid,
    plan: Plan,
    use: dict[str, Any],
    written: Written,
    failures: list[dict[str, str]],
    rows: dict[str, int],
) -> dict[str, Any]:
    """The data directory's manifest.json: what was imported, mapped, derived and left out."""
    start, interval = grid.start, grid.interval
    end = start + grid.steps * interval
    outside = sum(1 for f in failures if not start < _parse_time(f["timestamp"]) <= end)
    mapped_counts = {name: Counter(parsed.mapped.get(name, {})) for name in parsed.mapped}
    converted = dict(parsed.converted)
    if use["series_used"]:
        mapped_counts.setdefault("gpu_util", Counter())[GR_ENGINE_ACTIVE] += use["series_used"]
        converted[GR_ENGINE_ACTIVE] = (
            f"x {GR_ENGINE_FACTOR:g} (ratio -> percent), as gpu_util on the {use['gpus_used']} GPUs without "
            "DCGM_FI_DEV_GPU_UTIL"
        )
    mapped = {
        name: dict(mapped_counts[name]) for name in [*GPU_COLUMNS, *NETWORK_COLUMNS] if name in mapped_counts
    }
    derived: dict[str, int] = dict(written.flag_units)
    if written.xid_units:
        derived.update({name: written.xid_units for name in XID_ALL})
    have = set(mapped) | set(derived)
    return {
        "kind": KIND,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": {
            "export": str(export),
            "responses": parsed.sources,
            "failures": str(failures_csv) if failures_csv else None,
        },
        "config": {
            "nodes": len(grid.nodes),
            "gpus_per_node": grid.gpus_per_node,
            "days": grid.steps * interval / 86_400.0,
            "cadence_s": interval,
            "start_unix_s": start,
        },
        "nodes": grid.nodes,
        "start": _iso(start),
        "end": _iso(end),
        "gpu_days": float(written.gpu_steps) * interval / 86_400.0,
        "failure_log": failures_csv is not None,
        "rows": rows,
        "samples": parsed.samples,
        "samples_not_finite": parsed.not_finite,
        "failures_outside_data": outside,
        "failure_counts": dict(sorted(Counter(f["mode"] for f in failures).items())),
        "gpus": len(use["keys"]),
        "mapped": mapped,
        "derived": {
            name: {"gpus": count, "from": _derived_from(name)} for name, count in sorted(derived.items())
        },
        "missing": {
            "telemetry": [c for c in GPU_COLUMNS if c not in have],
            "network": [c for c in NETWORK_COLUMNS if c not in have],
        },
        "units_converted": dict(sorted(converted.items())),
        "step_summaries": {
            "gpus": {column: len(units) for column, units in sorted(parsed.summaries.items())},
            "how": f"series labelled {STEP_LABEL} (min, max, mean, scrapes), as `import-prometheus --url` "
            "fetches them where the raw series is finer than the step",
        },
        "not_used": _not_used(parsed, use),
        "nodes_without_gpus": sorted(parsed.network_nodes - {node for node, _ in parsed.units}),
        "unknown_metrics": dict(parsed.unknown.most_common()),
        "ignored_metrics": dict(parsed.ignored.most_common()),
        "skipped_series": dict(parsed.skipped.most_common()),
        "catalogue": {"version": CATALOGUE_VERSION, "schema_hash": f"{SCHEMA_HASH:#018x}"},
        "telemetry_columns": TELEMETRY_SCHEMA.names,
        "network_columns": NETWORK_SCHEMA.names,
    }


def _not_used(parsed: _Parsed, use: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every series name left out, once: how many series and why (most series first)."""
    out: dict[str, dict[str, Any]] = {}
    for name, n in parsed.unknown.items():
        out[name] = {"series": n, "why": why_unknown(name)}
    for name, n in parsed.ignored.items():
        out[name] = {"series": n, "why": "the collector's own health, not telemetry of the fleet"}
    if use["series_unused"]:
        out[GR_ENGINE_ACTIVE] = {
            "series": use["series_unused"],
            "why": "imported but unused: gpu_util comes from DCGM_FI_DEV_GPU_UTIL on these GPUs",
        }
    for reason, n in parsed.skipped.items():
        out[f"(series skipped: {reason})"] = {"series": n, "why": reason}
    return dict(sorted(out.items(), key=lambda item: (-item[1]["series"], item[0])))


def _derived_from(name: str) -> str:
    if name in _FLAG_BITS:
        return f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS & {_FLAG_BITS[name]:#04x}"
    return "changes of DCGM_FI_DEV_XID_ERRORS (a lower bound: a repeated Xid is invisible there)"


def _iso(seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse_time(text: str) -> float:
    """Unix seconds from unix seconds or an ISO 8601 time (UTC when it names no zone)."""
    try:
        seconds = float(text)
    except ValueError:
        stamp = pd.Timestamp(text)
        if pd.isna(stamp):
            raise ValueError("empty") from None
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize("UTC")
        seconds = float(stamp.timestamp())
    if not math.isfinite(seconds):
        raise ValueError("not finite")
    return seconds


def _failures(
    path: Path, nodes: Sequence[str], gpus_per_node: int
) -> list[tuple[float, str, int, dict[str, str]]]:
    """Validated, normalised failure rows (FAILURE_FIELDS) with their time, node and GPU, sorted by
    time; a row's uuid is filled from the telemetry once it is written."""
    if not path.is_file():
        raise DataError(f"{path}: the failure log is missing")
    rows: list[tuple[float, str, int, dict[str, str]]] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [f for f in _REQUIRED_FAILURE_FIELDS if f not in header]
        if missing:
            raise DataError(
                f"{path}: the failure log lacks columns {missing} (required: {', '.join(_REQUIRED_FAILURE_FIELDS)}; "
                "optional: xid, uuid, precursor_s, description)"
            )
        reader.fieldnames = header
        known = frozenset(nodes)
        for line, raw in enumerate(reader, start=2):
            row = {k: (v or "").strip() for k, v in raw.items() if k is not None}
            where = f"{path}:{line}"
            when, node, gpu, xid = _failure_fields(where, row, nodes, known, gpus_per_node)
            normalised = {
                "timestamp": _iso(when),
                "node": node,
                "gpu": "" if gpu < 0 else str(gpu),
                "uuid": row.get("uuid", ""),
                "mode": row["mode"],
                "xid": "" if xid == "0" else xid,
                "precursor_s": _precursor_text(where, row.get("precursor_s", "")),
                "description": row.get("description", ""),
            }
            rows.append((when, node, gpu, normalised))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return rows


def _failure_fields(
    where: str, row: dict[str, str], nodes: Sequence[str], known: frozenset[str], gpus_per_node: int
) -> tuple[float, str, int, str]:
    """A failure row's time (unix seconds), node, GPU (-1: the whole node) and Xid (a whole number
    as text, or ""); raises DataError, naming `where`, on a value that is not one."""
    try:
        when = _parse_time(row["timestamp"])
    except (ValueError, OverflowError) as exc:
        raise DataError(f"{where}: timestamp {row['timestamp']!r} is not a time ({exc})") from exc
    node = row["node"]
    if node not in known:
        shown = ", ".join(list(nodes)[:5]) + (", ..." if len(nodes) > 5 else "")
        raise DataError(f"{where}: node {node!r} is not in the export (nodes: {shown})")
    gpu = -1
    if row["gpu"] not in ("", "-1"):
        try:
            gpu = int(row["gpu"])
        except ValueError as exc:
            raise DataError(
                f"{where}: gpu {row['gpu']!r} is not a GPU index (empty: the whole node)"
            ) from exc
        if not 0 <= gpu < gpus_per_node:
            raise DataError(f"{where}: gpu {gpu} outside 0..{gpus_per_node - 1}")
    if not row["mode"]:
        raise DataError(f"{where}: the failure mode is empty")
    xid = row.get("xid", "")
    if xid:
        try:
            xid = str(int(float(xid)))
        except ValueError as exc:
            raise DataError(f"{where}: xid {xid!r} is not a number") from exc
    return when, node, gpu, xid


def _precursor_text(where: str, text: str) -> str:
    """A user's `precursor_s` (seconds the failure's precursor ran; 0: none) as written: "" when the
    log does not say; raises DataError, naming `where`, on anything but a non-negative number."""
    if not text:
        return ""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise DataError(
            f"{where}: precursor_s {text!r} is not a non-negative number of seconds (empty: unknown)"
        )
    return str(int(seconds)) if seconds.is_integer() else repr(seconds)


def _uuid_before(changes: list[tuple[int, int]], uuids: list[str], when: float, grid: _Grid) -> str:
    """The UUID the GPU reported last at or before `when` (the first one when it is earlier), from
    the (step, identity) points where what it reported changed."""
    if not changes:
        return ""
    step = int((when - grid.start) // grid.interval)
    before = [code for at, code in changes if at <= step]
    return uuids[before[-1] if before else changes[0][1]]
