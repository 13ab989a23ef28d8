"""One grid step of one node as the data files store it: a telemetry row per GPU (its last reading, and
the step's summary combined over the step's samples, as the online features combine them) and one
network row (the node's devices rolled up as the online features roll them up). What the archive writes
is therefore what the model scored, in the files the twin and the importer write (faultcast.schemas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from faultcast.catalogue import Scope, metrics_for
from faultcast.readings import GpuReading, NodeSnapshot
from faultcast.rollup import NETWORK_COLUMNS, rollup_network
from faultcast.schemas import GPU_COLUMNS, NETWORK_SCHEMA, SUMMARISED_TELEMETRY_SCHEMA
from faultcast.step_summary import StepSummary, combine, summarised_row

_SCOPES = (Scope.IB_PORT, Scope.INTERFACE, Scope.PEER)
_SUMMARY_WIDTH = len(summarised_row(None))


@dataclass
class PendingStep:
    """A node's step being filled: its newest sample, and each GPU's summaries so far."""

    step: int
    snapshot: NodeSnapshot
    summaries: dict[int, list[StepSummary]] = field(default_factory=dict)

    def take(self, snapshot: NodeSnapshot) -> None:
        """Another sample of the same step: its values win, its summaries join the step's."""
        self.snapshot = snapshot
        for gpu in snapshot.gpus:
            if not gpu.lost:
                self.summaries.setdefault(gpu.index, []).append(_summary(gpu))


def pending(step: int, snapshot: NodeSnapshot) -> PendingStep:
    """The step a first sample opens."""
    opened = PendingStep(step, snapshot)
    opened.take(snapshot)
    return opened


def _summary(gpu: GpuReading) -> StepSummary:
    return gpu.summary if gpu.summary is not None else StepSummary.of(gpu.values)


class RowBuffer:
    """Rows of finished steps, column by column, until they are written as one part."""

    def __init__(self) -> None:
        self.gpu_time: list[int] = []
        self.gpu_node: list[str] = []
        self.gpu_index: list[int] = []
        self.gpu_uuid: list[str] = []
        self.gpu_model: list[str] = []
        self.gpu_values: list[tuple[float, ...]] = []
        self.gpu_summary: list[np.ndarray] = []
        self.net_time: list[int] = []
        self.net_node: list[str] = []
        self.net_values: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.gpu_time) + len(self.net_time)

    def add(self, step: PendingStep) -> None:
        """The finished step's rows (a lost GPU has none: it is absent, as in the files)."""
        snapshot = step.snapshot
        for gpu in snapshot.gpus:
            if gpu.lost:
                continue
            self.gpu_time.append(snapshot.time_unix_nano)
            self.gpu_node.append(snapshot.node)
            self.gpu_index.append(gpu.index)
            self.gpu_uuid.append(gpu.uuid)
            self.gpu_model.append(gpu.model_name)
            self.gpu_values.append(gpu.values)
            parts = step.summaries.get(gpu.index)
            self.gpu_summary.append(summarised_row(combine(parts) if parts else None))
        self.net_time.append(snapshot.time_unix_nano)
        self.net_node.append(snapshot.node)
        self.net_values.append(network_values(snapshot))

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """(telemetry, network) as the schemas say, each sorted by time then node (then GPU)."""
        return sort_rows(_telemetry(self), ("node", "gpu")), sort_rows(_network(self), ("node",))


def network_values(snapshot: NodeSnapshot) -> np.ndarray:
    """The node's devices and host rolled up: NETWORK_COLUMNS' values."""
    by_scope = {s: [d.values for d in snapshot.devices if d.scope is s] for s in _SCOPES}
    arrays = [
        np.array(by_scope[s]) if by_scope[s] else np.full((1, len(metrics_for(s))), np.nan) for s in _SCOPES
    ]
    host = np.asarray(snapshot.host) if snapshot.host else np.full(len(metrics_for(Scope.HOST)), np.nan)
    rolled = rollup_network(arrays[0], arrays[1], arrays[2], host)
    return np.array([float(rolled[name]) for name in NETWORK_COLUMNS])


def _telemetry(rows: RowBuffer) -> pa.Table:
    schema = SUMMARISED_TELEMETRY_SCHEMA
    n = len(rows.gpu_time)
    values = np.array(rows.gpu_values, dtype=np.float64).reshape(n, len(GPU_COLUMNS))
    summary = np.array(rows.gpu_summary, dtype=np.float64).reshape(n, _SUMMARY_WIDTH)
    columns: list[pa.Array] = [
        pa.array(rows.gpu_time, type=pa.int64()).cast(schema.field("timestamp").type),
        pa.array(rows.gpu_node).dictionary_encode(),
        pa.array(rows.gpu_index, type=pa.int16()),
        pa.array(rows.gpu_uuid).dictionary_encode(),
        pa.array(rows.gpu_model).dictionary_encode(),
    ]
    for k, name in enumerate(GPU_COLUMNS):
        columns.append(pa.array(values[:, k], type=schema.field(name).type, from_pandas=False))
    first_summary = 5 + len(GPU_COLUMNS)
    columns.append(pa.array(summary[:, 0].astype(np.int16), type=pa.int16()))
    for k in range(1, _SUMMARY_WIDTH):
        columns.append(pa.array(summary[:, k], type=schema.field(first_summary + k).type))
    return pa.Table.from_arrays(_dictionaries(columns, schema), schema=schema)


def _network(rows: RowBuffer) -> pa.Table:
    schema = NETWORK_SCHEMA
    n = len(rows.net_time)
    values = np.array(rows.net_values, dtype=np.float64).reshape(n, len(NETWORK_COLUMNS))
    columns: list[pa.Array] = [
        pa.array(rows.net_time, type=pa.int64()).cast(schema.field("timestamp").type),
        pa.array(rows.net_node).dictionary_encode(),
    ]
    for k, name in enumerate(NETWORK_COLUMNS):
        columns.append(pa.array(values[:, k], type=schema.field(name).type))
    return pa.Table.from_arrays(_dictionaries(columns, schema), schema=schema)


def _dictionaries(columns: list[pa.Array], schema: pa.Schema) -> list[pa.Array]:
    """The dictionary columns with the schema's index type (int32)."""
    return [
        c.cast(schema.field(i).type) if pa.types.is_dictionary(c.type) else c for i, c in enumerate(columns)
    ]


def sort_rows(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The rows sorted by time, then `keys` (Arrow cannot sort dictionary columns itself)."""
    ns = table.column("timestamp").cast(pa.int64()).to_numpy()
    order = np.lexsort((*(key_codes(table, k) for k in reversed(keys)), ns))
    return table.take(pa.array(order))


def key_codes(table: pa.Table, key: str) -> np.ndarray:
    """Integer codes ordered as the column's values (strings by their text), for sorting and grouping."""
    column = table.column(key)
    if key == "gpu":
        return np.asarray(column.to_numpy(), dtype=np.int64)
    values = column.cast(pa.string()).to_numpy(zero_copy_only=False)
    codes: np.ndarray = np.unique(values, return_inverse=True)[1].astype(np.int64)
    return codes
