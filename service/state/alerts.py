"""The durable alert log: every OPEN, CLEARED and FAILED event, in the state database.

Ids come from SQLite's AUTOINCREMENT, seeded from the clock at every open (service/state/db.py):
never reused, so they increase across restarts, and a subscriber resumes after the last id it saw
with no gap.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence

from faultcast.service.state.db import MAX_STORED_INT, Row, StateDatabase
from faultcast.service.state.labels import SERVICE, from_failed_event, insert_failures
from faultcast.v1 import alerts_pb2 as apb

# Events that start an alert of their own: an OPENED event, and a FAILED event (an alert in one event).
_STARTS = (apb.ALERT_STATE_OPEN, apb.ALERT_STATE_FAILED)


class AlertLog:
    """Append-only alert events; readers wait for new ones with `wait_beyond`."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db
        row = db.read_one("SELECT COALESCE(MAX(id), 0) FROM alerts")
        self.last_id: int = int(row[0]) if row else 0

    def append(self, alerts: Sequence[apb.Alert], *, held: bool = True) -> list[apb.Alert]:
        """Store events in one transaction; returns them with their ids set (and an OPEN event's
        opened_id set to its own id). StateWriteError when the database refused them (none stored).
        `held`: the caller holds them and retries (the alert book), so the database counts as
        refusing writes until events are stored again; False for a caller that answers at once (a
        trainer's report), after which any write that works will do."""
        with self._db.lock:
            if held:
                out = self._db.checked_write_locked("alerts", lambda _: self._insert(alerts))
            else:
                out = self._db.checked_write_locked("reports", lambda _: self._insert(alerts))
            if out:
                self.last_id = out[-1].id
                self._db.changed.notify_all()
        return out

    def _insert(self, alerts: Sequence[apb.Alert]) -> list[apb.Alert]:
        out = []
        with self._db.transaction() as db:
            for alert in alerts:
                stored = apb.Alert()
                stored.CopyFrom(alert)
                cursor = db.execute(
                    "INSERT INTO alerts (node, gpu, state, opened_id, payload) VALUES (?, ?, ?, ?, x'')",
                    (alert.node, alert.gpu, int(alert.state), int(alert.opened_id)),
                )
                stored.id = int(cursor.lastrowid or 0)
                if stored.state in _STARTS and stored.opened_id == 0:
                    stored.opened_id = stored.id  # a new alert; an update names the one it updates
                db.execute(
                    "UPDATE alerts SET payload = ?, opened_id = ? WHERE id = ?",
                    (stored.SerializeToString(), stored.opened_id, stored.id),
                )
                label = from_failed_event(stored)
                if label is not None:  # the fleet's label log holds it as surely as the event
                    insert_failures(db, [label], SERVICE, time.time_ns())
                out.append(stored)
        return out

    def newest_by_node(self) -> dict[str, int]:
        """The id of each node's newest event of a predicted alert (FAILED events, which no replay of
        scores derives again, left out)."""
        rows = self._db.read(
            "SELECT node, MAX(id) FROM alerts WHERE state != ? GROUP BY node", (apb.ALERT_STATE_FAILED,)
        )
        return {str(node): int(newest) for node, newest in rows}

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
        return _alerts(self._db.read(query, args))

    def wait_beyond(self, after_id: int, timeout_s: float) -> bool:
        """Block until an event with id > after_id exists (True) or the timeout passes or the store
        closes (False)."""
        db = self._db
        with db.changed:
            return (
                db.changed.wait_for(lambda: self.last_id > after_id or db.closed, timeout_s) and not db.closed
            )

    def get(self, alert_id: int) -> apb.Alert | None:
        """The event with this id, or None (also for an id no SQLite integer holds)."""
        if not 0 < alert_id <= MAX_STORED_INT:  # beyond SQLite's integers: no such event
            return None
        row = self._db.read_one("SELECT payload FROM alerts WHERE id = ?", (alert_id,))
        return _alert(row)

    def open_now(self) -> list[apb.Alert]:
        """The latest OPEN event of each alert not yet CLEARED (an alert's events share opened_id),
        oldest event first."""
        with self._db.lock:
            return self._open_now(self._db.connection)

    @staticmethod
    def _open_now(db: sqlite3.Connection) -> list[apb.Alert]:
        """open_now(), the lock held."""
        # Grouped rather than correlated subqueries: one pass over the log (a subscriber without a
        # cursor and every listing run this).
        rows = db.execute(
            "SELECT payload FROM alerts WHERE id IN (SELECT MAX(id) FROM alerts WHERE state = ? GROUP BY opened_id) "
            "AND opened_id NOT IN (SELECT opened_id FROM alerts WHERE state = ?) ORDER BY id",
            (apb.ALERT_STATE_OPEN, apb.ALERT_STATE_CLEARED),
        ).fetchall()
        return _alerts(rows)

    def open_at_head(self, nodes: Iterable[str] | None = None) -> tuple[list[apb.Alert], int]:
        """`open_now()` (only those of `nodes` when given) and the log's head id, read together:
        every event after the head is newer than the listing, so a reader that goes on from the
        head misses nothing."""
        wanted = set(nodes) if nodes is not None else None
        with self._db.lock:  # append() commits and moves last_id under this lock
            head = self.last_id
            alerts = self._open_now(self._db.connection)
        return [a for a in alerts if wanted is None or a.node in wanted], head

    def failures(self, limit: int = 1000) -> list[apb.Alert]:
        """The newest FAILED events (at most `limit`), oldest first."""
        rows = self._db.read(
            "SELECT payload FROM (SELECT id, payload FROM alerts WHERE state = ? ORDER BY id DESC LIMIT ?) "
            "ORDER BY id",
            (apb.ALERT_STATE_FAILED, limit),
        )
        return _alerts(rows)

    def newest_event(self, opened_id: int) -> apb.Alert | None:
        """The newest event of the alert `opened_id` (its CLEARED event once it has cleared)."""
        row = self._db.read_one(
            "SELECT payload FROM alerts WHERE opened_id = ? ORDER BY id DESC LIMIT 1", (opened_id,)
        )
        return _alert(row)

    def cleared_event(self, opened_id: int) -> apb.Alert | None:
        """The alert's CLEARED event, or None while it is open."""
        row = self._db.read_one(
            "SELECT payload FROM alerts WHERE opened_id = ? AND state = ? ORDER BY id LIMIT 1",
            (opened_id, apb.ALERT_STATE_CLEARED),
        )
        return _alert(row)

    def cleared_reason(self, opened_id: int) -> str | None:
        """Why the alert cleared, or None while it is open."""
        event = self.cleared_event(opened_id)
        return event.cleared_reason if event is not None else None


def _alert(row: Row | None) -> apb.Alert | None:
    return apb.Alert.FromString(row[0]) if row else None


def _alerts(rows: Iterable[Row]) -> list[apb.Alert]:
    return [apb.Alert.FromString(payload) for (payload,) in rows]
