"""Each node's saved scoring state, in the state database: the blob service/scoring_state.py makes,
with what it was saved under (the model's features and alert policy), the alert log's head and the
journal segment at that moment."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from faultcast.service.state.db import StateDatabase


@dataclass(frozen=True, slots=True)
class SavedState:
    """One node's saved state as stored."""

    node: str
    features: str  # the signature of the features it was computed with
    book: str  # the signature of the alert policy its alert state was kept under
    log_head: int  # the alert log's newest id when it was saved
    segment: int  # the journal segment being written when it was saved
    state: bytes


class SavedStates:
    """Upserts and reads of saved node states. Writes raise StateWriteError when refused."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def save(self, states: Sequence[SavedState]) -> None:
        """Store these states (one transaction), each replacing its node's earlier one."""
        if not states:
            return
        now = time.time()
        rows = [(s.node, s.features, s.book, s.log_head, s.segment, s.state, now) for s in states]

        def write(_: sqlite3.Connection) -> None:
            with self._db.transaction() as connection:
                connection.executemany(
                    "INSERT OR REPLACE INTO scoring_state (node, features, book, log_head, segment, state, "
                    "saved_unix) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )

        self._db.checked_write("scoring", write)

    def load(self) -> list[SavedState]:
        """Every node's saved state."""
        rows = self._db.read("SELECT node, features, book, log_head, segment, state FROM scoring_state")
        return [SavedState(str(n), str(f), str(b), int(h), int(s), bytes(st)) for n, f, b, h, s, st in rows]

    def clear(self) -> None:
        """Forget every saved state (the features changed: none of them can be taken back)."""
        self._db.checked_write("scoring", lambda db: db.execute("DELETE FROM scoring_state"))
