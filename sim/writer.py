"""The offline twin: runs every node over the horizon and writes the four output files.

    telemetry.parquet  one row per GPU per interval (catalogue column names, float32)
    network.parquet    one row per node per interval (ports and peers aggregated per node)
    failures.csv       the failure log: timestamp, node, gpu (empty for node level), uuid, mode, xid,
                       precursor_s (how long its precursor ran; 0: none), description
    manifest.json      configuration, seed, versions, acceleration, the world, counts per mode

Generation goes chunk by chunk (a day at 60 s) across all nodes, so memory stays bounded by one
chunk of the fleet whatever the horizon.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import platform
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast import __version__
from faultcast.catalogue import CATALOGUE_VERSION, SCHEMA_HASH
from faultcast.modes import Level
from faultcast.rollup import NETWORK_COLUMNS, rollup_network
from faultcast.schemas import (
    FAILURE_FIELDS,
    GPU_COLUMNS,
    NETWORK_SCHEMA,
    SUMMARISED_TELEMETRY_SCHEMA,
    SUMMARY_FIELDS,
    TELEMETRY_SCHEMA,
    TIMESTAMP,
)
from faultcast.sim.config import FleetConfig
from faultcast.sim.modes import MODES
from faultcast.sim.node import NodeTwin
from faultcast.sim.schedule import Scenario, ScheduledFailure
from faultcast.step_summary import SUMMARY_COLUMNS


class ManifestRows(TypedDict):
    """Rows written per file."""

    telemetry: int
    network: int
    failures: int


class ManifestMode(TypedDict):
    """One failure mode as the twin drew it (rates per GPU-day: a node-level mode's spread over its GPUs)."""

    name: str
    level: str
    predictable: bool
    precursor_probability: float  # the chance one of its failures carries a precursor, in this world
    base_rate_per_gpu_day: float
    accelerated_rate_per_gpu_day: float
    lead_median_minutes: float
    lead_sigma: float
    downtime_median_hours: float
    gpu_replaced: bool
    xids: list[int]
    description: str


class ManifestCatalogue(TypedDict):
    """The catalogue the files were written with; schema_hash as "0x" and 16 hex digits."""

    version: str
    schema_hash: str


class TwinManifest(TypedDict):
    """manifest.json of a twin run, as simulate returns and writes it. Times are ISO 8601 UTC ("...Z")."""

    kind: str  # "faultcast fleet twin"
    created_at: str
    config: dict[str, Any]  # FleetConfig.to_json()
    seed: int
    acceleration: float
    # Modes whose rates were multiplied further (`faultcast train` weights their rows back down);
    # absent when none were, as before.
    mode_acceleration: NotRequired[dict[str, float]]
    start: str
    end: str
    gpu_days: float
    world: dict[str, Any]  # World.to_json(): family, seed, id, parameters
    rows: ManifestRows
    modes: list[ManifestMode]
    failure_counts: dict[str, int]  # every mode's name, 0 included
    failures_with_precursor: int
    aborted_degradations: int  # precursors that stopped without a failure (not in the log)
    scenarios: list[dict[str, object]]  # each Scenario's fields
    catalogue: ManifestCatalogue
    versions: dict[str, str]
    generation_seconds: float
    telemetry_columns: list[str]
    network_columns: list[str]


def _dictionary(indices: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(names, pa.string()))


def _iso(config: FleetConfig, seconds: float) -> str:
    moment = dt.datetime.fromtimestamp(config.start_unix_s + seconds, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def simulate(config: FleetConfig, out: Path, scenarios: Iterable[Scenario] = ()) -> TwinManifest:
    """Write the twin's four files into `out` (created if absent, files overwritten) and return the manifest.
    The same config and scenarios write the same rows (the manifest's created_at and generation_seconds
    differ). Raises ValueError for a scenario on a node outside the fleet."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    scenarios = tuple(scenarios)
    for s in scenarios:
        if not 0 <= s.node < config.nodes:
            raise ValueError(f"scenario on node {s.node}: the fleet has nodes 0..{config.nodes - 1}")
    twins = [NodeTwin(config, node, scenarios) for node in range(config.nodes)]
    node_names = [config.node_name(n) for n in range(config.nodes)]
    models = sorted({t.traits.generation.model_name for t in twins})
    node_model = np.array([models.index(t.traits.generation.model_name) for t in twins])
    g = config.gpus_per_node
    rows = network_rows = 0
    compression = {"compression": "zstd", "compression_level": 1}
    with (
        pq.ParquetWriter(out / "telemetry.parquet", SUMMARISED_TELEMETRY_SCHEMA, **compression) as telemetry,
        pq.ParquetWriter(out / "network.parquet", NETWORK_SCHEMA, **compression) as network,
    ):
        for _ in range(config.chunks):
            chunks = [twin.next_chunk() for twin in twins]
            n = len(chunks[0].times_s)
            stamps = (config.start_unix_s * 10**9 + np.round(chunks[0].times_s * 1e9)).astype(np.int64)
            # Time-major rows: for each step, every node, every GPU.
            present = np.stack([c.gpu_present for c in chunks], axis=1).reshape(-1)
            node_idx = np.broadcast_to(np.arange(config.nodes)[None, :, None], (n, config.nodes, g)).reshape(
                -1
            )[present]
            gpu_idx = np.broadcast_to(np.arange(g)[None, None, :], (n, config.nodes, g)).reshape(-1)[present]
            repl = np.stack([c.replacements for c in chunks], axis=1).reshape(-1)[present]
            # The chunk's UUID dictionary: every slot with every replacement count seen in it.
            swaps = int(repl.max(initial=0)) + 1
            uuid_idx = (node_idx * g + gpu_idx) * swaps + repl
            uuids = [twins[s // g].uuid(s % g, r) for s in range(config.nodes * g) for r in range(swaps)]
            columns: list[pa.Array] = [
                pa.array(np.repeat(stamps, config.nodes * g)[present], TIMESTAMP),
                _dictionary(node_idx, node_names),
                pa.array(gpu_idx.astype(np.int16)),
                _dictionary(uuid_idx.reshape(-1), uuids),
                _dictionary(node_model[node_idx], models),
            ]
            # One column at a time, so the whole chunk is never copied at once.
            for k, name in enumerate(GPU_COLUMNS):
                column = np.stack([c.gpu_values[:, :, k] for c in chunks], axis=1).reshape(-1)[present]
                columns.append(pa.array(column, TELEMETRY_SCHEMA.field(name).type, from_pandas=False))
            summary = np.stack([c.gpu_summary for c in chunks], axis=1).reshape(-1, 1 + len(SUMMARY_COLUMNS))
            for k, summary_field in enumerate(SUMMARY_FIELDS):
                column = summary[present, k]
                columns.append(
                    pa.array(column.astype(summary_field.type.to_pandas_dtype()), summary_field.type)
                )
            telemetry.write_table(pa.Table.from_arrays(columns, schema=SUMMARISED_TELEMETRY_SCHEMA))
            rows += int(present.sum())

            node_present = np.stack([c.node_present for c in chunks], axis=1).reshape(-1)
            agg = rollup_network(
                np.stack([c.ib_values for c in chunks], axis=1),
                np.stack([c.iface_values for c in chunks], axis=1),
                np.stack([c.peer_values for c in chunks], axis=1),
                np.stack([c.host_values for c in chunks], axis=1),
            )
            net_nodes = np.broadcast_to(np.arange(config.nodes)[None, :], (n, config.nodes)).reshape(-1)[
                node_present
            ]
            net_columns: list[pa.Array] = [
                pa.array(np.repeat(stamps, config.nodes)[node_present], TIMESTAMP),
                _dictionary(net_nodes, node_names),
            ]
            net_columns += [
                pa.array(agg[name].reshape(-1)[node_present], NETWORK_SCHEMA.field(name).type)
                for name in NETWORK_COLUMNS
            ]
            network.write_table(pa.Table.from_arrays(net_columns, schema=NETWORK_SCHEMA))
            network_rows += int(node_present.sum())

    failures = sorted(
        (f for twin in twins for f in twin.schedule.failures if f.fail_s < config.horizon_s),
        key=lambda f: (f.fail_s, f.node, -1 if f.gpu is None else f.gpu),
    )
    _write_failures(config, out / "failures.csv", failures, twins)
    aborted = sum(1 for twin in twins for f in twin.schedule.aborted if f.fail_s < config.horizon_s)
    manifest = _manifest(
        config, scenarios, failures, (rows, network_rows, aborted), time.perf_counter() - started
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write_failures(
    config: FleetConfig, path: Path, failures: list[ScheduledFailure], twins: list[NodeTwin]
) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FAILURE_FIELDS)
        for f in failures:
            twin = twins[f.node]
            uuid = ""
            if f.gpu is not None:
                swaps = sum(
                    1 for e in twin.schedule.gpu_failures(f.gpu) if e.spec.replaced and e.return_s <= f.fail_s
                )
                uuid = twin.uuid(f.gpu, swaps)
            description = f.spec.description + ("; scripted scenario" if f.scripted else "")
            xid = "" if f.xid == 0 else str(f.xid)
            gpu = "" if f.gpu is None else str(f.gpu)
            writer.writerow(
                [
                    _iso(config, f.fail_s),
                    config.node_name(f.node),
                    gpu,
                    uuid,
                    f.mode,
                    xid,
                    f"{f.lead_s:.0f}",
                    description,
                ]
            )


def _manifest(
    config: FleetConfig,
    scenarios: tuple[Scenario, ...],
    failures: list[ScheduledFailure],
    counts_written: tuple[int, int, int],
    seconds: float,
) -> TwinManifest:
    rows, network_rows, aborted = counts_written  # telemetry rows, network rows, aborted degradations
    counts = Counter(f.mode for f in failures)
    gpu_days = config.nodes * config.gpus_per_node * config.days
    manifest: TwinManifest = {
        "kind": "faultcast fleet twin",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": config.to_json(),
        "seed": config.seed,
        "acceleration": config.acceleration,
        "start": _iso(config, 0.0),
        "end": _iso(config, config.horizon_s),
        "gpu_days": gpu_days,
        "world": config.world.to_json(),
        "rows": {"telemetry": rows, "network": network_rows, "failures": len(failures)},
        "modes": [
            {
                "name": m.name,
                "level": m.level.value,
                "predictable": m.predictable,
                "precursor_probability": m.precursor_probability(config.world),
                "base_rate_per_gpu_day": m.rate_per_day
                * config.world.rate_scale(m.name)
                / (config.gpus_per_node if m.level is Level.NODE else 1),
                "accelerated_rate_per_gpu_day": m.rate_per_day
                * config.world.rate_scale(m.name)
                * config.acceleration
                * config.mode_factor(m.name)
                / (config.gpus_per_node if m.level is Level.NODE else 1),
                "lead_median_minutes": m.lead_median_s * config.world.lead_scale / 60.0,
                "lead_sigma": m.lead_sigma,
                "downtime_median_hours": m.downtime_median_s / 3600.0,
                "gpu_replaced": m.replaced,
                "xids": [code for code, _ in m.xids if code],
                "description": m.description,
            }
            for m in MODES
        ],
        "failure_counts": {m.name: counts.get(m.name, 0) for m in MODES},
        "failures_with_precursor": sum(1 for f in failures if f.lead_s > 0),
        "aborted_degradations": aborted,
        "scenarios": [vars(s) if hasattr(s, "__dict__") else _slots(s) for s in scenarios],
        "catalogue": {"version": CATALOGUE_VERSION, "schema_hash": f"{SCHEMA_HASH:#018x}"},
        "versions": {
            "faultcast": __version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "pyarrow": pa.__version__,
        },
        "generation_seconds": round(seconds, 3),
        "telemetry_columns": SUMMARISED_TELEMETRY_SCHEMA.names,
        "network_columns": ["timestamp", "node", *NETWORK_COLUMNS],
    }
    if config.mode_acceleration:
        manifest["mode_acceleration"] = dict(config.mode_acceleration)
    return manifest


def _slots(obj: Scenario) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__slots__}
