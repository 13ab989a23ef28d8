"""The state database's one connection, shared by every part of the state (service/state/store.py).

Opening refuses a damaged database rather than take it for a fresh one: a file that is empty,
unreadable, fails SQLite's quick check, lacks the alert log, or is missing while its write-ahead
log is there raises `StateError`, one line naming the file and what to do. While the disk is full or
unavailable at start the refusal says so (the database was not found damaged). At every open the
next alert id is at least the microseconds since the Unix epoch, so ids never go backwards, even
across a database replaced by a new one or restored from a backup.

WAL with synchronous=FULL: what a reader has seen is on disk first. One lock guards the connection;
`transaction` is the one way to write several rows, rolled back on any error, and `checked_write`
turns a failure of the disk into `StateWriteError` and tracks, per kind of write, whether the
database takes writes (`writable`, `on_writable`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

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
CREATE TABLE IF NOT EXISTS scoring_state (
    node TEXT PRIMARY KEY,
    features TEXT NOT NULL,
    book TEXT NOT NULL,
    log_head INTEGER NOT NULL,
    segment INTEGER NOT NULL,
    state BLOB NOT NULL,
    saved_unix REAL NOT NULL
);
-- The fleet's label log (service/state/labels.py).
CREATE TABLE IF NOT EXISTS failure_labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    uuid TEXT NOT NULL,
    mode TEXT NOT NULL,
    time_ns INTEGER NOT NULL,
    xid INTEGER NOT NULL,
    detail TEXT NOT NULL,
    source TEXT NOT NULL,
    alert_id INTEGER NOT NULL,
    evidence TEXT NOT NULL,
    recorded_by TEXT NOT NULL,
    recorded_ns INTEGER NOT NULL,
    UNIQUE (source, node, gpu, time_ns, mode)
);
CREATE INDEX IF NOT EXISTS failure_labels_time ON failure_labels (time_ns);
CREATE TABLE IF NOT EXISTS alert_verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    alert_id INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    why TEXT NOT NULL,
    recorded_by TEXT NOT NULL,
    recorded_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_verdicts_alert ON alert_verdicts (alert_id, id);
-- The model registry's log (service/state/models.py): what was added, promoted, rolled back.
CREATE TABLE IF NOT EXISTS model_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    model_id TEXT NOT NULL,
    from_model_id TEXT NOT NULL,
    recorded_by TEXT NOT NULL,
    why TEXT NOT NULL,
    detail TEXT NOT NULL,
    recorded_ns INTEGER NOT NULL
);
-- The shadow's scored steps: per node and step, the highest GPU risk of each model (service/shadow.py).
CREATE TABLE IF NOT EXISTS shadow_steps (
    challenger TEXT NOT NULL,
    node TEXT NOT NULL,
    time_ns INTEGER NOT NULL,
    serving_risk REAL,
    challenger_risk REAL,
    PRIMARY KEY (challenger, node, time_ns)
);
CREATE INDEX IF NOT EXISTS shadow_steps_time ON shadow_steps (time_ns);
"""


# Columns later versions added to a table, for databases an earlier version created.
_ADDED_COLUMNS = {
    "remediations": (
        ("request", "TEXT NOT NULL DEFAULT ''"),
        ("attempts", "INTEGER NOT NULL DEFAULT 0"),
    ),
    "cursors": (("seen_unix", "REAL NOT NULL DEFAULT 0"),),
    "jobs": (
        ("replaces_nodes", "INTEGER NOT NULL DEFAULT 0"),
        ("stands_by", "INTEGER NOT NULL DEFAULT 0"),
    ),
}
# The largest integer SQLite stores (signed 64 bits): anything from the wire above it is refused at
# the edge, before it can reach a write.
MAX_STORED_INT = 2**63 - 1

T = TypeVar("T")
# A row as sqlite3 gives it: each value an int, float, str, bytes or None, as the column holds.
Row: TypeAlias = tuple[Any, ...]

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

OnWritable = Callable[[bool, str], None]
OnWriteFailed = Callable[[str], None]


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


def _connect(path: Path) -> sqlite3.Connection:
    """Open (or create) the database, refusing one that is damaged (StateError)."""
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
            tables = {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
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


class StateDatabase:
    """The open database: one connection behind `lock`, and whether it takes writes.

    `connection` is used only with `lock` held. `changed` (a condition on `lock`) is notified when
    alert events are appended and when the database closes."""

    def __init__(
        self,
        path: Path,
        *,
        on_writable: OnWritable | None = None,
        on_write_failed: OnWriteFailed | None = None,
    ) -> None:
        """Open (or create) the database at `path`; raises StateError when it exists and cannot be
        used. See `StateStore` for the two callbacks."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.on_writable, self.on_write_failed = on_writable, on_write_failed
        self.writable = True  # False while some kind of write (`what`) fails and has not since worked
        self._failing: set[str] = set()
        self.connection = _connect(path)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closed = False

    def close(self) -> None:
        """Close the connection and wake whoever waits on `changed`."""
        with self.lock:
            self.closed = True
            self.changed.notify_all()
            self.connection.close()

    def read(self, query: str, args: tuple[object, ...] | list[object] = ()) -> list[Row]:
        """Every row of a query, the lock taken."""
        with self.lock:
            return list(self.connection.execute(query, args).fetchall())

    def read_one(self, query: str, args: tuple[object, ...] = ()) -> Row | None:
        """The first row of a query (None without one), the lock taken."""
        with self.lock:
            row: Row | None = self.connection.execute(query, args).fetchone()
        return row

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (an exception of the caller's code
        too): nothing may leave the shared connection inside a transaction. The lock must be held."""
        db = self.connection
        if db.in_transaction:  # never expected; a leftover would poison every later write
            db.execute("ROLLBACK")
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def checked_write(self, what: str, write: Callable[[sqlite3.Connection], T]) -> T:
        """`checked_write_locked`, the lock taken."""
        with self.lock:
            return self.checked_write_locked(what, write)

    def checked_write_locked(self, what: str, write: Callable[[sqlite3.Connection], T]) -> T:
        """Run `write` on the connection (the lock held); a failure of the database becomes
        StateWriteError and is reported to `on_writable`, as is the recovery once every kind of
        write that failed worked."""
        try:
            result = write(self.connection)
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

    def probe(self) -> None:
        """While only writes their callers retry have failed (a report, a job: nobody holds them),
        try a small write of its own: no later write might come for a long time, and the database
        would count as refusing all that while. What the service holds waits for its own kind."""
        with self.lock:
            if self._failing != {_ANY}:
                return
            with contextlib.suppress(StateWriteError):  # still refused: reported; tried at the next probe
                self.checked_write_locked(
                    "probe",
                    lambda db: db.execute(
                        "INSERT INTO settings (key, value) VALUES ('writes_probed_unix', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (str(time.time()),),
                    ),
                )

    def _writable(self, why: str) -> None:
        writable = not self._failing
        if writable == self.writable:
            return
        self.writable = writable
        if self.on_writable is not None:
            self.on_writable(writable, why)
