"""The service's durable state in `--state-dir`: one SQLite database.

- the alert log: every OPEN and CLEARED event, ids from SQLite's AUTOINCREMENT (never reused, so
  they increase across restarts); a subscriber resumes after the last id it saw with no gap;
- registered jobs and their nodes, acknowledgements, remediations (one row per alert, never claimed
  twice): a row stays `pending` with its request and attempt count until it is finished, so one that
  a killed service left unfinished is found and carried on at the next start;
- the ingest cursors: the highest sequence accepted per (node, spool id), so a collector's replay
  after a service restart is not taken twice.

WAL with synchronous=FULL: an alert a subscriber has seen is on disk first. One connection behind a
lock; a condition variable wakes subscribers when an event is appended.

A damaged database is never taken for a fresh one: a file that is empty, unreadable, fails SQLite's
quick check or lacks the alert log refuses to open (`StateError`, one line naming the file and what
to do). Alert ids never go backwards, even across a database replaced by a new one or restored from
a backup: at every open the next id is at least the microseconds since the Unix epoch, so a
subscriber's cursor from before is below every new id and it resumes without a gap. While the disk
is full or unavailable at start the refusal says so (the database was not found damaged).

A failed write (full disk, I/O error) leaves no transaction open on the shared connection and
raises `StateWriteError` naming what was written; callers keep what they meant to write and retry.
`on_writable` hears when writes start failing and when every kind that failed works again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from faultcast.v1 import alerts_pb2 as apb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    state INTEGER NOT NULL,
    opened_id INTEGER NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS alerts_node ON alerts (node, id);
CREATE INDEX IF NOT EXISTS alerts_opened ON alerts (opened_id, id);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    nodes TEXT NOT NULL,
    registered_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS acks (
    alert_id INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    action INTEGER NOT NULL,
    step INTEGER NOT NULL,
    checkpoint_uri TEXT NOT NULL,
    at_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS remediations (
    alert_id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    actuator TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL,
    at_unix REAL NOT NULL,
    request TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS cursors (
    node TEXT NOT NULL,
    spool_id INTEGER NOT NULL,
    last_sequence INTEGER NOT NULL,
    seen_unix REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (node, spool_id)
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


# Columns later versions added to a table, for databases an earlier version created.
_ADDED_COLUMNS = {
    "remediations": (
        ("request", "TEXT NOT NULL DEFAULT ''"),
        ("attempts", "INTEGER NOT NULL DEFAULT 0"),
    ),
    "cursors": (("seen_unix", "REAL NOT NULL DEFAULT 0"),),
}
# The largest integer SQLite stores (signed 64 bits): anything from the wire above it is refused at
# the edge, before it can reach a write.
MAX_STORED_INT = 2**63 - 1
# Spool ids remembered per node: a collector keeps one for its life (a new one only when its spool
# is wiped); a caller opening streams with fresh ids must not grow the table without bound.
SPOOLS_PER_NODE = 8

T = TypeVar("T")


class StateError(Exception):
    """The state database cannot be used as it is (damaged, emptied, not a database): the service
    must not start on it, nor start over in its place."""


class StateWriteError(sqlite3.OperationalError):
    """A write to the state database failed (full disk, I/O error); `what` names what was written.
    Nothing of it was stored, and the connection is left usable."""

    def __init__(self, what: str, cause: sqlite3.Error) -> None:
        super().__init__(f"could not write {what} to the state database: {cause}")
        self.what = what


def _refusal(path: Path, problem: str) -> StateError:
    return StateError(
        f"state database {path} {problem}; it holds the alert log, jobs, cursors and remediations: "
        f"restore it from a backup, or move it (and its -wal and -shm files) away to start with a new, "
        "empty state (alert ids continue upwards; registered jobs and the remediation pause are lost)"
    )


@dataclass(frozen=True, slots=True)
class PendingRemediation:
    """A remediation claimed and not finished: retrying, or cut off by the service being killed."""

    alert_id: int
    node: str
    request: str  # what the remediator stored at the claim ("" from a version that stored nothing)
    attempts: int  # attempts begun, the last perhaps interrupted
    detail: str  # why the last finished attempt failed ("" before any did)


@dataclass(frozen=True, slots=True)
class Ack:
    alert_id: int
    job_id: str
    action: int
    step: int
    checkpoint_uri: str


# Writes the service keeps in memory and retries itself when the database refuses them.
_HELD_AND_RETRIED = frozenset({"alerts", "cursors", "remediation", "settings"})
_ANY = ""  # a refused write its caller retries: any later write that works ends the trouble

# SQLite errors that say the disk or the file system is the trouble, not the database's contents.
_UNAVAILABLE = (
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_BUSY",
    "SQLITE_READONLY",
    "SQLITE_PERM",
)


def _ids_from_the_clock(db: sqlite3.Connection) -> None:
    """Give out alert ids from at least the microseconds since the Unix epoch, at every open: a new
    log, a restored backup or a log whose seeding was cut off never gives out an id an earlier log
    did (unless that log gave out more than a million ids per second of its life)."""
    now_us = time.time_ns() // 1000
    db.execute("BEGIN IMMEDIATE")
    try:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'alerts'").fetchone()
        if row is None:
            top = db.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()[0]
            db.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('alerts', ?)", (max(now_us, int(top)),)
            )
        elif int(row[0]) < now_us:
            db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'alerts'", (now_us,))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


class StateStore:
    def __init__(
        self,
        path: Path,
        *,
        on_writable: Callable[[bool, str], None] | None = None,
        on_write_failed: Callable[[str], None] | None = None,
    ) -> None:
        """Open (or create) the database at `path`; raises StateError when it exists and cannot be
        used. `on_writable(writable, why)`: called when writes start failing and when they work again;
        `on_write_failed(what)`: called on every failed write (what: alerts, cursors, remediation, jobs,
        acks, settings)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.on_writable, self.on_write_failed = on_writable, on_write_failed
        self.writable = True  # False while some kind of write (`what`) fails and has not since worked
        self._failing: set[str] = set()
        self._db = self._open(path)
        self._lock = threading.Lock()
        self._appended = threading.Condition(self._lock)
        self._closed = False
        row = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()
        self.last_id: int = int(row[0])

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        if path.is_dir():
            raise _refusal(path, "is a directory, not a database file")
        wal = path.with_name(path.name + "-wal")
        wal_has_data = wal.exists() and wal.stat().st_size > 0
        if not path.exists() and wal_has_data:
            raise _refusal(
                path, f"is missing while its write-ahead log {wal.name} is there: it was removed or lost"
            )
        existed = path.exists() and (path.stat().st_size > 0 or wal_has_data)
        if path.exists() and not existed:
            raise _refusal(path, "is empty (0 bytes): its contents were lost")
        try:
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            if existed:
                problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
                if problems != ["ok"]:
                    raise _refusal(path, f"is damaged (SQLite's quick check: {'; '.join(problems[:3])})")
                tables = {
                    str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                }
                if "alerts" not in tables:
                    raise _refusal(path, "is a database without faultcast's alert log")
            db.executescript(_SCHEMA)
            for table, columns in _ADDED_COLUMNS.items():
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                for name, declaration in columns:
                    if name not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
            _ids_from_the_clock(db)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "").startswith(_UNAVAILABLE):
                raise StateError(
                    f"state database {path} cannot be opened ({exc}): the disk is full, read-only or "
                    "unavailable; the database was not found damaged: free space or fix access to "
                    f"{path.parent}, then start again"
                ) from exc
            raise _refusal(path, f"cannot be read ({exc})") from exc
        return db

    @classmethod
    def in_dir(
        cls,
        state_dir: Path,
        *,
        on_writable: Callable[[bool, str], None] | None = None,
        on_write_failed: Callable[[str], None] | None = None,
    ) -> StateStore:
        return cls(
            state_dir / "faultcast-service.sqlite", on_writable=on_writable, on_write_failed=on_write_failed
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._appended.notify_all()
            self._db.close()

    # -- writing ----------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (an exception of the caller's code
        too): nothing may leave the shared connection inside a transaction. The lock is held."""
        if self._db.in_transaction:  # never expected; a leftover would poison every later write
            self._db.execute("ROLLBACK")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _checked_write(self, what: str, write: Callable[[], T]) -> T:
        """Run `write` (the lock held); a failure of the database becomes StateWriteError and is
        reported to `on_writable`, as is the recovery once every kind of write that failed worked."""
        try:
            result = write()
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError):
                raise  # a bug, not the disk
            if self.on_write_failed is not None:
                self.on_write_failed(what)
            # What the service holds and retries is failing until that very kind of write works
            # (a small write that fits where a large one did not, or a no-op, proves nothing); a
            # write the caller retries (a job, an ack) until any write works.
            self._failing.add(what if what in _HELD_AND_RETRIED else _ANY)
            self._writable(f"{what}: {exc}")
            raise StateWriteError(what, exc) from exc
        if self._failing:
            self._failing -= {what, _ANY}
            self._writable("")
        return result

    def _writable(self, why: str) -> None:
        writable = not self._failing
        if writable == self.writable:
            return
        self.writable = writable
        if self.on_writable is not None:
            self.on_writable(writable, why)

    # -- the alert log ----------------------------------------------------------------------

    def append(self, alerts: Sequence[apb.Alert]) -> list[apb.Alert]:
        """Store events in one transaction; returns them with their ids set (and an OPEN event's
        opened_id set to its own id). StateWriteError when the database refused them (none stored)."""
        with self._lock:
            out = self._checked_write("alerts", lambda: self._insert(alerts))
            if out:
                self.last_id = out[-1].id
                self._appended.notify_all()
        return out

    def _insert(self, alerts: Sequence[apb.Alert]) -> list[apb.Alert]:
        out = []
        with self._transaction():
            for alert in alerts:
                stored = apb.Alert()
                stored.CopyFrom(alert)
                cursor = self._db.execute(
                    "INSERT INTO alerts (node, gpu, state, opened_id, payload) VALUES (?, ?, ?, ?, x'')",
                    (alert.node, alert.gpu, int(alert.state), int(alert.opened_id)),
                )
                stored.id = int(cursor.lastrowid or 0)
                if stored.state == apb.ALERT_STATE_OPEN and stored.opened_id == 0:
                    stored.opened_id = stored.id  # a new alert; an update names the one it updates
                self._db.execute(
                    "UPDATE alerts SET payload = ?, opened_id = ? WHERE id = ?",
                    (stored.SerializeToString(), stored.opened_id, stored.id),
                )
                out.append(stored)
        return out

    def read_after(
        self, after_id: int, nodes: Iterable[str] | None = None, limit: int = 1000, through: int | None = None
    ) -> list[apb.Alert]:
        """Events with id > after_id (and <= `through` when given), oldest first; only those of
        `nodes` when given."""
        wanted = sorted(set(nodes)) if nodes is not None else None
        query = "SELECT payload FROM alerts WHERE id > ?"
        args: list[object] = [after_id]
        if through is not None:
            query += " AND id <= ?"
            args.append(through)
        if wanted is not None:
            query += f" AND node IN ({','.join('?' * len(wanted))})"
            args += wanted
        query += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [apb.Alert.FromString(payload) for (payload,) in rows]

    def wait_beyond(self, after_id: int, timeout_s: float) -> bool:
        """Block until an event with id > after_id exists (True) or the timeout passes or the store
        closes (False)."""
        with self._appended:
            return self._appended.wait_for(lambda: self.last_id > after_id or self._closed, timeout_s) and (
                not self._closed
            )

    def get(self, alert_id: int) -> apb.Alert | None:
        if not 0 < alert_id <= MAX_STORED_INT:  # beyond SQLite's integers: no such event
            return None
        with self._lock:
            row = self._db.execute("SELECT payload FROM alerts WHERE id = ?", (alert_id,)).fetchone()
        return apb.Alert.FromString(row[0]) if row else None

    def open_alerts(self) -> list[apb.Alert]:
        """The latest OPEN event of each alert not yet CLEARED (an alert's events share opened_id),
        oldest event first."""
        with self._lock:
            return self._open_alerts()

    def _open_alerts(self) -> list[apb.Alert]:
        """open_alerts(), the lock held."""
        # Grouped rather than correlated subqueries: one pass over the log (a subscriber without a
        # cursor and every listing run this).
        rows = self._db.execute(
            "SELECT payload FROM alerts WHERE id IN (SELECT MAX(id) FROM alerts WHERE state = ? GROUP BY opened_id) "
            "AND opened_id NOT IN (SELECT opened_id FROM alerts WHERE state = ?) ORDER BY id",
            (apb.ALERT_STATE_OPEN, apb.ALERT_STATE_CLEARED),
        ).fetchall()
        return [apb.Alert.FromString(payload) for (payload,) in rows]

    def open_alerts_at_head(self, nodes: Iterable[str] | None = None) -> tuple[list[apb.Alert], int]:
        """`open_alerts()` (only those of `nodes` when given) and the log's head id, read together:
        every event after the head is newer than the listing, so a reader that goes on from the
        head misses nothing."""
        wanted = set(nodes) if nodes is not None else None
        with self._lock:  # append() commits and moves last_id under this lock
            head = self.last_id
            alerts = self._open_alerts()
        return [a for a in alerts if wanted is None or a.node in wanted], head

    def newest_event(self, opened_id: int) -> apb.Alert | None:
        """The newest event of the alert `opened_id` (its CLEARED event once it has cleared)."""
        with self._lock:
            row = self._db.execute(
                "SELECT payload FROM alerts WHERE opened_id = ? ORDER BY id DESC LIMIT 1", (opened_id,)
            ).fetchone()
        return apb.Alert.FromString(row[0]) if row else None

    def cleared_event(self, opened_id: int) -> apb.Alert | None:
        """The alert's CLEARED event, or None while it is open."""
        with self._lock:
            row = self._db.execute(
                "SELECT payload FROM alerts WHERE opened_id = ? AND state = ? ORDER BY id LIMIT 1",
                (opened_id, apb.ALERT_STATE_CLEARED),
            ).fetchone()
        return apb.Alert.FromString(row[0]) if row else None

    def cleared_reason(self, opened_id: int) -> str | None:
        """Why the alert cleared, or None while it is open."""
        event = self.cleared_event(opened_id)
        return event.cleared_reason if event is not None else None

    # -- jobs, acknowledgements, remediations ----------------------------------------------

    def register_job(self, job_id: str, nodes: Sequence[str]) -> None:
        with self._lock:
            self._checked_write(
                "jobs",
                lambda: self._db.execute(
                    "INSERT INTO jobs (job_id, nodes, registered_unix) VALUES (?, ?, ?) ON CONFLICT (job_id) "
                    "DO UPDATE SET nodes = excluded.nodes, registered_unix = excluded.registered_unix",
                    (job_id, json.dumps(sorted(set(nodes))), time.time()),
                ),
            )

    def jobs(self) -> dict[str, list[str]]:
        with self._lock:
            rows = self._db.execute("SELECT job_id, nodes FROM jobs").fetchall()
        return {job: list(json.loads(nodes)) for job, nodes in rows}

    def record_ack(self, ack: Ack) -> None:
        with self._lock:
            self._checked_write(
                "acks",
                lambda: self._db.execute(
                    "INSERT INTO acks (alert_id, job_id, action, step, checkpoint_uri, at_unix) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (ack.alert_id, ack.job_id, ack.action, ack.step, ack.checkpoint_uri, time.time()),
                ),
            )

    def acks(self, alert_id: int) -> list[Ack]:
        with self._lock:
            rows = self._db.execute(
                "SELECT alert_id, job_id, action, step, checkpoint_uri FROM acks WHERE alert_id = ? ORDER BY rowid",
                (alert_id,),
            ).fetchall()
        return [Ack(int(a), str(j), int(act), int(s), str(u)) for a, j, act, s, u in rows]

    def claim_remediation(self, alert_id: int, node: str, actuator: str, request: str = "") -> bool:
        """Mark the alert as being remediated, keeping `request` (what to do, for a restart to carry
        on); False when it already was (never drain twice)."""
        with self._lock:
            cursor = self._checked_write(
                "remediation",
                lambda: self._db.execute(
                    "INSERT OR IGNORE INTO remediations (alert_id, node, actuator, outcome, detail, at_unix, "
                    "request) VALUES (?, ?, ?, 'pending', '', ?, ?)",
                    (alert_id, node, actuator, time.time(), request),
                ),
            )
            return cursor.rowcount == 1

    def begin_attempt(self, alert_id: int, actuator: str) -> int:
        """Count one more attempt at a claimed remediation, before it is made; returns the count.

        Counted first so that an attempt the service is killed in still counts: an actuator that
        brings the service down cannot be retried forever across restarts."""
        with self._lock:  # no RETURNING: SQLite before 3.35 lacks it
            self._checked_write(
                "remediation",
                lambda: self._db.execute(
                    "UPDATE remediations SET attempts = attempts + 1, actuator = ? "
                    "WHERE alert_id = ? AND outcome = 'pending'",
                    (actuator, alert_id),
                ),
            )
            row = self._db.execute(
                "SELECT attempts FROM remediations WHERE alert_id = ? AND outcome = 'pending'", (alert_id,)
            ).fetchone()
        if row is None:
            raise KeyError(f"no pending remediation of alert {alert_id}")
        return int(row[0])

    def note_failed_attempt(self, alert_id: int, detail: str) -> None:
        """Keep why the last attempt failed while the remediation waits for its next one."""
        with self._lock:
            self._checked_write(
                "remediation",
                lambda: self._db.execute(
                    "UPDATE remediations SET detail = ?, at_unix = ? WHERE alert_id = ? AND outcome = 'pending'",
                    (detail, time.time(), alert_id),
                ),
            )

    def finish_remediation(self, alert_id: int, outcome: str, detail: str) -> None:
        with self._lock:
            self._checked_write(
                "remediation",
                lambda: self._db.execute(
                    "UPDATE remediations SET outcome = ?, detail = ?, at_unix = ? WHERE alert_id = ?",
                    (outcome, detail, time.time(), alert_id),
                ),
            )

    def pending_remediations(self) -> list[PendingRemediation]:
        """Remediations claimed and never finished, oldest alert first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT alert_id, node, request, attempts, detail FROM remediations "
                "WHERE outcome = 'pending' ORDER BY alert_id"
            ).fetchall()
        return [PendingRemediation(int(a), str(n), str(r), int(k), str(d)) for a, n, r, k, d in rows]

    def remediations_on(self, node: str) -> list[tuple[int, str]]:
        """(alert id, outcome) of every remediation claimed for `node`, oldest alert first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT alert_id, outcome FROM remediations WHERE node = ? ORDER BY alert_id", (node,)
            ).fetchall()
        return [(int(a), str(o)) for a, o in rows]

    def remediation(self, alert_id: int) -> tuple[str, str] | None:
        """(outcome, detail) of the alert's remediation, if one was claimed; outcome "pending" while
        it is being carried out or waits for a retry."""
        with self._lock:
            row = self._db.execute(
                "SELECT outcome, detail FROM remediations WHERE alert_id = ?", (alert_id,)
            ).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    # -- settings an admin changed at run time (they outlive a restart) -------------------

    def save_setting(self, key: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._checked_write(
                    "settings", lambda: self._db.execute("DELETE FROM settings WHERE key = ?", (key,))
                )
            else:
                self._checked_write(
                    "settings",
                    lambda: self._db.execute(
                        "INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", (key, value)
                    ),
                )

    def setting(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    # -- ingest cursors ---------------------------------------------------------------------

    def load_cursors(self) -> dict[tuple[str, int], int]:
        with self._lock:
            rows = self._db.execute("SELECT node, spool_id, last_sequence FROM cursors").fetchall()
        return {(str(n), int(s)): int(q) for n, s, q in rows}

    def save_cursors(self, cursors: dict[tuple[str, int], int]) -> None:
        """Store the highest sequence taken per (node, spool id), in one transaction; then each
        node keeps only its SPOOLS_PER_NODE most recently seen spools."""
        for (_, spool_id), sequence in cursors.items():
            if not (0 <= spool_id <= MAX_STORED_INT and 0 <= sequence <= MAX_STORED_INT):
                raise ValueError(f"cursor ({spool_id}, {sequence}) is beyond what the store keeps")
        if not cursors:
            return
        now = time.time()
        nodes = sorted({node for node, _ in cursors})

        def write() -> None:
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO cursors (node, spool_id, last_sequence, seen_unix) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (node, spool_id) DO UPDATE SET "
                    "last_sequence = MAX(last_sequence, excluded.last_sequence), seen_unix = excluded.seen_unix",
                    [(n, s, q, now) for (n, s), q in cursors.items()],
                )
                self._db.executemany(
                    "DELETE FROM cursors WHERE node = ? AND spool_id NOT IN (SELECT spool_id FROM cursors "
                    "WHERE node = ? ORDER BY seen_unix DESC, spool_id LIMIT ?)",
                    [(node, node, SPOOLS_PER_NODE) for node in nodes],
                )

        with self._lock:
            self._checked_write("cursors", write)
