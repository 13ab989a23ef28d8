"""Ingest cursors: the highest sequence accepted per (node, spool id), in the state database, so a
collector's replay after a service restart is not taken twice.

A spool id is any unsigned 64-bit number (a collector draws it at random); SQLite holds signed 64-bit
integers, so ids from 2^63 up are stored as their two's complement (negative) and read back from it.
Ids below 2^63 are stored as they are, so cursors written before ids above it were taken read the same.
"""

from __future__ import annotations

import sqlite3
import time

from faultcast.service.state.db import MAX_STORED_INT, StateDatabase

# Spool ids remembered per node: a collector keeps one for its life (a new one only when its spool
# is wiped); a caller opening streams with fresh ids must not grow the table without bound.
SPOOLS_PER_NODE = 8
SPOOL_ID_RANGE = 2**64  # spool_id is a uint64 on the wire


def stored_spool_id(spool_id: int) -> int:
    """The signed 64-bit integer SQLite keeps for an unsigned 64-bit spool id."""
    if not 0 <= spool_id < SPOOL_ID_RANGE:
        raise ValueError(f"spool id {spool_id} is not an unsigned 64-bit number")
    return spool_id - SPOOL_ID_RANGE if spool_id > MAX_STORED_INT else spool_id


def spool_id_from_stored(value: int) -> int:
    """The spool id a stored integer stands for (stored_spool_id's inverse)."""
    return value + SPOOL_ID_RANGE if value < 0 else value


class Cursors:
    """The cursors, saved in batches; each node keeps its SPOOLS_PER_NODE most recently seen spools."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def load(self) -> dict[tuple[str, int], int]:
        """Every stored cursor: (node, spool id) -> the highest sequence taken."""
        rows = self._db.read("SELECT node, spool_id, last_sequence FROM cursors")
        return {(str(n), spool_id_from_stored(int(s))): int(q) for n, s, q in rows}

    def save(self, cursors: dict[tuple[str, int], int]) -> None:
        """Store the highest sequence taken per (node, spool id), in one transaction; then each
        node keeps only its SPOOLS_PER_NODE most recently seen spools. ValueError for a value no
        SQLite integer holds; StateWriteError when the database refused them (none stored)."""
        rows = []
        for (node, spool_id), sequence in cursors.items():
            if not (0 <= spool_id < SPOOL_ID_RANGE and 0 <= sequence <= MAX_STORED_INT):
                raise ValueError(f"cursor ({spool_id}, {sequence}) is beyond what the store keeps")
            rows.append((node, stored_spool_id(spool_id), sequence))
        if not rows:
            return
        now = time.time()
        nodes = sorted({node for node, _ in cursors})

        def write(_: sqlite3.Connection) -> None:
            with self._db.transaction() as db:
                db.executemany(
                    "INSERT INTO cursors (node, spool_id, last_sequence, seen_unix) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (node, spool_id) DO UPDATE SET "
                    "last_sequence = MAX(last_sequence, excluded.last_sequence), seen_unix = excluded.seen_unix",
                    [(n, s, q, now) for n, s, q in rows],
                )
                db.executemany(
                    "DELETE FROM cursors WHERE node = ? AND spool_id NOT IN (SELECT spool_id FROM cursors "
                    "WHERE node = ? ORDER BY seen_unix DESC, spool_id LIMIT ?)",
                    [(node, node, SPOOLS_PER_NODE) for node in nodes],
                )

        self._db.checked_write("cursors", write)
