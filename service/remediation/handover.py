"""The hand-over of a job to its standby (service/remediation/spares/prescheduler.py) at the job's
snapshot: the remediation then drains the node and ends the old job instead of requeueing it
(`Remediation.handover_to`). The claim is on disk BEFORE the standby is told to go, so a restart or
the grace timer finds the hand-over, never a requeue beside the standby. Without a standby waiting,
on the grace timer's drain (no snapshot to hand over) or a DECLINED, the spare is released.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace

from faultcast.service.remediation.actuators import Remediation
from faultcast.service.remediation.records import Records
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareState


class HandOver:
    """Hands jobs over to the spares a `Prescheduler` readied (None: no spares, nothing to do)."""

    def __init__(self, prescheduler: Prescheduler | None, records: Records) -> None:
        self.prescheduler, self.records = prescheduler, records

    def release(self, job: str, why: str) -> None:
        """The job's spare is not needed (the job declined the alert)."""
        if self.prescheduler is not None:
            self.prescheduler.release(job, why)

    def at_snapshot(
        self,
        remediation: Remediation,
        step: int,
        *,
        grace: bool,
        admissible: Callable[[], bool],
        settle: Callable[[int], None],
    ) -> Remediation | None:
        """With a standby waiting for the job at this snapshot: the remediation that ends the job
        instead of requeueing it, claimed on disk. Returns None when there is no hand-over (the spare
        released), the claimed hand-over, or `remediation` itself (requeue still True) when the alert
        was claimed by another meanwhile. `admissible`: whether the node may go now (not paused, the
        breaker would let it); `settle`: forget the alert's grace timer once claimed."""
        job = remediation.job_id
        if self.prescheduler is None:
            return None
        if grace:
            self.prescheduler.release(job, "the node is drained without a snapshot to hand over")
            return None
        if not admissible():
            self.prescheduler.release(job, "remediation is paused or the circuit breaker is open")
            return None
        spare = self.prescheduler.reserve(job, remediation.checkpoint_uri)
        if spare is None:
            return None
        if spare.state != SpareState.RESERVED:  # handed over already, for another alert of the job
            return None
        handed = replace(remediation, requeue=False, handover_to=spare.standby_job)
        try:
            claimed = self.records.claim(handed)
        except sqlite3.OperationalError as exc:
            self.records.trouble(exc)
            self.prescheduler.unreserve(spare, "the hand-over could not be recorded (state database)")
            return None
        if not claimed:
            self.prescheduler.unreserve(spare, "the alert was claimed by another remediation")
            return remediation
        settle(handed.alert_id)
        self.prescheduler.go(spare, handed.alert_id, step, handed.checkpoint_uri)
        return handed
