"""Writing a run: telemetry.parquet, network.parquet, failures.csv and manifest.json.

Telemetry and network rows are written chunk by chunk of time, one Parquet row group per chunk, rows
in (timestamp, node, gpu) order, so memory stays bounded by `IndependentConfig.rows_per_group`.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast.catalogue import CATALOGUE_VERSION
from faultcast.schemas import FAILURE_FIELDS, GPU_COLUMNS, NETWORK_SCHEMA, TELEMETRY_SCHEMA
from faultcast.sim.independent.events import Schedule, build
from faultcast.sim.independent.generator import Chunk, Fleet
from faultcast.sim.independent.world import CAUSES, MODELS, IndependentConfig, World, draw_world, logged_mode

KIND = "faultcast independent twin"
_NS = 1_000_000_000


def card_uuid(seed: int, card: int) -> str:
    """A stable UUID-4-looking GPU UUID for card `card` of the run with `seed`."""
    h = bytearray(hashlib.sha256(f"faultcast-independent:{seed}:{card}".encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x40
    h[8] = (h[8] & 0x3F) | 0x80
    x = h.hex()
    return f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:32]}"


def _dictionary(indices: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), pa.array(values, pa.string()))


def _telemetry_table(
    chunk: Chunk, config: IndependentConfig, schedule: Schedule, names: list[str]
) -> pa.Table:
    ks, us = np.nonzero(chunk.gpu_present)
    g = config.gpus_per_node
    stamps = (config.start_unix_s + (chunk.first_step + ks) * config.cadence_s) * _NS
    cards = chunk.card[ks, us]
    present_cards, card_index = np.unique(cards, return_inverse=True)
    unit_model = schedule.node_model[us // g]
    arrays: list[pa.Array] = [
        pa.array(np.round(stamps).astype(np.int64), TELEMETRY_SCHEMA.field("timestamp").type),
        _dictionary(us // g, names),
        pa.array((us % g).astype(np.int16)),
        _dictionary(card_index, [card_uuid(config.seed, int(c)) for c in present_cards]),
        _dictionary(unit_model, [m.name for m in MODELS]),
    ]
    for name in GPU_COLUMNS:
        arrays.append(
            pa.array(chunk.gpu[name][ks, us].astype(TELEMETRY_SCHEMA.field(name).type.to_pandas_dtype()))
        )
    return pa.Table.from_arrays(arrays, schema=TELEMETRY_SCHEMA)


def _network_table(chunk: Chunk, config: IndependentConfig, names: list[str]) -> pa.Table:
    ks, ns = np.nonzero(chunk.network_present)
    stamps = (config.start_unix_s + (chunk.first_step + ks) * config.cadence_s) * _NS
    arrays: list[pa.Array] = [
        pa.array(np.round(stamps).astype(np.int64), NETWORK_SCHEMA.field("timestamp").type),
        _dictionary(ns, names),
    ]
    for field in list(NETWORK_SCHEMA)[2:]:
        arrays.append(pa.array(chunk.network[field.name][ks, ns].astype(field.type.to_pandas_dtype())))
    return pa.Table.from_arrays(arrays, schema=NETWORK_SCHEMA)


def _iso(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def generate(out: Path, config: IndependentConfig) -> dict[str, Any]:
    """Write a run of `config` into `out` (created if needed); returns the manifest it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    world: World = draw_world(config.drawn_world_seed)
    schedule = build(config, world)
    fleet = Fleet(config, world, schedule)
    names = [f"node-{i:04d}" for i in range(config.nodes)]
    rows = {"telemetry": 0, "network": 0}
    with (
        pq.ParquetWriter(out / "telemetry.parquet", TELEMETRY_SCHEMA, compression="zstd") as telemetry,
        pq.ParquetWriter(out / "network.parquet", NETWORK_SCHEMA, compression="zstd") as network,
    ):
        for chunk in fleet.chunks():
            table = _telemetry_table(chunk, config, schedule, names)
            telemetry.write_table(table, row_group_size=max(table.num_rows, 1))
            rows["telemetry"] += table.num_rows
            net = _network_table(chunk, config, names)
            network.write_table(net, row_group_size=max(net.num_rows, 1))
            rows["network"] += net.num_rows

    logged = [f for f in schedule.failures if f.mode is not None]
    with (out / "failures.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FAILURE_FIELDS)
        for f in logged:
            node_level = f.gpu < 0
            uuid = "" if node_level else card_uuid(config.seed, f.card_before)
            description = f"{f.cause.name}: " + (
                f"precursor {f.precursor_s:.0f} s" if f.precursor_s > 0 else "no precursor"
            )
            writer.writerow(
                [
                    _iso(config.start_unix_s + f.time_s),
                    names[f.node],
                    "" if node_level else f.gpu,
                    uuid,
                    f.mode,
                    f.xid or "",
                    f"{f.precursor_s:.0f}",
                    description,
                ]
            )
    gpu_days = config.nodes * config.gpus_per_node * config.steps * config.cadence_s / 86_400.0
    logged_share = sum(world["cause_mix"][c.name] for c in CAUSES if logged_mode(c) is not None)
    manifest: dict[str, Any] = {
        "kind": KIND,
        "catalogue_version": CATALOGUE_VERSION,
        "config": config.as_dict(),
        "seed": config.seed,
        "acceleration": config.acceleration,
        "nodes": names,
        "world": {
            "family": "independent",
            "seed": config.drawn_world_seed,
            "id": world.id,
            "parameters": world.parameters,
        },
        "failure_counts": dict(sorted(Counter(str(f.mode) for f in logged).items())),
        "failures_with_precursor": sum(1 for f in logged if f.precursor_s > 0),
        "unlogged_interruptions": dict(sorted(schedule.unlogged.items())),
        "near_miss_degradations": schedule.near_misses,
        "expected_logged_failures": world["failure_rate_per_gpu_day"]
        * config.acceleration
        * gpu_days
        * logged_share,
        "gpu_days": gpu_days,
        "gpu_replacements": sum(1 for f in schedule.failures if f.replace),
        "rows": rows,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
