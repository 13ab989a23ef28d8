"""The remediation ledger: one row per alert, never claimed twice, in the state database.

A row stays `pending` with its request and attempt count until it is finished, so one that a killed
service left unfinished is found and carried on at the next start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from faultcast.service.state.db import StateDatabase


@dataclass(frozen=True, slots=True)
class PendingRemediation:
    """A remediation claimed and not finished: retrying, or cut off by the service being killed."""

    alert_id: int
    node: str
    request: str  # what the remediator stored at the claim ("" from a version that stored nothing)
    attempts: int  # attempts begun, the last perhaps interrupted
    detail: str  # why the last finished attempt failed ("" before any did)


class RemediationLedger:
    """Claims, attempts and outcomes of remediations. Every write raises StateWriteError when the
    database refused it (nothing of it stored)."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def claim(
        self, alert_id: int, node: str, actuator: str, request: str = "", *, at_unix: float | None = None
    ) -> bool:
        """Mark the alert as being remediated, keeping `request` (what to do, for a restart to carry
        on); False when it already was (never drain twice)."""
        cursor = self._db.checked_write(
            "remediation",
            lambda db: db.execute(
                "INSERT OR IGNORE INTO remediations (alert_id, node, actuator, outcome, detail, at_unix, "
                "request) VALUES (?, ?, ?, 'pending', '', ?, ?)",
                (alert_id, node, actuator, at_unix or time.time(), request),
            ),
        )
        return cursor.rowcount == 1

    def request_of(self, alert_id: int) -> str:
        """The request stored with the alert's claim ("" when none is stored or it was never claimed)."""
        row = self._db.read_one("SELECT request FROM remediations WHERE alert_id = ?", (alert_id,))
        return str(row[0] or "") if row else ""

    def handed_over_from(self, job_id: str) -> str:
        """The job that was handed over to the standby `job_id` (the newest claim naming it), "" when
        none was."""
        row = self._db.read_one(
            "SELECT json_extract(request, '$.job_id') FROM remediations WHERE json_valid(request) "
            "AND json_extract(request, '$.handover_to') = ? ORDER BY at_unix DESC LIMIT 1",
            (job_id,),
        )
        return str(row[0] or "") if row else ""

    def predecessors(self, job_id: str, limit: int = 16) -> list[str]:
        """The jobs `job_id` carries on through hand-overs to standbys, nearest first (at most `limit`:
        a chain of standbys each taking the last one over)."""
        chain: list[str] = []
        while len(chain) < limit:
            before = self.handed_over_from(chain[-1] if chain else job_id)
            if not before or before == job_id or before in chain:
                break
            chain.append(before)
        return chain

    def begin_attempt(self, alert_id: int, actuator: str) -> int:
        """Count one more attempt at a claimed remediation, before it is made; returns the count
        (KeyError when the alert has no pending remediation).

        Counted first so that an attempt the service is killed in still counts: an actuator that
        brings the service down cannot be retried forever across restarts."""
        with self._db.lock:  # no RETURNING: SQLite before 3.35 lacks it
            self._db.checked_write_locked(
                "remediation",
                lambda db: db.execute(
                    "UPDATE remediations SET attempts = attempts + 1, actuator = ? "
                    "WHERE alert_id = ? AND outcome = 'pending'",
                    (actuator, alert_id),
                ),
            )
            row = self._db.connection.execute(
                "SELECT attempts FROM remediations WHERE alert_id = ? AND outcome = 'pending'", (alert_id,)
            ).fetchone()
        if row is None:
            raise KeyError(f"no pending remediation of alert {alert_id}")
        return int(row[0])

    def note_failed_attempt(self, alert_id: int, detail: str, *, at_unix: float | None = None) -> None:
        """Keep why the last attempt failed while the remediation waits for its next one."""
        self._db.checked_write(
            "remediation",
            lambda db: db.execute(
                "UPDATE remediations SET detail = ?, at_unix = ? WHERE alert_id = ? AND outcome = 'pending'",
                (detail, at_unix or time.time(), alert_id),
            ),
        )

    def finish(self, alert_id: int, outcome: str, detail: str, *, at_unix: float | None = None) -> None:
        """Record how the remediation ended (`outcome` other than "pending"); `at_unix`: when, by the
        remediator's wall clock (the time.time() of now by default)."""
        self._db.checked_write(
            "remediation",
            lambda db: db.execute(
                "UPDATE remediations SET outcome = ?, detail = ?, at_unix = ? WHERE alert_id = ?",
                (outcome, detail, at_unix or time.time(), alert_id),
            ),
        )

    def pending(self) -> list[PendingRemediation]:
        """Remediations claimed and never finished, oldest alert first."""
        rows = self._db.read(
            "SELECT alert_id, node, request, attempts, detail FROM remediations "
            "WHERE outcome = 'pending' ORDER BY alert_id"
        )
        return [PendingRemediation(int(a), str(n), str(r), int(k), str(d)) for a, n, r, k, d in rows]

    def on_node(self, node: str) -> list[tuple[int, str]]:
        """(alert id, outcome) of every remediation claimed for `node`, oldest alert first."""
        rows = self._db.read(
            "SELECT alert_id, outcome FROM remediations WHERE node = ? ORDER BY alert_id", (node,)
        )
        return [(int(a), str(o)) for a, o in rows]

    def taken_out_since(self, node: str, since_unix: float) -> list[int]:
        """The alerts `node` was taken out for (or is being) that were claimed or finished at or
        after `since_unix`, oldest first."""
        rows = self._db.read(
            "SELECT alert_id FROM remediations WHERE node = ? AND outcome IN ('pending', 'ok') "
            "AND at_unix >= ? ORDER BY alert_id",
            (node, since_unix),
        )
        return [int(a) for (a,) in rows]

    def succeeded(self) -> list[tuple[int, str]]:
        """(alert id, node) of every remediation that took its node out (outcome ok), oldest first."""
        rows = self._db.read("SELECT alert_id, node FROM remediations WHERE outcome = 'ok' ORDER BY alert_id")
        return [(int(a), str(n)) for a, n in rows]

    def of(self, alert_id: int) -> tuple[str, str] | None:
        """(outcome, detail) of the alert's remediation, if one was claimed; outcome "pending" while
        it is being carried out or waits for a retry."""
        row = self._db.read_one("SELECT outcome, detail FROM remediations WHERE alert_id = ?", (alert_id,))
        return (str(row[0]), str(row[1])) if row else None
