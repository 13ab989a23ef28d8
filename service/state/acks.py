"""Acknowledgements of alerts by the jobs they concern (Acknowledge), in the state database."""

from __future__ import annotations

import time
from dataclasses import dataclass

from faultcast.service.state.db import StateDatabase


@dataclass(frozen=True, slots=True)
class Ack:
    """One job's acknowledgement of one alert event: what it did (an AckAction value), at which
    training step, and where its snapshot went."""

    alert_id: int
    job_id: str
    action: int
    step: int
    checkpoint_uri: str


class AckLog:
    """Every acknowledgement, in the order it came."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def record(self, ack: Ack) -> None:
        """Store an acknowledgement; StateWriteError when the database refused it."""
        self._db.checked_write(
            "acks",
            lambda db: db.execute(
                "INSERT INTO acks (alert_id, job_id, action, step, checkpoint_uri, at_unix) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (ack.alert_id, ack.job_id, ack.action, ack.step, ack.checkpoint_uri, time.time()),
            ),
        )

    def of(self, alert_id: int) -> list[Ack]:
        """The acknowledgements of the alert event `alert_id`, oldest first."""
        rows = self._db.read(
            "SELECT alert_id, job_id, action, step, checkpoint_uri FROM acks WHERE alert_id = ? ORDER BY rowid",
            (alert_id,),
        )
        return [Ack(int(a), str(j), int(act), int(s), str(u)) for a, j, act, s, u in rows]
