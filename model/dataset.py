"""Offline driving of the feature engine over telemetry files, and labels from failure logs.

`replay` reads `telemetry.parquet` and `network.parquet` (the twin's files, or an import of real
history) row group by row group, lays each group on the model's time grid (the last sample of a
GPU within a grid step wins, as online), and calls `FeatureEngine.update` once per step for the
selected nodes. A sink sees every step's features and keeps what it needs: sampled training rows,
or scores for evaluation. Memory stays bounded by one row group whatever the horizon.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from faultcast.model.features import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine


@dataclass(frozen=True)
class Dataset:
    """A directory of telemetry, network data and a failure log, described by its manifest."""

    path: Path
    start_s: float  # unix seconds of the first grid step
    end_s: float  # unix seconds just past the last sample
    interval_s: float
    nodes: tuple[str, ...]
    gpus_per_node: int
    failures: pd.DataFrame  # time_s (unix), node (index), gpu (-1 = node level), mode, xid
    manifest: dict[str, object]

    @property
    def days(self) -> float:
        return (self.end_s - self.start_s) / 86_400.0

    def node_index(self, name: str) -> int:
        return self.nodes.index(name)


def unix_seconds(times: pd.Series) -> np.ndarray:
    """Seconds since the epoch, whatever the resolution pandas chose for the timestamps."""
    return np.asarray((times - pd.Timestamp(0, tz="UTC")).dt.total_seconds(), dtype=np.float64)


class DataError(ValueError):
    """The data directory is incomplete or inconsistent; the message says what is wrong."""


def open_dataset(path: Path) -> Dataset:
    for name in ("telemetry.parquet", "failures.csv", "manifest.json"):
        if not (path / name).is_file():
            raise DataError(
                f"{path}: {name} is missing (expected the output of `faultcast simulate` or an import)"
            )
    manifest = json.loads((path / "manifest.json").read_text())
    config = manifest.get("config", {})
    try:
        gpus = int(config["gpus_per_node"])
        interval = float(config["interval_s"])
        nodes = (
            tuple(str(n) for n in manifest["nodes"])
            if "nodes" in manifest
            else tuple(f"node-{i:04d}" for i in range(int(config["nodes"])))
        )
        start = float(config["start_unix_s"])
        end = start + float(config["days"]) * 86_400.0
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}/manifest.json lacks {exc}: cannot place the data on a grid") from exc
    raw = pd.read_csv(path / "failures.csv", dtype={"gpu": "Int64", "xid": "Int64", "node": str})
    known = set(nodes)
    unknown = sorted(set(raw["node"]) - known)
    if unknown:
        raise DataError(f"{path}/failures.csv names nodes not in the data: {unknown[:5]}")
    failures = pd.DataFrame({
        "time_s": unix_seconds(pd.to_datetime(raw["timestamp"], utc=True)),
        "node": [nodes.index(n) for n in raw["node"]],
        "gpu": raw["gpu"].fillna(-1).astype(int),
        "mode": raw["mode"].astype(str),
    })  # fmt: skip
    return Dataset(path, start, end, interval, nodes, gpus, failures, manifest)


@dataclass(frozen=True)
class Step:
    """What a sink sees at one grid step, for the selected nodes (slot = local node * G + gpu)."""

    index: int  # grid step since the dataset's start
    time_s: float  # unix seconds
    present: np.ndarray  # (slots,) bool: the GPU reported in this step
    features: np.ndarray  # (slots, features)


Sink = Callable[[Step], None]


def _pivot(
    table: pd.DataFrame, columns: Sequence[str], dataset: Dataset, cadence: float, node_map: np.ndarray,
    per_node: int, first_step: int, steps: int,
) -> tuple[np.ndarray, pd.DataFrame]:  # fmt: skip
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
    not collect them looks (for example dcgm-exporter's default set)."""
    if config.gpus_per_node != dataset.gpus_per_node:
        raise DataError(
            f"model expects {config.gpus_per_node} GPUs per node, the data has {dataset.gpus_per_node}"
        )
    selected = list(range(len(dataset.nodes))) if nodes is None else list(nodes)
    node_map = np.full(len(dataset.nodes), -1, dtype=np.int64)
    node_map[selected] = np.arange(len(selected))
    engine = FeatureEngine(config, len(selected))
    g = config.gpus_per_node
    cadence = config.cadence_s
    total_steps = int(np.ceil((dataset.end_s - dataset.start_s) / cadence))
    lo = 0 if start_s is None else max(0, int((start_s - dataset.start_s) // cadence))
    hi = total_steps if end_s is None else min(total_steps, int(np.ceil((end_s - dataset.start_s) / cadence)))
    gpu_mask = np.array([c in masked_inputs for c in GPU_INPUTS])
    node_mask = np.array([c in masked_inputs for c in NODE_INPUTS])
    last_uuid: list[str | None] = [None] * engine.slots
    is_h100 = np.zeros(engine.slots)

    telemetry = pq.ParquetFile(dataset.path / "telemetry.parquet")
    network = (
        pq.ParquetFile(dataset.path / "network.parquet")
        if (dataset.path / "network.parquet").is_file()
        else None
    )
    gpu_columns = ["timestamp", "node", "gpu", "uuid", "model", *GPU_INPUTS]
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
        gpu = _widen(gpu, engine.slots)
        gpu[..., gpu_mask] = np.nan
        node = np.full((steps, len(selected), len(NODE_INPUTS)), np.nan)
        for net_group, (n0, n1) in enumerate(net_groups):
            if n1 < t0 - cadence or n0 > t1 + cadence:
                continue
            assert network is not None
            net = _frame(network.read_row_group(net_group, columns=["timestamp", "node", *NODE_INPUTS]).to_pandas(),
                         dataset, gpu=False)  # fmt: skip
            dense, _ = _pivot(net, NODE_INPUTS, dataset, cadence, node_map, 1, first, steps)
            dense = _widen(dense, len(selected))
            node = np.where(np.isnan(dense), node, dense)
        node[..., node_mask] = np.nan
        # Identity per slot and step: a new UUID in a slot means a replaced GPU.
        uuid_at = rows.groupby(["_step", "_unit"], sort=True)["uuid"].last()
        model_at = rows.groupby("_unit")["model"].last()
        for unit, model in model_at.items():
            is_h100[int(unit)] = 1.0 if "H100" in str(model) else 0.0
        changes: dict[int, list[int]] = {}
        for (step, unit), uuid in uuid_at.items():
            if last_uuid[int(unit)] != uuid:
                if last_uuid[int(unit)] is not None:
                    changes.setdefault(int(step), []).append(int(unit))
                last_uuid[int(unit)] = str(uuid)
        for k in range(steps):
            if k in changes:
                engine.reset_slots(np.array(changes[k]))
            features = engine.update(first + k, gpu[k], node[k], is_h100)
            present = ~np.isnan(gpu[k, :, 0]) | ~np.isnan(gpu[k, :, 2])
            sink(Step(first + k, dataset.start_s + (first + k) * cadence, present, features))
    return engine


def _widen(dense: np.ndarray, units: int) -> np.ndarray:
    if dense.shape[1] == units:
        return dense
    out = np.full((dense.shape[0], units, dense.shape[2]), np.nan)
    out[:, : dense.shape[1]] = dense
    return out


def _group_times(parquet: pq.ParquetFile) -> list[tuple[float, float]]:
    spans = []
    for group in range(parquet.num_row_groups):
        stats = parquet.metadata.row_group(group).column(0).statistics
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
    failures: pd.DataFrame

    def at(
        self, time_s: float, nodes: Sequence[int], gpus_per_node: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positive, seconds to failure, mode) for every slot of `nodes` at `time_s`."""
        slots = len(nodes) * gpus_per_node
        positive = np.zeros(slots, dtype=bool)
        ttf = np.full(slots, np.nan)
        mode = np.full(slots, "", dtype=object)
        f = self.failures
        soon = f[(f["time_s"] > time_s) & (f["time_s"] <= time_s + self.horizon_s)]
        local = {n: i for i, n in enumerate(nodes)}
        for row in soon.itertuples(index=False):
            if row.node not in local:
                continue
            base = local[row.node] * gpus_per_node
            targets = range(base, base + gpus_per_node) if row.gpu < 0 else [base + row.gpu]
            for slot in targets:
                left = row.time_s - time_s
                if not positive[slot] or left < ttf[slot]:
                    positive[slot], ttf[slot], mode[slot] = True, left, row.mode
        return positive, ttf, mode
