"""Seeding the service's archive from a data directory (the twin's `faultcast simulate` output, or
`faultcast import-prometheus` output): its telemetry and network rows split by UTC day into the archive's
settled day files, with days.json and manifest.json as the archive writes them (service/archive/writer.py).

A seeded day is what the archive would have settled after observing the same samples: sorted by time
and keys, one row per GPU (or node) per grid step, in row groups of the same size. A day the archive
already holds is merged with it (as a late part is), so seeding day by day as time passes, or seeding
again, gives the same files. The rows are read a row group at a time, so memory holds a few days' rows
at most when the input is in time order (the twin's and the importer's are).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast.model.features.parquet_parts import part_files
from faultcast.service.archive.writer import (
    _ROW_GROUP,
    DAY_S,
    Archive,
    ArchiveSettings,
    DayRecord,
    _day,
    _once_per_step,
    _read,
    _write_atomic,
    _write_days,
    settled_days,
)

_NS_PER_DAY = DAY_S * 1_000_000_000


@dataclass
class _Written:
    """What the day files written so far hold: nodes, GPU rows and GPUs per node, by day."""

    nodes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    gpu_rows: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)


def seed_archive(
    data_dir: Path, archive_dir: Path, cadence_s: float, days: Collection[str] | None = None
) -> list[str]:
    """Write the rows of `data_dir` (of `days` only, YYYY-MM-DD UTC, when given) into the archive at
    `archive_dir` as settled days; returns the days written, oldest first."""
    for sub in ("telemetry.parquet", "network.parquet", "open"):
        (archive_dir / sub).mkdir(parents=True, exist_ok=True)
    written = _Written()
    for table, keys in (("telemetry.parquet", ("node", "gpu")), ("network.parquet", ("node",))):
        for day, rows in _days_of(part_files(data_dir / table), days):
            merged = _merge_day(archive_dir / table / f"{day}.parquet", rows, cadence_s, keys)
            written.nodes[day] |= set(merged.column("node").cast(pa.string()).to_pylist())
            if table == "telemetry.parquet":
                written.gpu_rows[day] = merged.num_rows
                written.gpus[day] = int(max(merged.column("gpu").to_pylist(), default=-1)) + 1
    index = settled_days(archive_dir)
    for day in written.nodes:
        files = [archive_dir / t / f"{day}.parquet" for t in ("telemetry.parquet", "network.parquet")]
        if not all(f.exists() for f in files):  # a day with node rows only: no GPU row to train on
            continue
        before = index.get(day)
        index[day] = DayRecord(
            nodes=sorted(written.nodes[day] | set(before.nodes if before else ())),
            gpu_rows=written.gpu_rows.get(day, before.gpu_rows if before else 0),
            bytes=sum(f.stat().st_size for f in files),
            gpus_per_node=written.gpus.get(day, before.gpus_per_node if before else 0),
        )
    _write_days(archive_dir / "days.json", index)
    # The manifest exactly as the archive writes it after settling (and the empty failures.csv a data
    # directory needs until the service writes its label log there).
    Archive(ArchiveSettings(archive_dir, cadence_s))._write_manifest()
    return sorted(d for d in written.nodes if d in index)


def _days_of(files: tuple[Path, ...], wanted: Collection[str] | None) -> Iterator[tuple[str, pa.Table]]:
    """Each UTC day's rows of the files: a day is given once no later row group can hold it (the rows
    in time order), the rest at the end."""
    held: dict[str, list[pa.Table]] = defaultdict(list)
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=_ROW_GROUP):
            table = pa.Table.from_batches([batch])
            ns = np.asarray(table.column("timestamp").cast(pa.int64()).to_numpy(), dtype=np.int64)
            day_numbers = ns // _NS_PER_DAY
            for number in np.unique(day_numbers):
                day = _day(int(number) * _NS_PER_DAY)
                if wanted is None or day in wanted:
                    held[day].append(table.filter(pa.array(day_numbers == number)))
            if len(ns):
                first = _day(int(ns.min()))
                for day in [d for d in held if d < first]:
                    yield day, pa.concat_tables(held.pop(day))
    for day in sorted(held):
        yield day, pa.concat_tables(held.pop(day))


def _merge_day(path: Path, rows: pa.Table, cadence_s: float, keys: tuple[str, ...]) -> pa.Table:
    """The day file at `path` with `rows` merged into it (the new rows win a step both hold); returns
    what was written."""
    parts = [_read([path]), rows] if path.exists() else [rows]
    schema = parts[0].schema
    table = _once_per_step(pa.concat_tables([p.cast(schema) for p in parts]), cadence_s, keys)
    _write_atomic(table, path, row_group_size=_ROW_GROUP)
    return table
