"""The importer's samples on disk, by time bucket, so that a fleet's history is gridded a slice of
time at a time.

Parsing an export yields series one by one, each spanning the whole history; the data files are
written in time order. In between, every sample goes to disk as a 20-byte record (stream, unix
seconds, value) in the file of its time bucket (`bucket_s` seconds, aligned to the epoch), in the
order it was read: within a bucket, records keep the export's order, so the last sample of a
grid step is the same one a whole-export sort would pick. Memory holds at most `flush_samples`
records while parsing and one bucket while gridding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

RECORD = np.dtype([("stream", "<i4"), ("t", "<f8"), ("v", "<f8")])
"""One sample on disk: the stream it belongs to (the importer's numbering), unix seconds, value."""


class Spill:
    """Samples by time bucket in `folder` (which the caller creates and removes)."""

    def __init__(self, folder: Path, *, bucket_s: float = 900.0, flush_samples: int = 2_000_000) -> None:
        if not (bucket_s > 0 and math.isfinite(bucket_s)):
            raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s}")
        self.folder = folder
        self.bucket_s = bucket_s
        self.flush_samples = flush_samples
        self.samples = 0  # written so far
        self.bytes = 0  # on disk
        self.largest_read = 0  # the most records read back at once (a bucket)
        self._buffers: list[np.ndarray] = []
        self._buffered = 0
        self._buckets: set[int] = set()

    def add(self, stream: int, times: np.ndarray, values: np.ndarray) -> None:
        """Append one series' samples (any time order)."""
        records = np.empty(len(times), RECORD)
        records["stream"] = stream
        records["t"] = times
        records["v"] = values
        self._buffers.append(records)
        self._buffered += len(records)
        if self._buffered >= self.flush_samples:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered to the bucket files."""
        if not self._buffers:
            return
        records = np.concatenate(self._buffers)
        self._buffers, self._buffered = [], 0
        bucket = np.floor(records["t"] / self.bucket_s).astype(np.int64)
        order = np.argsort(bucket, kind="stable")  # within a bucket, the order of the export
        records, bucket = records[order], bucket[order]
        edges = [0, *(np.flatnonzero(bucket[1:] != bucket[:-1]) + 1).tolist(), len(records)]
        for lo, hi in itertools.pairwise(edges):
            key = int(bucket[lo])
            with (self.folder / f"{key}.bin").open("ab") as handle:
                records[lo:hi].tofile(handle)
            self._buckets.add(key)
        self.samples += len(records)
        self.bytes += records.nbytes

    def span(self) -> tuple[int, int] | None:
        """The first and last bucket written, or None when nothing was."""
        return (min(self._buckets), max(self._buckets)) if self._buckets else None

    def read(self, t0: float, t1: float) -> Iterator[np.ndarray]:
        """The records of every bucket that overlaps [t0, t1] (a superset: the caller filters by
        time), one bucket at a time in time order, each in the order written: a later bucket's
        samples are all later than an earlier one's."""
        first, last = math.floor(t0 / self.bucket_s), math.floor(t1 / self.bucket_s)
        for key in sorted(k for k in self._buckets if first <= k <= last):
            records = np.fromfile(self.folder / f"{key}.bin", dtype=RECORD)
            self.largest_read = max(self.largest_read, len(records))
            yield records
