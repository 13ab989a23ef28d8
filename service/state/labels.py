"""The fleet's label log: every failure the service knows of and every operator's verdict on an alert,
each with where it came from, in the state database. Retraining learns from it
(service/training_labels.py turns it into the training format).

Failures come from four places (`LabelSource`): the service's own FAILED events on hardware evidence
(written in the same transaction as the event, service/state/alerts.py), harvested logs (`faultcast
failures`' kernel-log and Slurm failures, imported), and operators (a failure added by hand, or an alert
judged true). The log is append-only and idempotent per source: the same failure (source, node, GPU,
time, mode) is stored once, so importing a log twice adds nothing. Sources are not merged here: a kernel
log's Xid 79 and the FAILED event of the same Xid are two rows; the training export merges them.

Verdicts are appended too; an alert's newest verdict is the one that counts. A TRUE verdict also adds a
failure (source operator) naming the alert; a later FALSE verdict on it takes that failure back in the
export, never by deleting a row.
"""

from __future__ import annotations

import enum
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from faultcast.modes import FailureMode
from faultcast.service.state.db import MAX_STORED_INT, Row, StateDatabase
from faultcast.v1 import alerts_pb2 as apb

MAX_DETAIL_CHARS = 1024  # of a label's words; a log line or a drain reason is far shorter
SERVICE = "service"  # `recorded_by` of what the service recorded itself


class LabelSource(enum.StrEnum):
    """Where a failure label came from (the proto's LabelSource, by name)."""

    FAILURE_EVENT = "failure_event"
    KERNEL_LOG = "kernel_log"
    SLURM = "slurm"
    OPERATOR = "operator"
    HARVESTED = "harvested"


class Verdict(enum.StrEnum):
    """An operator's finding about an alert."""

    TRUE = "true"
    FALSE = "false"


@dataclass(frozen=True, slots=True)
class FailureLabel:
    """One failure: where (gpu -1: the node), what (mode None: the source does not say), when (event time
    on the node's clock), from where, and who recorded it when (id and recorded_* set once stored)."""

    node: str
    gpu: int
    mode: FailureMode | None
    time_ns: int
    source: LabelSource
    uuid: str = ""
    xid: int = 0
    detail: str = ""
    alert_id: int = 0  # the FAILED event it came from, or the alert a TRUE verdict confirmed
    evidence: str = ""  # a FAILED event's evidence (faultcast.failure_signs.Evidence value)
    recorded_by: str = SERVICE
    recorded_ns: int = 0
    id: int = 0

    def check(self) -> None:
        """ValueError naming what is wrong with a label from outside (an import, an operator)."""
        if not self.node or len(self.node) > 253:
            raise ValueError(f"a failure needs its node's name (1-253 characters), got {self.node!r:.80}")
        if self.gpu < -1 or self.gpu > 1023:
            raise ValueError(f"failure on {self.node}: gpu {self.gpu} is not an index (-1 for the node)")
        if not 0 < self.time_ns <= MAX_STORED_INT:
            raise ValueError(f"failure on {self.node}: its time ({self.time_ns} ns) is not a time")
        if not 0 <= self.xid < 2**31:
            raise ValueError(f"failure on {self.node}: xid {self.xid} is not an Xid code")


@dataclass(frozen=True, slots=True)
class AlertVerdict:
    """An operator's verdict on an alert (its opened id), as recorded."""

    alert_id: int
    verdict: Verdict
    why: str
    recorded_by: str
    recorded_ns: int
    id: int = 0


class LabelLog:
    """Failures and verdicts, appended; every write raises StateWriteError when the database refused it
    (nothing of it stored)."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def add(self, failures: Sequence[FailureLabel], by: str) -> tuple[int, int]:
        """Store failures (checked: ValueError before anything is written); (added, already there)."""
        for failure in failures:
            failure.check()
        now = time.time_ns()

        def write(db: sqlite3.Connection) -> int:
            with self._db.transaction():
                return insert_failures(db, failures, by, now)

        added = self._db.checked_write("labels", write)
        return added, len(failures) - added

    def judge(
        self, alert_id: int, verdict: Verdict, why: str, by: str, failure: FailureLabel | None
    ) -> tuple[AlertVerdict, FailureLabel | None]:
        """Record a verdict on the alert `alert_id` (its opened id), with the failure a TRUE verdict
        confirms, in one transaction; returns both as stored."""
        now = time.time_ns()
        why = why[:MAX_DETAIL_CHARS]
        if failure is not None:
            failure.check()

        def write(db: sqlite3.Connection) -> tuple[AlertVerdict, FailureLabel | None]:
            with self._db.transaction():
                cursor = db.execute(
                    "INSERT INTO alert_verdicts (alert_id, verdict, why, recorded_by, recorded_ns) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (alert_id, verdict.value, why, by, now),
                )
                stored_failure = None
                if failure is not None:
                    insert_failures(db, [failure], by, now)
                    stored_failure = _failure(
                        db.execute(
                            "SELECT node, gpu, mode, time_ns, source, uuid, xid, detail, alert_id, evidence, "
                            "recorded_by, recorded_ns, id FROM failure_labels "
                            "WHERE source = ? AND node = ? AND gpu = ? AND time_ns = ? AND mode = ?",
                            _key(failure),
                        ).fetchone()
                    )
            return AlertVerdict(alert_id, verdict, why, by, now, int(cursor.lastrowid or 0)), stored_failure

        return self._db.checked_write("labels", write)

    def failures(self, after_id: int = 0, limit: int | None = None) -> list[FailureLabel]:
        """Failures with an id above `after_id`, oldest id first (at most `limit`)."""
        rows = self._db.read(
            "SELECT node, gpu, mode, time_ns, source, uuid, xid, detail, alert_id, evidence, "
            "recorded_by, recorded_ns, id FROM failure_labels WHERE id > ? ORDER BY id LIMIT ?",
            (after_id, -1 if limit is None else limit),
        )
        return [_failure(r) for r in rows]

    def verdicts(self, after_id: int = 0, limit: int | None = None) -> list[AlertVerdict]:
        """Verdicts with an id above `after_id`, oldest first (at most `limit`)."""
        rows = self._db.read(
            "SELECT alert_id, verdict, why, recorded_by, recorded_ns, id FROM alert_verdicts WHERE id > ? "
            "ORDER BY id LIMIT ?",
            (after_id, -1 if limit is None else limit),
        )
        return [AlertVerdict(int(a), Verdict(v), str(w), str(b), int(r), int(i)) for a, v, w, b, r, i in rows]

    def newest_verdicts(self) -> dict[int, Verdict]:
        """Each judged alert's newest verdict."""
        rows = self._db.read(
            "SELECT alert_id, verdict FROM alert_verdicts WHERE id IN "
            "(SELECT MAX(id) FROM alert_verdicts GROUP BY alert_id)"
        )
        return {int(a): Verdict(v) for a, v in rows}


_FAILURE_COLUMNS = (
    "node, gpu, mode, time_ns, source, uuid, xid, detail, alert_id, recorded_by, recorded_ns, id"
)


def _key(failure: FailureLabel) -> tuple[object, ...]:
    mode = failure.mode.value if failure.mode is not None else ""
    return failure.source.value, failure.node, failure.gpu, failure.time_ns, mode


def insert_failures(db: sqlite3.Connection, failures: Iterable[FailureLabel], by: str, now_ns: int) -> int:
    """Insert failures on an open transaction (the caller's); returns how many were new."""
    added = 0
    for f in failures:
        cursor = db.execute(
            "INSERT OR IGNORE INTO failure_labels (node, gpu, uuid, mode, time_ns, xid, detail, source, "
            "alert_id, evidence, recorded_by, recorded_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                f.node,
                f.gpu,
                f.uuid,
                f.mode.value if f.mode is not None else "",
                f.time_ns,
                f.xid,
                f.detail[:MAX_DETAIL_CHARS],
                f.source.value,
                f.alert_id,
                f.evidence,
                by,
                now_ns,
            ),
        )
        added += cursor.rowcount
    return added


def _failure(row: Row | None) -> FailureLabel:
    if row is None:  # only after an insert that stored or found the row
        raise LookupError("a failure label just written is not in the log")
    node, gpu, mode, time_ns, source, uuid, xid, detail, alert_id, evidence, by, recorded, label_id = row
    return FailureLabel(
        node=str(node),
        gpu=int(gpu),
        mode=FailureMode(mode) if mode else None,
        time_ns=int(time_ns),
        source=LabelSource(source),
        uuid=str(uuid),
        xid=int(xid),
        detail=str(detail),
        alert_id=int(alert_id),
        evidence=str(evidence),
        recorded_by=str(by),
        recorded_ns=int(recorded),
        id=int(label_id),
    )


MODE_FROM_PB: dict[int, FailureMode] = {apb.FailureMode.Value(m.proto_name): m for m in FailureMode}
SOURCE_TO_PB: dict[LabelSource, apb.LabelSource.ValueType] = {
    s: apb.LabelSource.Value(f"LABEL_SOURCE_{s.name}") for s in LabelSource
}
SOURCE_FROM_PB = {v: k for k, v in SOURCE_TO_PB.items()}
VERDICT_TO_PB: dict[Verdict, apb.Verdict.ValueType] = {
    Verdict.TRUE: apb.VERDICT_TRUE,
    Verdict.FALSE: apb.VERDICT_FALSE,
}
VERDICT_FROM_PB = {v: k for k, v in VERDICT_TO_PB.items()}


EVIDENCE_FROM_PB: dict[int, str] = {
    value: name.removeprefix("FAILURE_EVIDENCE_").lower()
    for name, value in apb.FailureEvidence.items()
    if value != apb.FAILURE_EVIDENCE_UNSPECIFIED
}


def from_failed_event(event: apb.Alert) -> FailureLabel | None:
    """The label of a stored FAILED event on hardware evidence (one that takes its node out); None for
    any other event, and for a trainer's report or an Xid the catalogue answers with a restart: their
    cause may be software, and the model must not learn that healthy hardware fails."""
    if event.state != apb.ALERT_STATE_FAILED or not event.failure.drains_node:
        return None
    return FailureLabel(
        node=event.node,
        gpu=event.gpu,
        mode=MODE_FROM_PB.get(event.mode),
        time_ns=event.time_unix_nano,
        source=LabelSource.FAILURE_EVENT,
        uuid=event.gpu_uuid,
        xid=event.failure.xid,
        detail=event.failure.detail,
        alert_id=event.id,
        evidence=EVIDENCE_FROM_PB.get(event.failure.evidence, ""),
    )


def failure_to_pb(failure: FailureLabel) -> apb.FailureLabel:
    """A stored failure as the Admin API gives it."""
    return apb.FailureLabel(
        node=failure.node,
        gpu=failure.gpu,
        gpu_uuid=failure.uuid,
        mode=(
            apb.FailureMode.Value(failure.mode.proto_name)
            if failure.mode is not None
            else apb.FAILURE_MODE_UNSPECIFIED
        ),
        time_unix_nano=failure.time_ns,
        xid=failure.xid,
        detail=failure.detail,
        source=SOURCE_TO_PB[failure.source],
        id=failure.id,
        recorded_by=failure.recorded_by,
        recorded_unix_nano=failure.recorded_ns,
        alert_id=failure.alert_id,
        evidence=apb.FailureEvidence.Value(f"FAILURE_EVIDENCE_{failure.evidence.upper()}")
        if failure.evidence
        else apb.FAILURE_EVIDENCE_UNSPECIFIED,
    )


def failure_from_pb(message: apb.FailureLabel, default_source: LabelSource) -> FailureLabel:
    """A failure sent through AddFailures (its id, recorded_* and alert_id are the service's to set);
    ValueError naming what is wrong."""
    if message.mode and message.mode not in MODE_FROM_PB:
        raise ValueError(f"failure on {message.node}: unknown mode {message.mode}")
    source = SOURCE_FROM_PB.get(message.source, default_source) if message.source else default_source
    if source is LabelSource.FAILURE_EVENT:
        raise ValueError(
            "failures of source FAILURE_EVENT are the service's own; import logs as KERNEL_LOG, "
            "SLURM or HARVESTED, or add them as OPERATOR"
        )
    failure = FailureLabel(
        node=message.node,
        gpu=message.gpu,
        mode=MODE_FROM_PB.get(message.mode),
        time_ns=message.time_unix_nano,
        source=source,
        uuid=message.gpu_uuid,
        xid=message.xid,
        detail=message.detail,
    )
    failure.check()
    return failure


def verdict_to_pb(verdict: AlertVerdict) -> apb.AlertVerdict:
    """A stored verdict as the Admin API gives it."""
    return apb.AlertVerdict(
        alert_id=verdict.alert_id,
        verdict=VERDICT_TO_PB[verdict.verdict],
        why=verdict.why,
        recorded_by=verdict.recorded_by,
        recorded_unix_nano=verdict.recorded_ns,
        id=verdict.id,
    )
