"""Import of real history: a Prometheus range-query export and a failure log, written as the data
directory the model reads (the fleet twin's four files), so operators can train, evaluate and
score on their own clusters.

The export is what `GET /api/v1/query_range` answers (`{"status": "success", "data": {"resultType":
"matrix", "result": [...]}}`), a JSON list of such answers (one per query), or a directory of
`.json` files holding either. Series are matched to the metric catalogue by name: dcgm-exporter's
in either vocabulary of faultcast.dcgm, its default CSV's (`DCGM_FI_DEV_GPU_TEMP`, ...) or DCGM 4.6's
canonical fields (`DCGM_FI_DEV_GPU_TEMP_CELSIUS`, `DCGM_FI_DEV_SM_CLOCK_HERTZ`, ..., converted back to
the catalogue's units: hertz to megahertz, joules to millijoules, ratios to percent), and
faultcast's own (`faultcast_*`, the Xid family told apart by its `xid` label). The node is the
`Hostname` label (dcgm-exporter 4.8), else `hostname` (its main branch after 4.8.2), else `instance`
without its port; the GPU is the `gpu` label. Samples at any cadence are laid on a grid of
`cadence_s` seconds aligned to the epoch, the last sample of a step winning (what the model does
online). Non-finite values ("NaN", "+Inf") become missing. Names the catalogue does not know are
counted in the manifest, and so are the unit conversions made.

Two gaps of a plain dcgm-exporter are filled from what it does export, and the manifest says so:
the throttle flags come from the clock-event-reasons bitmask, and the Xid counters by code from
the changes of DCGM_FI_DEV_XID_ERRORS (the last Xid seen; an Xid repeating the previous code is
invisible there, so those counts are a lower bound).

Memory: the export is parsed whole and the grid is held densely per GPU, which suits exports of
days to weeks of a few hundred GPUs; export longer histories in pieces.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast.catalogue import (
    CATALOGUE_VERSION,
    METRICS,
    SCHEMA_HASH,
    TRACKED_XIDS,
    Metric,
    Scope,
    metrics_for,
)
from faultcast.dcgm import RATIO_OR_PERCENT, readable_names
from faultcast.model.dataset import DataError
from faultcast.rollup import NETWORK_COLUMNS, rollup_network
from faultcast.schemas import FAILURE_FIELDS, GPU_COLUMNS, NETWORK_SCHEMA, TELEMETRY_SCHEMA

log = logging.getLogger(__name__)

KIND = "prometheus import"
DEFAULT_NODE_LABELS: tuple[str, ...] = ("Hostname", "hostname", "instance")
_NETWORK_SCOPES = (Scope.INTERFACE, Scope.IB_PORT, Scope.PEER, Scope.HOST)
_CHUNK_STEPS = 1440  # grid steps per written row group
_REQUIRED_FAILURE_FIELDS = ("timestamp", "node", "gpu", "mode")
_GPU_INDEX = {name: i for i, name in enumerate(GPU_COLUMNS)}
_BITMASK = re.compile(r"^clock_event_reasons & (0x[0-9a-fA-F]+)$")


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
_FAMILY_LABEL = {m.prometheus_name: m.family_label[0] for m in METRICS if m.family_label is not None}
# Throttle flags the collector derives from the bitmask (the catalogue's `read` says which bit).
_FLAG_BITS: dict[str, int] = {
    m.name: int(match.group(1), 16)
    for m in METRICS
    if m.scope is Scope.GPU and (match := _BITMASK.match(m.read)) is not None
}
_XID_COLUMNS = {code: f"xid_{code}_events" for code in TRACKED_XIDS}
_XID_ALL = (*_XID_COLUMNS.values(), "xid_other_events")


@dataclass
class _Samples:
    """The samples of one column of one GPU or node device, from one or several series."""

    times: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)

    def add(self, times: np.ndarray, values: np.ndarray) -> None:
        self.times.append(times)
        self.values.append(values)

    def on_grid(self, start_s: float, cadence_s: float, steps: int) -> np.ndarray:
        """(steps,) values: the last sample within each grid step, NaN where there is none."""
        times, values = np.concatenate(self.times), np.concatenate(self.values)
        order = np.argsort(times, kind="stable")
        step = np.floor((times[order] - start_s) / cadence_s).astype(np.int64)
        last = np.r_[step[1:] != step[:-1], True]
        out = np.full(steps, np.nan)
        out[step[last]] = values[order][last]
        return out


@dataclass
class _Gpu:
    columns: dict[str, _Samples] = field(default_factory=dict)
    identity: _Samples = field(default_factory=_Samples)  # values: index into the (uuid, model) list


@dataclass
class _Parsed:
    gpus: dict[tuple[str, int], _Gpu] = field(default_factory=dict)
    # node -> column -> device -> samples
    network: dict[str, dict[str, dict[str, _Samples]]] = field(default_factory=dict)
    identities: dict[tuple[str, str], int] = field(default_factory=dict)
    mapped: dict[str, Counter[str]] = field(default_factory=dict)  # column -> series name -> series
    unknown: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> series
    # Series of a name DCGM has published both as a ratio and as a percent, decided once all are read.
    ratio_or_percent: dict[str, list[np.ndarray]] = field(default_factory=dict)
    converted: dict[str, str] = field(default_factory=dict)  # series name -> the conversion applied
    spacings: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    not_finite: int = 0
    t_min: float = math.inf
    t_max: float = -math.inf
    sources: list[str] = field(default_factory=list)


def _responses(export: Path) -> Iterator[tuple[str, Any]]:
    if export.is_dir():
        files = sorted(export.glob("*.json"))
        if not files:
            raise DataError(f"{export}: no .json files in the directory")
    elif export.is_file():
        files = [export]
    else:
        raise DataError(f"{export}: no such file or directory")
    for file in files:
        try:
            document = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{file}: not JSON ({exc})") from exc
        if isinstance(document, list):
            for i, response in enumerate(document):
                yield f"{file}[{i}]", response
        else:
            yield str(file), document


def _matrix(source: str, response: Any) -> list[Any]:
    if not isinstance(response, dict):
        raise DataError(f"{source}: expected a Prometheus API response object, got {type(response).__name__}")
    status = response.get("status", "success")
    if status != "success":
        raise DataError(f"{source}: the query failed ({status}): {response.get('error', 'no error given')}")
    data = response.get("data")
    if not isinstance(data, dict) or "result" not in data:
        raise DataError(f"{source}: no data.result: not a Prometheus range-query response")
    kind = data.get("resultType")
    if kind != "matrix":
        raise DataError(
            f"{source}: resultType is {kind!r}, expected 'matrix' (export with /api/v1/query_range, "
            "not /api/v1/query)"
        )
    result = data["result"]
    if not isinstance(result, list):
        raise DataError(f"{source}: data.result is not a list")
    return result


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
    if not np.isfinite(times).all():
        raise DataError(f"{source}: series {name} has non-finite timestamps")
    return times, values


def _parse(export: Path, node_labels: Sequence[str]) -> _Parsed:
    """Every series of the export sorted into GPU and network samples, with what was left out and
    why; raises DataError on a malformed series."""
    parsed = _Parsed()
    for source, response in _responses(export):
        parsed.sources.append(source)
        for series in _matrix(source, response):
            _add_series(parsed, source, series, node_labels)
    _settle_ratio_or_percent(parsed)
    return parsed


def _add_series(parsed: _Parsed, source: str, series: object, node_labels: Sequence[str]) -> None:
    """One series of a range-query answer into `parsed` (or into its counts of what was skipped)."""
    if not isinstance(series, dict) or not isinstance(series.get("metric"), dict):
        raise DataError(f"{source}: a result without a `metric` label set")
    labels = {str(k): str(v) for k, v in series["metric"].items()}
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
    times, values = _values(source, display, series.get("values"))
    values = _in_catalogue_units(parsed, name, values)
    parsed.samples += len(times)
    parsed.t_min, parsed.t_max = min(parsed.t_min, times.min()), max(parsed.t_max, times.max())
    if len(times) > 1:
        parsed.spacings.append(np.diff(np.unique(times)))
    if metric.scope is Scope.GPU:
        entry = parsed.gpus.setdefault((node, gpu), _Gpu())
        entry.columns.setdefault(metric.name, _Samples()).add(times, values)
        identity = (labels.get("UUID", f"{node}/gpu{gpu}"), labels.get("modelName", "unknown"))
        code = parsed.identities.setdefault(identity, len(parsed.identities))
        entry.identity.add(times, np.full(len(times), float(code)))
    else:
        device = "|".join(labels.get(k, "") for k in ("device", "port", "peer"))
        columns = parsed.network.setdefault(node, {})
        columns.setdefault(metric.name, {}).setdefault(device, _Samples()).add(times, values)
    parsed.mapped.setdefault(metric.name, Counter())[name] += 1


def _metric_of(name: str, labels: dict[str, str]) -> tuple[Metric | None, str]:
    """The catalogue metric a series is (None: unknown) and its name as messages show it (with the
    label that picks a family member, for a family name)."""
    metric = _BY_NAME.get(name)
    if metric is None and name in _FAMILY_LABEL:
        value = labels.get(_FAMILY_LABEL[name], "")
        return _BY_FAMILY.get((name, value)), f'{name}{{{_FAMILY_LABEL[name]}="{value}"}}'
    return metric, name


def _gpu_index(source: str, display: str, node: str, label: str) -> int:
    """The gpu label as an index; raises DataError when it is not a whole number >= 0."""
    try:
        gpu = int(label)
    except ValueError as exc:
        raise DataError(f"{source}: {display} on {node}: gpu label {label!r} is not an index") from exc
    if gpu < 0:
        raise DataError(f"{source}: {display} on {node}: negative gpu label {gpu}")
    return gpu


def _in_catalogue_units(parsed: _Parsed, name: str, values: np.ndarray) -> np.ndarray:
    """NaN for non-finite samples (counted), and the catalogue's units (conversions recorded; a
    ratio-or-percent series is kept for `_settle_ratio_or_percent` to scale in place)."""
    finite = np.isfinite(values)
    parsed.not_finite += int((~finite).sum())
    values = np.where(finite, values, np.nan)
    if name in RATIO_OR_PERCENT:
        parsed.ratio_or_percent.setdefault(name, []).append(values)  # scaled in place later
    elif name in _TO_CATALOGUE:
        factor, what = _TO_CATALOGUE[name]
        values = values * factor
        parsed.converted[name] = f"x {factor:g} ({what})"
    return values


def _settle_ratio_or_percent(parsed: _Parsed) -> None:
    """DCGM_FI_DEV_GPU_UTIL_RATIO is a percent from DCGM 4.6 (field 203 renamed) and a 0-1 ratio
    from DCGM 4.7: a value above 1 anywhere in the export says percent, else it is a ratio."""
    for name, arrays in parsed.ratio_or_percent.items():
        if any(np.nanmax(a, initial=0.0) > 1.0 for a in arrays):
            parsed.converted[name] = "x 1 (values above 1: a percent already, DCGM 4.6)"
            continue
        factor, what = _TO_CATALOGUE[name]
        for array in arrays:
            array *= factor  # the arrays the samples hold
        parsed.converted[name] = f"x {factor:g} ({what})"


def _interval(parsed: _Parsed, cadence_s: float | None) -> float:
    if cadence_s is not None:
        if not (cadence_s > 0 and math.isfinite(cadence_s)):
            raise DataError(f"the interval must be a positive number of seconds, got {cadence_s}")
        return float(cadence_s)
    spacings = np.concatenate(parsed.spacings) if parsed.spacings else np.zeros(0)
    if spacings.size == 0:
        raise DataError("every series has a single sample: give the interval (--interval) explicitly")
    return float(max(1, round(float(np.median(spacings)))))


def _derive_flags(dense: np.ndarray, seen: set[str]) -> set[str]:
    """Throttle flags from the bitmask where the export lacks them (plain dcgm-exporter)."""
    mask = dense[:, _GPU_INDEX["clock_event_reasons"]]
    finite = np.isfinite(mask)
    derived: set[str] = set()
    if not finite.any():
        return derived
    bits = np.where(finite, mask, 0).astype(np.int64)
    for name, bit in _FLAG_BITS.items():
        if name in seen:
            continue
        dense[:, _GPU_INDEX[name]] = np.where(finite, ((bits & bit) != 0).astype(np.float64), np.nan)
        derived.add(name)
    return derived


def _derive_xids(dense: np.ndarray, seen: set[str]) -> bool:
    """Xid counters by code from the changes of the last-Xid gauge, where the export lacks them."""
    if seen.intersection(_XID_ALL):
        return False
    last = dense[:, _GPU_INDEX["xid_last"]]
    finite = np.nonzero(np.isfinite(last))[0]
    if finite.size == 0:
        return False
    codes = last[finite]
    # What was there before the export began is history, not an event.
    events = (codes != np.r_[codes[0], codes[:-1]]) & (codes != 0)
    distinct, inverse = np.unique(codes, return_inverse=True)
    column_of = np.array([_XID_ALL.index(_XID_COLUMNS.get(int(c), "xid_other_events")) for c in distinct])[
        inverse
    ]
    for i, name in enumerate(_XID_ALL):
        dense[finite, _GPU_INDEX[name]] = np.cumsum(events & (column_of == i))
    return True


def _node_network(
    columns: dict[str, dict[str, _Samples]], start: float, interval: float, steps: int
) -> np.ndarray:
    """(steps, NETWORK_COLUMNS) for one node: its ports, interfaces and peers rolled up as the twin
    and the service do (faultcast.rollup); interfaces in the order of their names, the first standing
    for the node's Ethernet."""
    arrays: dict[Scope, np.ndarray] = {}
    for scope in _NETWORK_SCOPES:
        metrics = metrics_for(scope)
        devices = sorted({d for m in metrics for d in columns.get(m.name, {})})  # host: one, unlabelled
        dense = np.full((steps, max(1, len(devices)), len(metrics)), np.nan)
        for k, metric in enumerate(metrics):
            for device, samples in columns.get(metric.name, {}).items():
                dense[:, devices.index(device), k] = samples.on_grid(start, interval, steps)
        arrays[scope] = dense
    with np.errstate(invalid="ignore"):
        rolled = rollup_network(
            arrays[Scope.IB_PORT], arrays[Scope.INTERFACE], arrays[Scope.PEER], arrays[Scope.HOST][:, 0]
        )
    return np.stack([rolled[name].astype(np.float64) for name in NETWORK_COLUMNS], axis=1)


def _dictionary(indices: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(names, pa.string()))


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
    path: Path,
    nodes: Sequence[str],
    gpus_per_node: int,
    uuid_at: dict[tuple[str, int], tuple[np.ndarray, list[str]]],
    grid: tuple[float, float],
) -> list[dict[str, str]]:
    """Validated, normalised failure rows (FAILURE_FIELDS), sorted by time."""
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
            uuid = row.get("uuid", "")
            if not uuid and gpu >= 0 and (node, gpu) in uuid_at:
                uuid = _uuid_before(*uuid_at[(node, gpu)], when, grid)
            normalised = {
                "timestamp": _iso(when),
                "node": node,
                "gpu": "" if gpu < 0 else str(gpu),
                "uuid": uuid,
                "mode": row["mode"],
                "xid": "" if xid == "0" else xid,
                "precursor_s": _precursor_text(where, row.get("precursor_s", "")),
                "description": row.get("description", ""),
            }
            rows.append((when, node, gpu, normalised))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [r[3] for r in rows]


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


def _uuid_before(codes: np.ndarray, uuids: list[str], when: float, grid: tuple[float, float]) -> str:
    """The UUID the GPU reported last at or before `when` (the first one when it is earlier)."""
    start, interval = grid
    known = np.nonzero(codes >= 0)[0]
    if known.size == 0:
        return ""
    step = int((when - start) // interval)
    before = known[known <= step]
    return uuids[int(codes[before[-1] if before.size else known[0]])]


def import_prometheus(
    export: Path,
    failures_csv: Path | None,
    out: Path,
    *,
    cadence_s: float | None = None,
    gpus_per_node: int | None = None,
    node_labels: Sequence[str] = DEFAULT_NODE_LABELS,
) -> dict[str, Any]:
    """Write `out` (telemetry.parquet, network.parquet, failures.csv, manifest.json) from a Prometheus
    range-query export and a failure log; return the manifest. Raises DataError on malformed input.

    Without a failure log (`failures_csv=None`) the failure file is empty and the manifest says so:
    such data can be scored but not trained or evaluated on."""
    parsed = _parse(export, node_labels)
    grid = _grid(export, parsed, cadence_s, gpus_per_node)
    gpus = _gpu_grid(parsed, grid)
    net_dense = np.full((len(grid.nodes), grid.steps, len(NETWORK_COLUMNS)), np.nan)
    for node, columns in parsed.network.items():
        net_dense[grid.node_index[node]] = _node_network(columns, grid.start, grid.interval, grid.steps)
    net_present = np.isfinite(net_dense).any(axis=2)
    uuids = [u for u, _ in gpus.identities]
    uuid_at = {key: (gpus.identity[k], uuids) for k, key in enumerate(gpus.keys)}
    failures = (
        _failures(failures_csv, grid.nodes, grid.gpus_per_node, uuid_at, (grid.start, grid.interval))
        if failures_csv
        else []
    )

    out.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be good
    telemetry_rows = _write_telemetry(
        out,
        gpus.keys,
        grid.nodes,
        grid.node_index,
        gpus.identities,
        gpus.dense,
        gpus.identity,
        gpus.present,
        grid.start,
        grid.interval,
    )
    network_rows = _write_network(out, grid.nodes, net_dense, net_present, grid.start, grid.interval)
    with (out / "failures.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FAILURE_FIELDS)
        writer.writeheader()
        writer.writerows(failures)
    rows = {"telemetry": telemetry_rows, "network": network_rows, "failures": len(failures)}
    manifest = _data_manifest(export, failures_csv, parsed, grid, gpus, failures, rows)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log.info(
        "imported %d samples of %d GPUs on %d nodes at %.0f s: %d telemetry rows, %d failures; %d unknown series",
        parsed.samples,
        len(gpus.keys),
        len(grid.nodes),
        grid.interval,
        telemetry_rows,
        len(failures),
        sum(parsed.unknown.values()),
    )
    return manifest


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
    if not parsed.gpus:
        shown = ", ".join(name for name, _ in parsed.unknown.most_common(5)) or "none"
        raise DataError(
            f"{export}: no series of a GPU metric the catalogue knows (DCGM_FI_DEV_GPU_TEMP, ...) with a node "
            f"and a gpu label; most common unknown names: {shown}"
        )
    interval = _interval(parsed, cadence_s)
    start = math.floor(parsed.t_min / interval) * interval
    steps = int((parsed.t_max - start) // interval) + 1
    largest = max(gpu for _, gpu in parsed.gpus) + 1
    if gpus_per_node is None:
        gpus_per_node = largest
    elif gpus_per_node < largest:
        raise DataError(
            f"the export has GPU index {largest - 1}, more than --gpus-per-node {gpus_per_node} allows"
        )
    nodes = sorted({node for node, _ in parsed.gpus} | set(parsed.network))
    return _Grid(start, interval, steps, gpus_per_node, nodes, {name: i for i, name in enumerate(nodes)})


@dataclass(frozen=True)
class _GpuGrid:
    """Every GPU's series on the grid, with the identity (UUID, model) each step reports."""

    keys: list[tuple[str, int]]  # (node, gpu) in file order
    dense: np.ndarray  # (GPUs, steps, GPU_COLUMNS)
    identity: np.ndarray  # (GPUs, steps): index into `identities`, -1 where none is known
    identities: list[tuple[str, str]]  # (uuid, model), sorted
    present: np.ndarray  # (GPUs, steps) bool: a row exists
    derived: Counter[str]  # derived column -> how many GPUs got it


def _gpu_grid(parsed: _Parsed, grid: _Grid) -> _GpuGrid:
    start, interval, steps = grid.start, grid.interval, grid.steps
    keys = sorted(parsed.gpus, key=lambda k: (grid.node_index[k[0]], k[1]))
    identities = list(parsed.identities)
    dense = np.full((len(keys), steps, len(GPU_COLUMNS)), np.nan)
    identity = np.full((len(keys), steps), -1, dtype=np.int64)
    derived: Counter[str] = Counter()
    for k, key in enumerate(keys):
        entry = parsed.gpus[key]
        for name, samples in entry.columns.items():
            dense[k, :, _GPU_INDEX[name]] = samples.on_grid(start, interval, steps)
        codes = entry.identity.on_grid(start, interval, steps)
        identity[k] = np.where(np.isnan(codes), -1, codes).astype(np.int64)
        for name in _derive_flags(dense[k], set(entry.columns)):
            derived[name] += 1
        if _derive_xids(dense[k], set(entry.columns)):
            for name in _XID_ALL:
                derived[name] += 1
    # Identities in sorted order, so the files do not depend on the order of the series in the export.
    rank = np.empty(len(identities), dtype=np.int64)
    rank[sorted(range(len(identities)), key=identities.__getitem__)] = np.arange(len(identities))
    identity = np.where(identity >= 0, rank[np.maximum(identity, 0)], -1)
    present = np.isfinite(dense).any(axis=2) & (identity >= 0)
    return _GpuGrid(keys, dense, identity, sorted(identities), present, derived)


def _data_manifest(
    export: Path,
    failures_csv: Path | None,
    parsed: _Parsed,
    grid: _Grid,
    gpus: _GpuGrid,
    failures: list[dict[str, str]],
    rows: dict[str, int],
) -> dict[str, Any]:
    """The data directory's manifest.json: what was imported, mapped, derived and left out."""
    start, interval = grid.start, grid.interval
    end = start + grid.steps * interval
    outside = sum(1 for f in failures if not start < _parse_time(f["timestamp"]) <= end)
    mapped = {
        name: dict(parsed.mapped[name]) for name in [*GPU_COLUMNS, *NETWORK_COLUMNS] if name in parsed.mapped
    }
    have = set(parsed.mapped) | set(gpus.derived)
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
        "gpu_days": float(gpus.present.sum()) * interval / 86_400.0,
        "failure_log": failures_csv is not None,
        "rows": rows,
        "samples": parsed.samples,
        "samples_not_finite": parsed.not_finite,
        "failures_outside_data": outside,
        "failure_counts": dict(sorted(Counter(f["mode"] for f in failures).items())),
        "gpus": len(gpus.keys),
        "mapped": mapped,
        "derived": {
            name: {"gpus": count, "from": _derived_from(name)} for name, count in sorted(gpus.derived.items())
        },
        "missing": {
            "telemetry": [c for c in GPU_COLUMNS if c not in have],
            "network": [c for c in NETWORK_COLUMNS if c not in have],
        },
        "units_converted": dict(sorted(parsed.converted.items())),
        "unknown_metrics": dict(parsed.unknown.most_common()),
        "ignored_metrics": dict(parsed.ignored.most_common()),
        "skipped_series": dict(parsed.skipped.most_common()),
        "catalogue": {"version": CATALOGUE_VERSION, "schema_hash": f"{SCHEMA_HASH:#018x}"},
        "telemetry_columns": TELEMETRY_SCHEMA.names,
        "network_columns": NETWORK_SCHEMA.names,
    }


def _derived_from(name: str) -> str:
    if name in _FLAG_BITS:
        return f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS & {_FLAG_BITS[name]:#04x}"
    return "changes of DCGM_FI_DEV_XID_ERRORS (a lower bound: a repeated Xid is invisible there)"


def _write_grid(
    path: Path,
    schema: pa.Schema,
    value_columns: Sequence[str],
    dense: np.ndarray,
    present: np.ndarray,
    start: float,
    interval: float,
    identity: Callable[[np.ndarray, np.ndarray], list[pa.Array]],
) -> int:
    """Time-major rows from a (units, steps, columns) grid, one row group per chunk of steps.

    `identity(steps, units)` gives the columns between the timestamp and the values. A chunk with
    no row writes no row group: a file with no rows at all is still valid (and empty)."""
    steps = dense.shape[1]
    rows = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for a in range(0, steps, _CHUNK_STEPS):
            here = present[:, a : min(steps, a + _CHUNK_STEPS)].T  # (steps, units)
            if not here.any():
                continue
            step_of, unit_of = np.nonzero(here)
            step_of = step_of + a
            stamps = np.round((start + step_of * interval) * 1e9).astype(np.int64)
            columns = [pa.array(stamps, schema.field("timestamp").type), *identity(step_of, unit_of)]
            for c, name in enumerate(value_columns):
                kind = schema.field(name).type
                columns.append(pa.array(dense[unit_of, step_of, c].astype(kind.to_pandas_dtype()), kind))
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
            rows += len(step_of)
    return rows


def _write_telemetry(
    out: Path,
    keys: list[tuple[str, int]],
    nodes: list[str],
    node_index: dict[str, int],
    identities: list[tuple[str, str]],
    dense: np.ndarray,
    identity: np.ndarray,
    present: np.ndarray,
    start: float,
    interval: float,
) -> int:
    """Time-major rows: each step, every GPU that reported."""
    uuids = [u for u, _ in identities]
    models = sorted({m for _, m in identities})
    model_of = np.array([models.index(m) for _, m in identities])
    key_node = np.array([node_index[n] for n, _ in keys])
    key_gpu = np.array([g for _, g in keys], dtype=np.int16)

    def columns(step_of: np.ndarray, gpu_of: np.ndarray) -> list[pa.Array]:
        codes = identity[gpu_of, step_of]
        return [
            _dictionary(key_node[gpu_of], nodes),
            pa.array(key_gpu[gpu_of]),
            _dictionary(codes, uuids),
            _dictionary(model_of[codes], models),
        ]

    return _write_grid(
        out / "telemetry.parquet", TELEMETRY_SCHEMA, GPU_COLUMNS, dense, present, start, interval, columns
    )


def _write_network(
    out: Path, nodes: list[str], dense: np.ndarray, present: np.ndarray, start: float, interval: float
) -> int:
    return _write_grid(
        out / "network.parquet",
        NETWORK_SCHEMA,
        NETWORK_COLUMNS,
        dense,
        present,
        start,
        interval,
        lambda _, node_of: [_dictionary(node_of, nodes)],
    )
