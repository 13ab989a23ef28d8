"""A bounded on-disk spool of samples waiting for the service's acknowledgement.

SQLite (standard library, crash-safe with WAL) holds one row per sample keyed by its sequence
number. The spool assigns sequence numbers, so they keep increasing across collector restarts;
the shipper reads rows after the last one it sent and trims them when the service acknowledges.
Past the bound the oldest samples are dropped, counted and logged: a long outage costs the
oldest history, never the newest.

Space runs out in two ways, and both end the same way (the oldest unacknowledged samples make
room, counted in `dropped_no_space`, one warning per append that had to drop):

- the optional byte bound `max_bytes` (SQLite's `max_page_count`): the insert fails with
  SQLITE_FULL, deleting the oldest frees pages inside the file, the insert is retried;
- a full disk. With WAL, that alone would jam the spool: the write-ahead log cannot be
  checkpointed into a file that cannot grow, so it cannot be reset, so not even a DELETE can be
  written. A reserve file (`reserve_bytes`, allocated next to the spool) breaks the jam: on the
  first SQLITE_FULL that the byte bound does not explain, the spool gives the reserve back to the
  filesystem, checkpoints, and freezes its file at its present size; from then on it behaves as
  if bounded at that size. When the disk has room again (twice the reserve, checked on the next
  SQLITE_FULL), the reserve is taken back and the spool may grow again.

`append` does not raise for lack of space (see its docstring); other storage errors (an I/O
error, a disk remounted read-only) do, and the caller decides.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from faultcast.v1 import telemetry_pb2 as pb

log = logging.getLogger(__name__)

# 24 hours at a 1 s interval; a few KiB each, so well under a GiB for an 8-GPU node.
DEFAULT_MAX_SAMPLES = 86_400
# Disk held back for the day the disk fills up; the write-ahead log is kept to a quarter of it.
DEFAULT_RESERVE_BYTES = 4 << 20
# The smallest byte bound: the schema alone takes a few pages.
MIN_MAX_BYTES = 64 << 10
# Of the samples stored, the share dropped at once when space runs out (doubled while the sample
# still does not fit): the freed pages then take the next appends too, so a full disk costs one
# warning per batch, not one per sample.
_NO_SPACE_BATCH = 0.01

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (sequence INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def _no_space(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: the disk is full, or the file reached its max_page_count."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class Spool:
    """A crash-safe, bounded queue of samples on disk, numbered by sequence (see the module docstring).

    Thread-safe: the collector appends while the shipper reads and acknowledges; `changed` is
    notified on every append and ack.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_bytes: int | None = None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        """`max_bytes` bounds the database file (the write-ahead log, at most a quarter of
        `reserve_bytes`, and the reserve come on top); `reserve_bytes=0` keeps no reserve, and then
        a full disk may leave the spool unable to drop anything until there is room again."""
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples}")
        if max_bytes is not None and max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must not be negative, got {reserve_bytes}")
        self.path = path
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self.reserve_path = path.with_name(path.name + "-reserve")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._connect()
        self._page_size = self._scalar("PRAGMA page_size")
        if reserve_bytes > 0:
            # The reserve must cover what a checkpoint may add to the file: the log's length.
            self._db.execute(f"PRAGMA wal_autocheckpoint={max(16, reserve_bytes // self._page_size // 4)}")
        # One condition for "a sample was appended" and "an ack arrived": the shipper waits on both.
        self.changed = threading.Condition(threading.Lock())
        self._last_sequence = max(
            self._meta("last_sequence"), self._scalar("SELECT MAX(sequence) FROM samples")
        )
        self._acked_through = self._meta("acked_through")
        self._dropped = self._meta("dropped")
        self._dropped_no_space = self._meta("dropped_no_space")
        self._no_space_unsaved = False  # counted while not even the counter could be written
        self._depth = self._scalar("SELECT COUNT(*) FROM samples")
        # The page cap the operator asked for, and whether a full disk has frozen the file below it.
        self._max_pages = self._initial_page_cap()
        self._frozen = False
        self._hold_reserve()
        self.spool_id = self._load_spool_id()

    def _connect(self) -> sqlite3.Connection:
        """Open (or create) the database in WAL mode with the schema."""
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL: a power cut must not roll back sequence numbers the service has already seen.
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        return db

    def _initial_page_cap(self) -> int:
        """Cap the file at `max_bytes` (SQLite's default, about 2**32 pages, without it); the cap taken."""
        unbounded = self._scalar("PRAGMA max_page_count")
        max_bytes = self.max_bytes
        pages = self._set_page_cap(unbounded if max_bytes is None else max(1, max_bytes // self._page_size))
        if max_bytes is not None and pages * self._page_size > max_bytes:
            log.warning(
                "spool %s is already %d bytes, above max_bytes %d: it will not grow, nor shrink",
                self.path,
                pages * self._page_size,
                max_bytes,
            )
        return pages

    def _load_spool_id(self) -> int:
        """This spool's random id, made and stored on first use: the service tells restarts apart by it."""
        spool_id = self._meta("spool_id")
        if spool_id == 0:
            spool_id = secrets.randbits(63) + 1
            self._set_meta("spool_id", spool_id)
        return spool_id

    # -- reading state -------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        """The sequence number of the newest sample stored (0 before the first)."""
        return self._last_sequence

    @property
    def acked_through(self) -> int:
        """Every sample up to this sequence number is acknowledged by the service and forgotten."""
        return self._acked_through

    @property
    def dropped(self) -> int:
        """Samples dropped past the bound, over the spool's whole life."""
        return self._dropped

    @property
    def dropped_no_space(self) -> int:
        """Samples dropped for lack of space (a full disk, or `max_bytes`), over the spool's life."""
        return self._dropped_no_space

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
        """Assign the next sequence number to `sample`, store it, and return the number.

        Lack of space never raises: the oldest unacknowledged samples make room (counted in
        `dropped_no_space`). When even an empty spool cannot take the sample (or the disk is so
        full that not even a drop can be written), the sample itself is counted there and not
        stored: its sequence is set back to 0, no number is used up, and 0 is returned. Any other
        storage error raises `sqlite3.Error`.
        """
        with self.changed:
            sequence = self._last_sequence + 1
            sample.sequence = sequence
            payload = sample.SerializeToString()
            dropped_before = self._dropped_no_space
            stored, through = self._store_making_room(sequence, payload)
            dropped = self._dropped_no_space - dropped_before
            if dropped:
                log.warning(
                    "spool %s is out of space (%s): dropped the %d oldest samples, through sequence %d "
                    "(%d dropped for space in all)",
                    self.path,
                    self._why_full(),
                    dropped,
                    through,
                    self._dropped_no_space,
                )
            if not stored:
                self._refuse(sample, len(payload))
                return 0
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
            try:
                removed = self._trim(through)
            except sqlite3.OperationalError as exc:
                # A DELETE takes no pages, so this is a full disk jamming the log: unjam, once.
                if not _no_space(exc) or self._frozen:
                    raise
                self._freeze()
                removed = self._trim(through)
            self._acked_through = through
            self._depth -= removed
            self.changed.notify_all()
        return removed

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate` holds (re-checked on every append and ack) or `timeout` passes."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def close(self) -> None:
        """Close the database; the spool is not used after."""
        with self.changed:
            self._db.close()

    # -- internals -----------------------------------------------------------------------------

    def _store_making_room(self, sequence: int, payload: bytes) -> tuple[bool, int]:
        """Insert the sample, making room while it does not fit: grow back if the disk has room
        again, freeze on a full disk, else drop the oldest in growing batches. Returns (stored,
        the last sequence dropped for it or 0)."""
        through, thawed = 0, False
        batch = max(1, int(self._depth * _NO_SPACE_BATCH))
        stored = self._insert(sequence, payload)
        while not stored:
            if self._frozen and not thawed and self._thaw():
                thawed = True  # the disk has room again: grow rather than drop
            elif not self._frozen and not self._at_page_cap(len(payload)):
                self._freeze()  # not our own bound, so the disk is full
            else:
                removed, cutoff = self._drop_for_space(batch)
                if removed:
                    through = cutoff
                    batch *= 2  # the last did not free a page the sample fits: fewer, larger tries
                elif self._depth > 0 and not self._frozen:
                    self._freeze()  # not even the drop could be written: the disk is full after all
                else:
                    break
            stored = self._insert(sequence, payload)
        return stored, through

    def _refuse(self, sample: pb.NodeSample, size: int) -> None:
        """A sample that cannot be stored at all: counted as dropped for space, its sequence unset."""
        sample.sequence = 0
        self._dropped_no_space += 1
        self._no_space_unsaved = True
        log.warning(
            "spool %s cannot store a %d-byte sample even after dropping all it could (%s): "
            "the sample is dropped (%d dropped for space in all)",
            self.path,
            size,
            self._why_full(),
            self._dropped_no_space,
        )

    def _insert(self, sequence: int, payload: bytes) -> bool:
        """Store one sample in one transaction; False when there is no space for it."""
        overflow = self._depth + 1 - self.max_samples
        try:
            with self._db:
                self._db.execute("BEGIN")
                # Drop first: the pages it frees take the new sample when the file cannot grow.
                removed, cutoff = self._delete_oldest(overflow) if overflow > 0 else (0, 0)
                if removed:
                    self._set_meta("dropped", self._dropped + removed)
                self._db.execute("INSERT INTO samples (sequence, payload) VALUES (?, ?)", (sequence, payload))
                self._set_meta("last_sequence", sequence)
                if self._no_space_unsaved:
                    self._set_meta("dropped_no_space", self._dropped_no_space)
        except sqlite3.OperationalError as exc:
            if _no_space(exc):
                return False
            raise
        self._no_space_unsaved = False
        self._depth += 1 - removed
        self._dropped += removed
        if removed:
            log.warning(
                "spool %s is full (%d samples): dropped the %d oldest, through sequence %d (%d dropped in all)",
                self.path,
                self.max_samples,
                removed,
                cutoff,
                self._dropped,
            )
        return True

    def _drop_for_space(self, count: int) -> tuple[int, int]:
        """Drop up to `count` of the oldest stored samples to free pages; returns (how many, through
        which sequence), (0, 0) when there is nothing to drop or not even the drop can be written."""
        if self._depth == 0:
            return 0, 0
        try:
            with self._db:
                self._db.execute("BEGIN")
                # The DELETE before the counter: the counter's row may need the page it frees.
                removed, cutoff = self._delete_oldest(min(count, self._depth))
                self._set_meta("dropped_no_space", self._dropped_no_space + removed)
        except sqlite3.OperationalError as exc:
            if _no_space(exc):
                return 0, 0
            raise
        self._no_space_unsaved = False
        self._depth -= removed
        self._dropped_no_space += removed
        return removed, cutoff

    def _delete_oldest(self, count: int) -> tuple[int, int]:
        """Inside a transaction: delete the `count` oldest samples; returns (deleted, last sequence)."""
        row = self._db.execute(
            "SELECT sequence FROM samples ORDER BY sequence LIMIT 1 OFFSET ?", (count - 1,)
        ).fetchone()
        if row is None:
            return 0, 0
        cutoff = int(row[0])
        removed = self._db.execute("DELETE FROM samples WHERE sequence <= ?", (cutoff,)).rowcount
        return removed, cutoff

    def _trim(self, through: int) -> int:
        with self._db:
            self._db.execute("BEGIN")
            removed = self._db.execute("DELETE FROM samples WHERE sequence <= ?", (through,)).rowcount
            self._set_meta("acked_through", through)
        return int(removed)

    # -- space ---------------------------------------------------------------------------------

    def _at_page_cap(self, payload_bytes: int) -> bool:
        """Whether a sample of this size may not fit under the page cap (so the bound, not the
        disk, explains a SQLITE_FULL): its own pages and a few for the tree, counted generously."""
        needed = payload_bytes // max(1, self._page_size - 64) + 8
        return self._scalar("PRAGMA page_count") + needed > self._page_cap()

    def _freeze(self) -> None:
        """The disk is full: give the reserve back so the log can be checkpointed into the file
        (and so reset), then cap the file at its present size."""
        released = self._release_reserve()
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.OperationalError as exc:
            log.debug("checkpoint of spool %s on a full disk failed: %s", self.path, exc)
        pages = self._set_page_cap(min(self._max_pages, self._scalar("PRAGMA page_count")))
        self._frozen = True
        log.warning(
            "the disk under spool %s is full (%s): the spool stays at %d bytes and drops its oldest "
            "samples to take new ones",
            self.path,
            "reserve released" if released else "no reserve to release",
            pages * self._page_size,
        )

    def _thaw(self) -> bool:
        """While frozen: if the disk has room again, take the reserve back and lift the cap."""
        room = 2 * max(self.reserve_bytes, MIN_MAX_BYTES)
        try:
            stat = os.statvfs(self.path.parent)
        except OSError:
            return False
        if stat.f_bavail * stat.f_frsize < room or (self.reserve_bytes > 0 and not self._hold_reserve()):
            return False
        self._set_page_cap(self._max_pages)
        self._frozen = False
        log.warning("the disk under spool %s has room again: the spool may grow", self.path)
        return True

    def _hold_reserve(self) -> bool:
        """Allocate the reserve file (best effort: False when the disk has not that much room)."""
        if self.reserve_bytes == 0:
            return False
        try:
            fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)
            finally:
                os.close(fd)
        except OSError as exc:
            self.reserve_path.unlink(missing_ok=True)
            log.warning("cannot reserve %d bytes for spool %s: %s", self.reserve_bytes, self.path, exc)
            return False
        return True

    def _release_reserve(self) -> bool:
        try:
            self.reserve_path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _why_full(self) -> str:
        if self._frozen:
            return "the disk is full"
        return f"max_bytes {self.max_bytes}" if self.max_bytes is not None else "SQLite's page limit"

    def _page_cap(self) -> int:
        return self._scalar("PRAGMA max_page_count")

    def _set_page_cap(self, pages: int) -> int:
        """Set max_page_count; SQLite will not go below the file's present size, so this returns
        the cap it took."""
        row = self._db.execute(f"PRAGMA max_page_count={int(pages)}").fetchone()
        return int(row[0])

    def _scalar(self, sql: str) -> int:
        row = self._db.execute(sql).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def _meta(self, key: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row is not None else 0

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
