"""Ingest cursors: the highest sequence accepted per (node, spool id), in the state database, so a
collector's replay after a service restart is not taken twice."""

from __future__ import annotations

import sqlite3
import time

from faultcast.service.state_db import MAX_STORED_INT, StateDatabase

# Spool ids remembered per node: a collector keeps one for its life (a new one only when its spool
# is wiped); a caller opening streams with fresh ids must not grow the table without bound.
SPOOLS_PER_NODE = 8


class Cursors:
    """The cursors, saved in batches; each node keeps its SPOOLS_PER_NODE most recently seen spools."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def load(self) -> dict[tuple[str, int], int]:
        """Every stored cursor: (node, spool id) -> the highest sequence taken."""
        rows = self._db.read("SELECT node, spool_id, last_sequence FROM cursors")
        return {(str(n), int(s)): int(q) for n, s, q in rows}

    def save(self, cursors: dict[tuple[str, int], int]) -> None:
        """Store the highest sequence taken per (node, spool id), in one transaction; then each
        node keeps only its SPOOLS_PER_NODE most recently seen spools. ValueError for a value no
        SQLite integer holds; StateWriteError when the database refused them (none stored)."""
        for (_, spool_id), sequence in cursors.items():
            if not (0 <= spool_id <= MAX_STORED_INT and 0 <= sequence <= MAX_STORED_INT):
                raise ValueError(f"cursor ({spool_id}, {sequence}) is beyond what the store keeps")
        if not cursors:
            return
        now = time.time()
        nodes = sorted({node for node, _ in cursors})

        def write(_: sqlite3.Connection) -> None:
            with self._db.transaction() as db:
                db.executemany(
                    "INSERT INTO cursors (node, spool_id, last_sequence, seen_unix) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (node, spool_id) DO UPDATE SET "
                    "last_sequence = MAX(last_sequence, excluded.last_sequence), seen_unix = excluded.seen_unix",
                    [(n, s, q, now) for (n, s), q in cursors.items()],
                )
                db.executemany(
                    "DELETE FROM cursors WHERE node = ? AND spool_id NOT IN (SELECT spool_id FROM cursors "
                    "WHERE node = ? ORDER BY seen_unix DESC, spool_id LIMIT ?)",
                    [(node, node, SPOOLS_PER_NODE) for node in nodes],
                )

        self._db.checked_write("cursors", write)
