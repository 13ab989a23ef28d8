"""The service's rolling archive of what it scored, in the training data format, one file per day.

    ARCHIVE/manifest.json                      the data manifest: nodes, GPUs per node, cadence, span
    ARCHIVE/telemetry.parquet/YYYY-MM-DD.parquet   a settled day's GPU rows (zstd), sorted by time
    ARCHIVE/network.parquet/YYYY-MM-DD.parquet     its node rows
    ARCHIVE/failures.csv, censored.csv          the label log as of the last settled day (the service writes them)
    ARCHIVE/open/YYYY-MM-DD/{telemetry,network}-N.parquet   parts of days not settled yet
    ARCHIVE/days.json                           what each settled day holds (nodes, rows, bytes)

So ARCHIVE is a data directory like the twin's and the importer's: `faultcast train --data ARCHIVE`
reads its settled days (model/features/parquet_parts.py reads a table split into files).

Nothing is written on the ingest path: `observe` keeps the rows in memory and sets `due` once a part's
worth waits; the service's archive thread runs `maintain` then, and every 30 s.

What is written: one row per GPU per grid step (the model's cadence), the step's last sample with the
step's summary combined over its samples (service/archive/rows.py), the same inputs the online features
took. A node's step is finished when a sample of a later step comes (or, for a node gone quiet, once the
newest event time is two steps past it); finished steps are written as a part every `part_rows` rows
and at every `maintain`. A day is settled once the newest event time is `settle_s` past its end: its
parts are merged into one file, sorted, with a sample written twice (a journal replay after a restart)
kept once. A part that comes for a day already settled (a collector's spool replayed late) is merged
into it at the next `maintain`.

Bounds: days older than `keep_days` before the newest are removed, and while the archive holds more
than `max_bytes` its oldest settled days go (each said in the log, counted). While the open parts alone
exceed the bound, new rows are dropped and counted (the archive never fills the disk the state needs).
A failure to write (full disk) loses those rows only: it is logged and counted, and scoring goes on.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from faultcast.readings import NodeSnapshot
from faultcast.service.archive.rows import PendingStep, RowBuffer, key_codes, pending

log = logging.getLogger(__name__)

DAY_S = 86_400
KIND = "faultcast service archive"
_ROW_GROUP = 262_144  # rows per row group of a settled day: a slice of time the replay reads at once
_COMPRESSION = "zstd"


@dataclass(frozen=True, slots=True)
class ArchiveSettings:
    """Where and how much: `cadence_s` is the model's grid (one row per GPU per step)."""

    directory: Path
    cadence_s: float
    keep_days: float = 90.0
    max_bytes: int = 20 * 2**30
    settle_s: float = 3600.0  # a day is merged this long (event time) after it ends
    part_rows: int = 200_000


@dataclass(frozen=True, slots=True)
class DayRecord:
    """What a settled day's files hold (days.json)."""

    nodes: list[str]
    gpu_rows: int
    bytes: int
    gpus_per_node: int


@dataclass
class ArchiveCounts:
    """What the archive did, for the service's metrics."""

    rows: int = 0  # GPU rows written in parts
    late: int = 0  # samples of a step older than the node's step being filled (dropped)
    dropped: int = 0  # GPU rows lost: the bound reached by open parts, or a write that failed
    settled_days: int = 0
    removed_days: int = 0


class Archive:
    """Collects finished steps from `observe` (any thread, cheap) and writes, merges and prunes at
    `maintain` (one thread). `on_settled(directory)` is called after days settle (the service writes the
    label log's files there)."""

    def __init__(self, settings: ArchiveSettings, on_settled: Callable[[Path], None] | None = None) -> None:
        self.settings, self.on_settled = settings, on_settled
        self.directory = settings.directory
        self.counts = ArchiveCounts()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.due = threading.Event()  # set when a part's worth of rows waits: maintain early
        self._steps: dict[str, PendingStep] = {}
        self._buffer = RowBuffer()
        self._newest_ns = 0
        self._gpus = 0
        for sub in ("telemetry.parquet", "network.parquet", "open"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        self._part = _highest_part(self.directory / "open")
        self._newest_ns = _newest_written_ns(self.directory / "open")  # parts a stopped service left

    # -- the ingest side -------------------------------------------------------------------------

    def observe(self, snapshot: NodeSnapshot) -> None:
        """A sample the scorer took."""
        step = int(snapshot.time_unix_nano // int(self.settings.cadence_s * 1e9))
        with self._lock:
            self._newest_ns = max(self._newest_ns, snapshot.time_unix_nano)
            self._gpus = max(self._gpus, 1 + max((g.index for g in snapshot.gpus), default=-1))
            filling = self._steps.get(snapshot.node)
            if filling is None or step > filling.step:
                if filling is not None:
                    self._buffer.add(filling)
                self._steps[snapshot.node] = pending(step, snapshot)
            elif step == filling.step:
                filling.take(snapshot)
            else:
                self.counts.late += 1
            if len(self._buffer) >= self.settings.part_rows:
                self.due.set()  # the maintenance thread writes it: no disk write on the ingest path

    # -- the maintenance side --------------------------------------------------------------------

    def flush(self, *, everything: bool = False) -> None:
        """Write the finished steps as a part (with `everything`, the steps being filled too)."""
        with self._lock:
            quiet_before = int(self._newest_ns // int(self.settings.cadence_s * 1e9)) - 2
            for node, filling in list(self._steps.items()):
                if everything or filling.step < quiet_before:
                    self._buffer.add(filling)
                    del self._steps[node]
            rows, self._buffer = self._buffer, RowBuffer()
        if len(rows):
            with self._write_lock:
                self._write_part(rows)

    def maintain(self) -> None:
        """Flush, settle the days that are due, apply the bounds, rewrite the manifest."""
        self.due.clear()
        self.flush()
        with self._write_lock:
            settled = self._settle_due()
            removed = self._prune()
            if settled or removed or not (self.directory / "manifest.json").exists():
                self._write_manifest()
        if settled and self.on_settled is not None:
            self.on_settled(self.directory)

    def close(self) -> None:
        """Write everything held (the steps being filled as they are) before the service stops."""
        self.flush(everything=True)

    def days(self) -> list[str]:
        """The settled days held, oldest first."""
        return sorted(self._days())

    def bytes(self) -> int:
        """What the archive holds on disk."""
        return sum(p.stat().st_size for p in self.directory.rglob("*.parquet") if p.is_file())

    # -- parts -----------------------------------------------------------------------------------

    def _write_part(self, rows: RowBuffer) -> None:
        telemetry, network = rows.tables()
        if self._open_bytes() > self.settings.max_bytes:
            self.counts.dropped += telemetry.num_rows
            log.error(
                "archive %s: its unsettled days alone hold more than %d bytes; %d rows not archived",
                self.directory, self.settings.max_bytes, telemetry.num_rows,
            )  # fmt: skip
            return
        try:
            for day, (t_part, n_part) in _by_day(telemetry, network).items():
                self._part += 1
                where = self.directory / "open" / day
                where.mkdir(parents=True, exist_ok=True)
                _write_atomic(t_part, where / f"telemetry-{self._part:08d}.parquet")
                _write_atomic(n_part, where / f"network-{self._part:08d}.parquet")
        except OSError as exc:
            self.counts.dropped += telemetry.num_rows
            log.error(
                "archive %s: could not write %d rows (%s); scoring goes on",
                self.directory,
                telemetry.num_rows,
                exc,
            )
            return
        self.counts.rows += telemetry.num_rows

    def _open_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.directory / "open").rglob("*.parquet") if p.is_file())

    # -- days ------------------------------------------------------------------------------------

    def _settle_due(self) -> list[str]:
        """Merge the parts of every day that is due into its day file; the days merged."""
        with self._lock:
            newest_s = self._newest_ns / 1e9
        settled = []
        for where in sorted(p for p in (self.directory / "open").iterdir() if p.is_dir()):
            day = where.name
            end_s = _day_start_s(day) + DAY_S
            if newest_s < end_s + self.settings.settle_s:
                continue
            try:
                self._settle(day, where)
            except OSError as exc:
                log.error("archive %s: could not settle %s (%s); tried again later", self.directory, day, exc)
                continue
            settled.append(day)
            self.counts.settled_days += 1
        return settled

    def _settle(self, day: str, where: Path) -> None:
        telemetry_file = self.directory / "telemetry.parquet" / f"{day}.parquet"
        network_file = self.directory / "network.parquet" / f"{day}.parquet"
        t_parts = [telemetry_file] if telemetry_file.exists() else []
        n_parts = [network_file] if network_file.exists() else []
        t_parts += sorted(where.glob("telemetry-*.parquet"))
        n_parts += sorted(where.glob("network-*.parquet"))
        telemetry = _once_per_step(_read(t_parts), self.settings.cadence_s, ("node", "gpu"))
        network = _once_per_step(_read(n_parts), self.settings.cadence_s, ("node",))
        _write_atomic(telemetry, telemetry_file, row_group_size=_ROW_GROUP)
        _write_atomic(network, network_file, row_group_size=_ROW_GROUP)
        nodes = sorted(set(telemetry.column("node").to_pylist()) | set(network.column("node").to_pylist()))
        index = self._days()
        index[day] = DayRecord(
            nodes=nodes,
            gpu_rows=telemetry.num_rows,
            bytes=telemetry_file.stat().st_size + network_file.stat().st_size,
            gpus_per_node=int(max(telemetry.column("gpu").to_pylist(), default=-1)) + 1,
        )
        _write_days(self.directory / "days.json", index)
        shutil.rmtree(where)

    def _prune(self) -> list[str]:
        """Remove the days past `keep_days` and, over `max_bytes`, the oldest; the days removed."""
        index = self._days()
        days = sorted(index)
        removed = []
        if days:
            newest = _day_start_s(days[-1])
            removed = [d for d in days if newest - _day_start_s(d) >= self.settings.keep_days * DAY_S]
        total = self.bytes()
        for day in days:
            if total <= self.settings.max_bytes:
                break
            if day not in removed and day != days[-1]:
                removed.append(day)
            total -= index[day].bytes
        for day in removed:
            for table in ("telemetry.parquet", "network.parquet"):
                (self.directory / table / f"{day}.parquet").unlink(missing_ok=True)
            del index[day]
            self.counts.removed_days += 1
            log.warning("archive %s: day %s removed (older than %g days, or over the bound)", self.directory, day,
                        self.settings.keep_days)  # fmt: skip
        if removed:
            _write_days(self.directory / "days.json", index)
        return removed

    def _days(self) -> dict[str, DayRecord]:
        return settled_days(self.directory)

    def _write_manifest(self) -> None:
        index = self._days()
        days = sorted(d for d in index if (self.directory / "telemetry.parquet" / f"{d}.parquet").exists())
        if not days:
            return
        start = _day_start_s(days[0])
        nodes = sorted({n for d in days for n in index[d].nodes})
        gpus = max([index[d].gpus_per_node for d in days] + [self._gpus])
        manifest = {
            "kind": KIND,
            "config": {
                "nodes": len(nodes),
                "gpus_per_node": gpus,
                "cadence_s": self.settings.cadence_s,
                "start_unix_s": start,
                "days": (_day_start_s(days[-1]) + DAY_S - start) / DAY_S,
            },
            "nodes": nodes,
            "days": days,
        }
        _write_json(self.directory / "manifest.json", manifest)
        failures = self.directory / "failures.csv"
        if not failures.exists():  # a data directory needs one; the service writes the label log's
            failures.write_text("timestamp,node,gpu,uuid,mode,xid,precursor_s,description\n")


def settled_days(directory: Path) -> dict[str, DayRecord]:
    """The settled days of the archive in `directory` (days.json; {} when it has none or it is unreadable,
    said in the log)."""
    path = directory / "days.json"
    if not path.exists():
        return {}
    try:
        return {str(day): DayRecord(**record) for day, record in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("archive %s: days.json unreadable (%s); its days are left out", directory, exc)
        return {}


def day_start_s(day: str) -> float:
    """Unix seconds of the start of `day` (YYYY-MM-DD, UTC)."""
    return _day_start_s(day)


def _highest_part(open_dir: Path) -> int:
    numbers = [
        int(p.stem.rsplit("-", 1)[1])
        for p in open_dir.rglob("*-*.parquet")
        if p.stem.rsplit("-", 1)[1].isdigit()
    ]
    return max(numbers, default=0)


def _newest_written_ns(open_dir: Path) -> int:
    """The newest timestamp in the unsettled parts (their statistics; 0 without any)."""
    newest = 0
    for part in open_dir.rglob("telemetry-*.parquet"):
        try:
            meta = pq.ParquetFile(part).metadata
        except (OSError, pa.ArrowException) as exc:
            log.error("archive part %s unreadable (%s); left for the day's settling to judge", part, exc)
            continue
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(0).statistics
            if stats is not None and stats.has_min_max:
                newest = max(newest, int(pa.scalar(stats.max, type=pa.timestamp("ns", tz="UTC")).value))
    return newest


def _day(time_ns: int) -> str:
    return dt.datetime.fromtimestamp(time_ns // 1_000_000_000, tz=dt.UTC).strftime("%Y-%m-%d")


def _day_start_s(day: str) -> float:
    return dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()


def _by_day(telemetry: pa.Table, network: pa.Table) -> dict[str, tuple[pa.Table, pa.Table]]:
    """Both tables split by the UTC day of their rows."""

    def days(table: pa.Table) -> np.ndarray:
        ns = np.asarray(table.column("timestamp").cast(pa.int64()).to_numpy(), dtype=np.int64)
        out: np.ndarray = ns // (DAY_S * 1_000_000_000)
        return out

    t_days, n_days = days(telemetry), days(network)
    out = {}
    for d in np.union1d(t_days, n_days):
        name = _day(int(d) * DAY_S * 1_000_000_000)
        out[name] = (telemetry.filter(pa.array(t_days == d)), network.filter(pa.array(n_days == d)))
    return out


def _read(paths: list[Path]) -> pa.Table:
    """The parts as one table; a part that cannot be read (cut short, damaged) is renamed *.damaged
    and left out, said in the log: its rows are lost, the day's other rows are not."""
    tables = []
    for path in paths:
        try:
            tables.append(pq.read_table(path))
        except (pa.ArrowException, OSError) as exc:
            log.error("archive part %s cannot be read (%s); renamed .damaged, its rows left out", path, exc)
            path.rename(path.with_name(path.name + ".damaged"))
    if not tables:
        raise OSError(f"no readable part among {[p.name for p in paths]}")
    schema = tables[0].schema
    return pa.concat_tables([t.cast(schema) for t in tables])


def _once_per_step(table: pa.Table, cadence_s: float, keys: tuple[str, ...]) -> pa.Table:
    """Sorted by time and keys, one row per (step, keys): the last written wins (rows are in the order
    their parts were written, so a replay's copy of a sample is dropped for the first)."""
    ns = table.column("timestamp").cast(pa.int64()).to_numpy()
    step = ns // int(cadence_s * 1e9)
    codes = [key_codes(table, k) for k in keys]
    order = np.arange(table.num_rows)
    # The newest row of each (step, keys) first, then keep the first of each run.
    by = np.lexsort((-order, *reversed(codes), step))
    s, c = step[by], [k[by] for k in codes]
    first = np.ones(len(by), dtype=bool)
    if len(by) > 1:
        same = s[1:] == s[:-1]
        for k in c:
            same &= k[1:] == k[:-1]
        first[1:] = ~same
    kept = by[first]
    kept = kept[np.lexsort((*(k[kept] for k in reversed(codes)), ns[kept]))]
    return table.take(pa.array(kept))


def _write_atomic(table: pa.Table, path: Path, **options: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression=_COMPRESSION, **options)
    os.replace(tmp, path)


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _write_days(path: Path, index: dict[str, DayRecord]) -> None:
    _write_json(path, {day: asdict(record) for day, record in sorted(index.items())})
