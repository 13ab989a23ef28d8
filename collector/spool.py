"""A bounded on-disk spool of samples waiting for the service's acknowledgement.

SQLite (standard library, crash-safe with WAL) holds one row per sample keyed by its sequence
number. The spool assigns sequence numbers, so they keep increasing across collector restarts;
the shipper reads rows after the last one it sent and trims them when the service acknowledges.
Past the bound the oldest samples are dropped, counted and logged: a long outage costs the
oldest history, never the newest.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from faultcast.v1 import telemetry_pb2 as pb

log = logging.getLogger(__name__)

# 24 hours at a 1 s interval; a few KiB each, so well under a GiB for an 8-GPU node.
DEFAULT_MAX_SAMPLES = 86_400

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (sequence INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class Spool:
    def __init__(self, path: Path, *, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        self.path = path
        self.max_samples = max_samples
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a power cut must not roll back sequence numbers the service has already seen.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        # One condition for "a sample was appended" and "an ack arrived": the shipper waits on both.
        self.changed = threading.Condition(threading.Lock())
        self._last_sequence = max(
            self._meta("last_sequence"), self._scalar("SELECT MAX(sequence) FROM samples")
        )
        self._acked_through = self._meta("acked_through")
        self._dropped = self._meta("dropped")
        self._depth = self._scalar("SELECT COUNT(*) FROM samples")
        self.spool_id = self._meta("spool_id")
        if self.spool_id == 0:
            self.spool_id = secrets.randbits(63) + 1
            self._set_meta("spool_id", self.spool_id)

    # -- reading state -------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        return self._last_sequence

    @property
    def acked_through(self) -> int:
        return self._acked_through

    @property
    def dropped(self) -> int:
        """Samples dropped past the bound, over the spool's whole life."""
        return self._dropped

    @property
    def depth(self) -> int:
        """Samples stored and not yet acknowledged."""
        return self._depth

    def read_after(self, sequence: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` stored samples with a sequence above `sequence`, in order."""
        with self.changed:
            rows = self._db.execute(
                "SELECT sequence, payload FROM samples WHERE sequence > ? ORDER BY sequence LIMIT ?",
                (sequence, limit),
            ).fetchall()
        return [(int(seq), bytes(payload)) for seq, payload in rows]

    # -- writing -------------------------------------------------------------------------------

    def append(self, sample: pb.NodeSample) -> int:
        """Assign the next sequence number to `sample`, store it, and return the number."""
        with self.changed:
            sequence = self._last_sequence + 1
            sample.sequence = sequence
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute(
                    "INSERT INTO samples (sequence, payload) VALUES (?, ?)",
                    (sequence, sample.SerializeToString()),
                )
                self._set_meta("last_sequence", sequence)
                self._depth += 1
                overflow = self._depth - self.max_samples
                if overflow > 0:
                    self._drop_oldest(overflow)
            self._last_sequence = sequence
            self.changed.notify_all()
        return sequence

    def ack(self, through: int) -> int:
        """Forget every sample with sequence <= through; returns how many were removed."""
        with self.changed:
            if through <= self._acked_through:
                return 0
            if through > self._last_sequence:
                raise ValueError(
                    f"ack for sequence {through} beyond the last one spooled ({self._last_sequence})"
                )
            with self._db:
                self._db.execute("BEGIN")
                removed = self._db.execute("DELETE FROM samples WHERE sequence <= ?", (through,)).rowcount
                self._set_meta("acked_through", through)
            self._acked_through = through
            self._depth -= removed
            self.changed.notify_all()
        return removed

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate` holds (re-checked on every append and ack) or `timeout` passes."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def close(self) -> None:
        with self.changed:
            self._db.close()

    # -- internals -----------------------------------------------------------------------------

    def _drop_oldest(self, count: int) -> None:
        row = self._db.execute(
            "SELECT sequence FROM samples ORDER BY sequence LIMIT 1 OFFSET ?", (count - 1,)
        ).fetchone()
        cutoff = int(row[0])
        removed = self._db.execute("DELETE FROM samples WHERE sequence <= ?", (cutoff,)).rowcount
        self._depth -= removed
        self._dropped += removed
        self._set_meta("dropped", self._dropped)
        log.warning(
            "spool %s is full (%d samples): dropped the %d oldest, through sequence %d (%d dropped in all)",
            self.path,
            self.max_samples,
            removed,
            cutoff,
            self._dropped,
        )

    def _scalar(self, sql: str) -> int:
        row = self._db.execute(sql).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def _meta(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row is not None else 0

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
