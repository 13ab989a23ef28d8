"""A table of a data directory (telemetry.parquet, network.parquet) that is one Parquet file or a
directory of them: a rolling archive writes a file a day (`telemetry.parquet/2026-12-08.parquet`, or
one level deeper, `telemetry.parquet/2026-12-08/part-000001.parquet`).

The files, sorted by their path under the directory, read as one table: each file in time order, the
files in time order by name. Row group i of the table is a row group of one file, so readers that walk
row groups (replay, the visibility report) keep memory bounded by one group. Names starting with "."
or "_" are skipped (a writer's file in progress, as pyarrow skips them), and so is anything not named
*.parquet; a directory's name adds no column (unlike pyarrow's hive partitioning).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class DataError(ValueError):
    """The data directory is incomplete or inconsistent; the message says what is wrong."""


def part_files(path: Path) -> tuple[Path, ...]:
    """The Parquet files of a table: `path` itself when it is a file, else the *.parquet files in the
    directory and in its subdirectories (one level), sorted by relative path; () when none."""
    if path.is_file():
        return (path,)
    if not path.is_dir():
        return ()
    found = [
        f
        for pattern in ("*.parquet", "*/*.parquet")
        for f in path.glob(pattern)
        if f.is_file() and not any(p.startswith((".", "_")) for p in f.relative_to(path).parts)
    ]
    return tuple(sorted(found, key=lambda f: f.relative_to(path).as_posix()))


def table_exists(path: Path) -> bool:
    """Whether `path` is a table: a file, or a directory holding at least one Parquet file."""
    return bool(part_files(path))


class ParquetParts:
    """What readers use of `pq.ParquetFile`, over the files of one table. Footers are read when opened
    (a schema differing from the first file's is a DataError naming the file); a file's data only when
    one of its row groups is read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = part_files(path)
        if not self.files:
            raise DataError(f"{path}: no Parquet file (neither a file nor a directory holding *.parquet)")
        self._metadata = [pq.read_metadata(f) for f in self.files]
        self.schema_arrow: pa.Schema = self._metadata[0].schema.to_arrow_schema()
        for file, meta in zip(self.files[1:], self._metadata[1:], strict=True):
            schema = meta.schema.to_arrow_schema()
            if not schema.equals(self.schema_arrow, check_metadata=False):
                raise DataError(
                    f"{file}: its schema differs from {self.files[0].name}'s (every file of {path.name} "
                    f"must have the same columns and types): {_difference(self.schema_arrow, schema)}"
                )
        # Global row group -> (file, group within it).
        self._groups = [(k, j) for k, meta in enumerate(self._metadata) for j in range(meta.num_row_groups)]
        self._open: tuple[int, pq.ParquetFile] | None = None

    @property
    def num_row_groups(self) -> int:
        return len(self._groups)

    @property
    def num_rows(self) -> int:
        return sum(meta.num_rows for meta in self._metadata)

    @property
    def schema(self) -> pq.ParquetSchema:
        """The Parquet schema (leaf columns in column-chunk order), the first file's."""
        return self._metadata[0].schema

    def row_group(self, i: int) -> pq.RowGroupMetaData:
        """Row group i's metadata (its columns' statistics)."""
        k, j = self._groups[i]
        return self._metadata[k].row_group(j)

    def read_row_group(self, i: int, columns: Sequence[str] | None = None) -> pa.Table:
        k, j = self._groups[i]
        if self._open is None or self._open[0] != k:
            # One file open at a time: the groups are read in order, a file's groups together.
            self._open = (k, pq.ParquetFile(self.files[k], metadata=self._metadata[k]))
        return self._open[1].read_row_group(j, columns=None if columns is None else list(columns))

    def read(
        self, columns: Sequence[str] | None = None, filters: Sequence[tuple[str, str, object]] | None = None
    ) -> pa.Table:
        """The whole table (those columns, the rows `filters` keeps, as pq.read_table's), files in order."""
        picked = None if columns is None else list(columns)
        kept = None if filters is None else list(filters)
        tables = [pq.read_table(f, columns=picked, filters=kept) for f in self.files]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _difference(first: pa.Schema, other: pa.Schema) -> str:
    """What differs between two schemas, in a few words."""
    missing = [n for n in first.names if n not in other.names]
    extra = [n for n in other.names if n not in first.names]
    changed = [
        f"{n} {first.field(n).type} -> {other.field(n).type}"
        for n in first.names
        if n in other.names and first.field(n).type != other.field(n).type
    ]
    said = [
        *([f"lacks {', '.join(missing)}"] if missing else []),
        *([f"adds {', '.join(extra)}"] if extra else []),
        *([f"types {', '.join(changed)}"] if changed else []),
    ]
    return "; ".join(said) or "the column order differs"
