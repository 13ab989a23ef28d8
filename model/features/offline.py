"""Offline driving of the feature engine over telemetry files, and labels from failure logs.

`replay` reads `telemetry.parquet` and `network.parquet` (the twin's files, or an import of real
history) row group by row group, lays each group on the model's time grid (the last sample of a
GPU within a grid step wins, as online), and calls `FeatureEngine.update` once per step for the
selected nodes. A sink sees every step's features and keeps what it needs: sampled training rows,
or scores for evaluation. Memory stays bounded by one row group whatever the horizon.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.history import FailureHistory
from faultcast.model.features.parquet_parts import DataError as DataError
from faultcast.model.features.parquet_parts import ParquetParts, table_exists
from faultcast.modes import FailureMode
from faultcast.schemas import current_data_manifest
from faultcast.step_summary import SCRAPES_COLUMN, STATS, SUMMARISED, SUMMARY_COLUMNS

SUMMARY_FIELD_NAMES = [SCRAPES_COLUMN, *SUMMARY_COLUMNS]


class Failure(NamedTuple):
    """One failure of the log."""

    time_s: float  # unix seconds
    node: int  # index into Dataset.nodes
    gpu: int  # -1 for a node-level failure
    mode: str
    # Seconds its precursor ran before it: 0 when it had none (no model could see it coming), NaN
    # when the log does not say (a real fleet's log, or one written before the column existed).
    precursor_s: float = math.nan


def _mode_can_warn(mode: str) -> bool:
    """Whether failures of `mode` can carry a precursor; a mode faultcast does not know is kept."""
    try:
        return FailureMode(mode).has_precursor
    except ValueError:
        return True


@dataclass(frozen=True)
class FailureLog:
    """The failure log as plain columns, in time order."""

    time_s: np.ndarray
    node: np.ndarray
    gpu: np.ndarray
    mode: np.ndarray  # object array of str
    precursor_s: np.ndarray  # float, NaN where the log does not say

    @staticmethod
    def of(rows: Sequence[Failure]) -> FailureLog:
        """The log of `rows`, sorted by time."""
        ordered = sorted(rows)
        return FailureLog(
            np.array([r.time_s for r in ordered], dtype=np.float64),
            np.array([r.node for r in ordered], dtype=np.int64),
            np.array([r.gpu for r in ordered], dtype=np.int64),
            np.array([r.mode for r in ordered], dtype=object),
            np.array([r.precursor_s for r in ordered], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.time_s)

    def rows(self, mask: np.ndarray | None = None) -> list[Failure]:
        """The failures (those where `mask` is true, when given), in time order."""
        keep = np.ones(len(self), dtype=bool) if mask is None else mask
        columns = (self.time_s, self.node, self.gpu, self.mode, self.precursor_s)
        return [
            Failure(float(t), int(n), int(g), str(m), float(p))
            for t, n, g, m, p in zip(*(c[keep] for c in columns), strict=True)
        ]

    def learnable(self) -> FailureLog:
        """The failures a model can learn a warning from: those that carried a precursor where the
        log says (precursor_s > 0), else those whose mode can have one (not software, firmware or
        silent data corruption). The rest look healthy until they strike: labelling the hours
        before them positive only teaches the model noise."""
        known = ~np.isnan(self.precursor_s)
        can = np.array([_mode_can_warn(str(m)) for m in self.mode], dtype=bool)
        keep = np.where(known, self.precursor_s > 0, can)
        return FailureLog(*(c[keep] for c in (self.time_s, self.node, self.gpu, self.mode, self.precursor_s)))

    def between(self, after_s: float, until_s: float, nodes: Sequence[int] | None = None) -> list[Failure]:
        """Failures with after_s < time <= until_s (on `nodes`, when given)."""
        mask = (self.time_s > after_s) & (self.time_s <= until_s)
        if nodes is not None:
            mask &= np.isin(self.node, np.asarray(nodes, dtype=np.int64))
        return self.rows(mask)


@dataclass(frozen=True)
class Censored:
    """Spans of a GPU (gpu -1: every GPU of its node) whose label nobody knows: a node drained on a
    prediction that no failure and no verdict settled (censored.csv, written from the service's label
    log). Their rows neither train nor count as healthy: the fault may have been prevented."""

    node: np.ndarray  # (spans,) node index
    gpu: np.ndarray  # (spans,) GPU index, -1 for the whole node
    start_s: np.ndarray
    end_s: np.ndarray

    @staticmethod
    def none() -> Censored:
        """No span: every row's label is known."""
        empty = np.zeros(0)
        return Censored(empty.astype(np.int64), empty.astype(np.int64), empty, empty)

    def at(self, time_s: float, nodes: Sequence[int], gpus_per_node: int) -> np.ndarray:
        """(slots,) bool: which GPUs of `nodes` are censored at `time_s`."""
        out = np.zeros(len(nodes) * gpus_per_node, dtype=bool)
        live = np.flatnonzero((self.start_s <= time_s) & (time_s <= self.end_s))
        if not len(live):
            return out
        local = {n: i for i, n in enumerate(nodes)}
        for k in live:
            i = local.get(int(self.node[k]))
            if i is None:
                continue
            g = int(self.gpu[k])
            if g < 0:
                out[i * gpus_per_node : (i + 1) * gpus_per_node] = True
            elif g < gpus_per_node:
                out[i * gpus_per_node + g] = True
        return out


def read_censored(path: Path, nodes: Sequence[str]) -> Censored:
    """censored.csv (start, end, node, gpu, ...) when the data directory has one; spans of nodes the data
    lacks are left out (they censor nothing here). DataError naming the line of a bad row."""
    if not path.is_file():
        return Censored.none()
    index = {name: i for i, name in enumerate(nodes)}
    rows: list[tuple[int, int, float, float]] = []
    with path.open(newline="") as handle:
        for line, record in enumerate(csv.DictReader(handle), start=2):
            try:
                if record["node"] not in index:
                    continue
                start = dt.datetime.fromisoformat(record["start"].replace("Z", "+00:00")).timestamp()
                end = dt.datetime.fromisoformat(record["end"].replace("Z", "+00:00")).timestamp()
                gpu = int(record["gpu"]) if record.get("gpu") else -1
            except (KeyError, ValueError) as exc:
                raise DataError(f"{path}:{line}: {exc}") from exc
            rows.append((index[record["node"]], gpu, start, end))
    if not rows:
        return Censored.none()
    return Censored(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.float64),
        np.array([r[3] for r in rows], dtype=np.float64),
    )


@dataclass(frozen=True)
class Dataset:
    """A directory of telemetry, network data and a failure log, described by its manifest."""

    path: Path
    start_s: float  # unix seconds of the first grid step
    end_s: float  # unix seconds just past the last sample
    cadence_s: float  # seconds between two samples
    nodes: tuple[str, ...]
    gpus_per_node: int
    failures: FailureLog
    manifest: dict[str, object]
    censored: Censored = field(default_factory=Censored.none)

    @property
    def days(self) -> float:
        """The span of the data in days."""
        return (self.end_s - self.start_s) / 86_400.0

    def node_index(self, name: str) -> int:
        """The index of node `name`; ValueError when the data has no such node."""
        return self.nodes.index(name)


def read_failures(path: Path, nodes: Sequence[str]) -> FailureLog:
    """The failure log at `path` for a dataset of `nodes`; DataError naming the line on a bad row."""
    index = {name: i for i, name in enumerate(nodes)}
    rows = []
    with path.open(newline="") as handle:
        for line, record in enumerate(csv.DictReader(handle), start=2):
            try:
                node = index[record["node"]]
                moment = dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                gpu = int(record["gpu"]) if record.get("gpu") else -1
                precursor = _precursor_s(record.get("precursor_s"))
                rows.append(Failure(moment.timestamp(), node, gpu, record["mode"], precursor))
            except KeyError as exc:
                raise DataError(f"{path}:{line}: unknown node or missing column {exc}") from exc
            except ValueError as exc:
                raise DataError(f"{path}:{line}: {exc}") from exc
    return FailureLog.of(rows)


def _precursor_s(text: str | None) -> float:
    """A failure's `precursor_s`: NaN when the column is absent or empty (the log does not say)."""
    if not text:
        return math.nan
    seconds = float(text)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"precursor_s {text!r} is not a non-negative number of seconds")
    return seconds


def unix_seconds(times: pd.Series) -> np.ndarray:
    """Seconds since the epoch, whatever the resolution pandas chose for the timestamps."""
    return np.asarray((times - pd.Timestamp(0, tz="UTC")).dt.total_seconds(), dtype=np.float64)


def open_dataset(path: Path) -> Dataset:
    """Open a data directory (`faultcast simulate` or an import) and read its failure log; raises
    DataError when a file is missing or the manifest cannot place the data on a grid."""
    found = {
        "telemetry.parquet": table_exists(path / "telemetry.parquet"),  # a file, or a directory of them
        "failures.csv": (path / "failures.csv").is_file(),
        "manifest.json": (path / "manifest.json").is_file(),
    }
    for name, there in found.items():
        if not there:
            raise DataError(
                f"{path}: {name} is missing (expected the output of `faultcast simulate` or an import)"
            )
    manifest = current_data_manifest(json.loads((path / "manifest.json").read_text()))
    config = manifest.get("config", {})
    try:
        gpus = int(config["gpus_per_node"])
        interval = float(config["cadence_s"])
        nodes = (
            tuple(str(n) for n in manifest["nodes"])
            if "nodes" in manifest
            else tuple(f"node-{i:04d}" for i in range(int(config["nodes"])))
        )
        start = float(config["start_unix_s"])
        end = start + float(config["days"]) * 86_400.0
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}/manifest.json lacks {exc}: cannot place the data on a grid") from exc
    failures = read_failures(path / "failures.csv", nodes)
    censored = read_censored(path / "censored.csv", nodes)
    return Dataset(path, start, end, interval, nodes, gpus, failures, manifest, censored)


@dataclass(frozen=True)
class Step:
    """What a sink sees at one grid step, for the selected nodes (slot = local node * G + gpu)."""

    index: int  # grid step since the dataset's start
    time_s: float  # unix seconds
    present: np.ndarray  # (slots,) bool: the GPU reported in this step
    features: np.ndarray  # (slots, features)


Sink = Callable[[Step], None]


def _pivot(
    table: pd.DataFrame,
    columns: Sequence[str],
    dataset: Dataset,
    cadence: float,
    node_map: np.ndarray,
    per_node: int,
    first_step: int,
    steps: int,
) -> tuple[np.ndarray, pd.DataFrame]:
    """Dense (steps, units, columns) array; the last row of a unit within a step wins."""
    units = int(node_map.max(initial=-1) + 1) * per_node
    dense = np.full((steps, units, len(columns)), np.nan)
    node = node_map[table["node_index"].to_numpy()]
    keep = node >= 0
    step = ((table["time_s"].to_numpy() - dataset.start_s) // cadence).astype(np.int64) - first_step
    keep &= (step >= 0) & (step < steps)
    unit = node * per_node + (table["gpu"].to_numpy() if per_node > 1 else 0)
    rows = table[keep]
    dense[step[keep], unit[keep]] = rows[list(columns)].to_numpy(np.float64)
    return dense, rows.assign(_step=step[keep], _unit=unit[keep])


def replay(
    dataset: Dataset,
    config: FeatureConfig,
    sink: Sink,
    *,
    nodes: Sequence[int] | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    masked_inputs: Sequence[str] = (),
) -> FeatureEngine:
    """Drive a fresh engine over [start_s, end_s) for `nodes` (default: all), calling `sink` each step.

    `masked_inputs` blanks those input columns before the engine sees them: how a cluster that does
    not collect them looks (for example dcgm-exporter's default set). With `config.node_history`, each
    step's history features come from the dataset's failure log, the failures before the step only."""
    selected = list(range(len(dataset.nodes))) if nodes is None else list(nodes)
    node_map = np.full(len(dataset.nodes), -1, dtype=np.int64)
    node_map[selected] = np.arange(len(selected))
    g = dataset.gpus_per_node  # the data's node size, whatever the model was trained on
    engine = FeatureEngine(config, len(selected), g)
    cadence = config.cadence_s
    lo, hi = _step_range(dataset, cadence, start_s, end_s)
    gpu_mask = np.array([c in masked_inputs for c in GPU_INPUTS])
    node_mask = np.array([c in masked_inputs for c in NODE_INPUTS])
    last_uuid: list[str | None] = [None] * engine.slots
    is_h100 = np.zeros(engine.slots)
    history = history_of(dataset) if config.node_history else None

    telemetry = ParquetParts(dataset.path / "telemetry.parquet")
    has_network = table_exists(dataset.path / "network.parquet")
    network = ParquetParts(dataset.path / "network.parquet") if has_network else None
    summarised = set(SUMMARY_FIELD_NAMES) <= set(telemetry.schema_arrow.names)  # the twin's files
    gpu_columns = ["timestamp", "node", "gpu", "uuid", "model", *GPU_INPUTS]
    gpu_columns += SUMMARY_FIELD_NAMES if summarised else []
    net_groups = _group_times(network) if network is not None else []
    for group in range(telemetry.num_row_groups):
        times = telemetry.read_row_group(group, columns=["timestamp"]).column(0)
        t0 = times[0].value / 1e9 if len(times) else 0.0
        t1 = times[len(times) - 1].value / 1e9 if len(times) else 0.0
        first = int((t0 - dataset.start_s) // cadence)
        last = int((t1 - dataset.start_s) // cadence)
        if last < lo or first >= hi:
            continue
        frame = _frame(telemetry.read_row_group(group, columns=gpu_columns).to_pandas(), dataset)
        first, last = max(first, lo), min(last, hi - 1)
        steps = last - first + 1
        gpu, rows = _pivot(frame, GPU_INPUTS, dataset, cadence, node_map, g, first, steps)
        summary = _widen(_summaries(rows, summarised, steps, gpu.shape[1]), engine.slots, blank=_NO_SUMMARY)
        summary[..., _masked_summary(masked_inputs)] = np.nan
        gpu = _widen(gpu, engine.slots)
        gpu[..., gpu_mask] = np.nan
        node = np.full((steps, len(selected), len(NODE_INPUTS)), np.nan)
        if network is not None:
            node = _node_inputs(node, network, net_groups, dataset, cadence, node_map, (t0, t1), first)
        node[..., node_mask] = np.nan
        # Identity per slot and step: a new UUID in a slot means a replaced GPU.
        changes = _uuid_changes(rows, last_uuid, is_h100)
        for k in range(steps):
            if k in changes:
                engine.reset_slots(np.array(changes[k]))
            time_s = dataset.start_s + (first + k) * cadence
            past = history.at(time_s, selected) if history is not None else None
            features = engine.update(first + k, gpu[k], node[k], is_h100, summary[k], past)
            sink(Step(first + k, time_s, engine.present.copy(), features))
    return engine


def history_of(dataset: Dataset) -> FailureHistory:
    """The dataset's whole failure log (every mode: a failure with no precursor still marks a frail
    node) indexed for the node-history features."""
    log = dataset.failures
    return FailureHistory(log.time_s, log.node, log.gpu, dataset.gpus_per_node)


def _step_range(
    dataset: Dataset, cadence: float, start_s: float | None, end_s: float | None
) -> tuple[int, int]:
    """The grid steps [lo, hi) of [start_s, end_s), within the data."""
    total_steps = int(np.ceil((dataset.end_s - dataset.start_s) / cadence))
    lo = 0 if start_s is None else max(0, int((start_s - dataset.start_s) // cadence))
    hi = total_steps if end_s is None else min(total_steps, int(np.ceil((end_s - dataset.start_s) / cadence)))
    return lo, hi


def _node_inputs(
    node: np.ndarray,
    network: ParquetParts,
    groups: list[tuple[float, float]],
    dataset: Dataset,
    cadence: float,
    node_map: np.ndarray,
    span_s: tuple[float, float],
    first: int,
) -> np.ndarray:
    """`node` (steps, nodes, NODE_INPUTS) filled from the network row groups that overlap `span_s`."""
    t0, t1 = span_s
    steps, nodes = node.shape[0], node.shape[1]
    for group, (n0, n1) in enumerate(groups):
        if n1 < t0 - cadence or n0 > t1 + cadence:
            continue
        table = network.read_row_group(group, columns=["timestamp", "node", *NODE_INPUTS]).to_pandas()
        dense, _ = _pivot(
            _frame(table, dataset, gpu=False), NODE_INPUTS, dataset, cadence, node_map, 1, first, steps
        )
        dense = _widen(dense, nodes)
        node = np.where(np.isnan(dense), node, dense)
    return node


def _uuid_changes(
    rows: pd.DataFrame, last_uuid: list[str | None], is_h100: np.ndarray
) -> dict[int, list[int]]:
    """Steps (relative to the group) at which a slot's UUID changes; updates last_uuid and is_h100."""
    units = rows["_unit"].to_numpy(np.int64)
    steps = rows["_step"].to_numpy(np.int64)
    uuid_names, uuid_codes = _str_codes(rows["uuid"])
    model_names, model_codes = _str_codes(rows["model"])
    order = np.lexsort((steps, units))
    u, st, c, m = units[order], steps[order], uuid_codes[order], model_codes[order]
    first = np.ones(len(u), dtype=bool)
    first[1:] = (u[1:] != u[:-1]) | (c[1:] != c[:-1])
    last = np.ones(len(u), dtype=bool)
    last[:-1] = u[1:] != u[:-1]
    changes: dict[int, list[int]] = {}
    for i in np.nonzero(first)[0].tolist():
        unit, uuid = int(u[i]), str(uuid_names[c[i]])
        if last_uuid[unit] != uuid:
            if last_uuid[unit] is not None:
                changes.setdefault(int(st[i]), []).append(unit)
            last_uuid[unit] = uuid
    for i in np.nonzero(last)[0].tolist():
        is_h100[int(u[i])] = 1.0 if "H100" in str(model_names[m[i]]) else 0.0
    return changes


def _str_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values as str, each row's index into them): np.unique of the column as str, found by
    hashing (pd.factorize) and converting only the distinct values: sorting a row group's strings
    cost more than the rest of its gridding."""
    codes, distinct = pd.factorize(column, use_na_sentinel=False)
    names, inverse = np.unique(np.array([str(v) for v in distinct], dtype=str), return_inverse=True)
    return names, inverse[codes]


def _widen(dense: np.ndarray, units: int, blank: np.ndarray | float = np.nan) -> np.ndarray:
    if dense.shape[1] == units:
        return dense
    out = np.empty((dense.shape[0], units, dense.shape[2]))
    out[:] = blank
    out[:, : dense.shape[1]] = dense
    return out


_NO_SUMMARY = np.concatenate([[0.0], np.full(len(SUMMARY_COLUMNS), np.nan)])


def _masked_summary(masked_inputs: Sequence[str]) -> np.ndarray:
    """The summary columns (of a feature_steps.WIDTH row) of the masked inputs: a cluster that does not
    collect a gauge has no summary of it either."""
    return np.array([False] + [c.rsplit("_step_", 1)[0] in masked_inputs for c in SUMMARY_COLUMNS])


def _summaries(rows: pd.DataFrame, summarised: bool, steps: int, units: int) -> np.ndarray:
    """(steps, units, feature_steps.WIDTH): each slot's step summary, the rows of a step combined as
    `step_summary.combine` combines samples online (a row without a summary is a summary of its own
    scrape), so a file finer than the grid reads as the service reads the same samples."""
    out = np.empty((steps, units, 1 + len(SUMMARY_COLUMNS)))
    out[:] = _NO_SUMMARY
    if rows.empty:
        return out
    scrapes = np.array(rows[SCRAPES_COLUMN].fillna(0), np.float64) if summarised else np.zeros(len(rows))
    if summarised:
        stats = np.array(rows[list(SUMMARY_COLUMNS)], np.float64)  # a copy: arrow's may be read-only
    else:
        stats = np.full((len(rows), len(SUMMARY_COLUMNS)), np.nan)
    plain = scrapes < 1
    stats[plain] = np.repeat(rows[list(SUMMARISED)].to_numpy(np.float64)[plain], len(STATS), axis=1)
    scrapes[plain] = 1.0
    cell = rows["_step"].to_numpy() * units + rows["_unit"].to_numpy()
    flat = out.reshape(steps * units, -1)
    if len(np.unique(cell)) == len(cell):  # one row a step (the twin's files): no combining
        flat[cell, 0] = scrapes
        flat[cell, 1:] = stats
        return out
    lo, hi, mean = (np.arange(len(SUMMARISED)) * 3 + k for k in range(3))
    weight = scrapes[:, None] * ~np.isnan(stats[:, mean])
    flat[:, 0] = 0.0
    np.add.at(flat[:, 0], cell, scrapes)
    for column in lo:
        np.fmin.at(flat[:, 1 + column], cell, stats[:, column])
    for column in hi:
        np.fmax.at(flat[:, 1 + column], cell, stats[:, column])
    total, weights = np.zeros((steps * units, len(mean))), np.zeros((steps * units, len(mean)))
    np.add.at(total, cell, np.nan_to_num(stats[:, mean]) * weight)
    np.add.at(weights, cell, weight)
    with np.errstate(invalid="ignore", divide="ignore"):
        flat[:, 1 + mean] = np.where(weights > 0, total / np.where(weights > 0, weights, 1.0), np.nan)
    return out


def _group_times(parquet: ParquetParts) -> list[tuple[float, float]]:
    spans = []
    for group in range(parquet.num_row_groups):
        stats = parquet.row_group(group).column(0).statistics
        if stats is not None and stats.has_min_max:
            spans.append((pd.Timestamp(stats.min).timestamp(), pd.Timestamp(stats.max).timestamp()))
        else:
            column = parquet.read_row_group(group, columns=["timestamp"]).column(0)
            spans.append((column[0].value / 1e9, column[len(column) - 1].value / 1e9))
    return spans


def _frame(frame: pd.DataFrame, dataset: Dataset, *, gpu: bool = True) -> pd.DataFrame:
    index = {name: i for i, name in enumerate(dataset.nodes)}
    out = frame.assign(
        time_s=unix_seconds(frame["timestamp"]),
        node_index=frame["node"].astype(str).map(index).to_numpy(),
    )
    if out["node_index"].isna().any():
        raise DataError(f"{dataset.path}: rows for nodes the manifest does not list")
    out["node_index"] = out["node_index"].astype(np.int64)
    if gpu:
        out["gpu"] = out["gpu"].astype(np.int64)
    return out


@dataclass(frozen=True)
class Labels:
    """Per step and slot: will the GPU (or its node) fail within the horizon, when and how."""

    horizon_s: float
    failures: FailureLog

    @functools.cached_property
    def _sorted(self) -> bool:
        """Whether the log is in time order, as FailureLog.of leaves it."""
        return bool(np.all(np.diff(self.failures.time_s) >= 0))

    def at(
        self, time_s: float, nodes: Sequence[int], gpus_per_node: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positive, seconds to failure, mode) for every slot of `nodes` at `time_s`."""
        slots = len(nodes) * gpus_per_node
        positive = np.zeros(slots, dtype=bool)
        ttf = np.full(slots, np.nan)
        mode = np.full(slots, "", dtype=object)
        times = self.failures.time_s
        if self._sorted:  # the failures within the horizon by bisection: most steps have none
            lo, hi = np.searchsorted(times, (time_s, time_s + self.horizon_s), side="right")
            if lo == hi:
                return positive, ttf, mode
        local = {n: i for i, n in enumerate(nodes)}
        for f in self.failures.between(time_s, time_s + self.horizon_s, nodes):
            base = local[f.node] * gpus_per_node
            targets = range(base, base + gpus_per_node) if f.gpu < 0 else [base + f.gpu]
            for slot in targets:
                left = f.time_s - time_s
                if not positive[slot] or left < ttf[slot]:
                    positive[slot], ttf[slot], mode[slot] = True, left, f.mode
        return positive, ttf, mode
