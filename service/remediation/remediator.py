"""When to take a node out: an alert (one incident, all its events sharing opened_id) whose newest
event recommends snapshot-and-migrate, on a node that runs a registered job, is remediated once the
job acknowledges it with SNAPSHOT_DONE (its state is safe), or once `grace_s` passes after the first
such event with no SNAPSHOT_DONE (the hardware must go anyway; the job restarts from its last
checkpoint) unless the alert cleared because the risk fell. A DECLINED acknowledgement leaves the
node to the operator; a SNAPSHOT_DONE for a snapshot-only alert is noted and the node stays.

A FAILED event (a failure that happened, with hardware evidence) on a node that runs a registered job
is remediated at once, as a grace timer already due: the node is drained and the job requeued from
its last checkpoint, unless the node is already being taken out (for the alert that foresaw it).

One incident, one drain: each alert is claimed once, across restarts, whatever its updates; an
acknowledgement of any of its events counts for the alert; and a node already being drained for
another alert still open is not drained again. The circuit breaker caps nodes per window; actuators
run on a worker thread so a slow scheduler never holds up scoring.

With a `Prescheduler` (service/remediation/spares/prescheduler.py), a SNAPSHOT_DONE with a standby
waiting for the job hands the job over: the standby goes on from that snapshot, and the remediation
drains the node and ends the old job instead of requeueing it (`Remediation.handover_to`). Without a
standby waiting, or on the grace timer's drain (no snapshot to hand over) or a DECLINED, the spare is released.

A failed attempt (an exception or an outcome not ok) is tried again after a backoff (`RetryPolicy`),
scheduled like the grace timers so other remediations go on meanwhile; the breaker counts the node
once, when it first admits it. After the last attempt the remediation is "failed". The claim and
each attempt are on disk first, so a service killed mid-remediation carries it on at the next
start (`resume`), with the attempts it already made counted: the actuator may then see one alert
twice (the kill came after it acted, before the outcome was stored), which actuators tolerate.

A restart keeps the rest too, in the store's settings in wall-clock time (the monotonic clock
means nothing to the next process): the breaker's window, written before the actuator runs, so a
crash loop cannot take out more nodes than one run may; and each grace deadline, so the drain comes
at opened + grace whatever restarts came between, at once if it passed while the service was down.

A write the store refuses (full disk, I/O error) stops nothing for good: it is counted, the work
is kept (a claim, breaker admission or attempt count not written means the actuator has not run; an
outcome not written is written later, the drain not repeated) and tried again every
`store_retry_s` until the store takes writes.

The parts: `policy` decides (no I/O), `records` reads and writes the state store, `worker` runs the
actuator on its thread, `handover` hands jobs to their standbys; `Remediator` takes the inputs
(alerts, acknowledgements, jobs, the pause) and joins them.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation import policy
from faultcast.service.remediation.actuators import Actuator, CircuitBreaker, Remediation, RetryPolicy
from faultcast.service.remediation.handover import HandOver
from faultcast.service.remediation.policy import GraceStep
from faultcast.service.remediation.records import (
    BREAKER_WINDOW_KEY,
    GRACE_DEADLINES_KEY,
    Records,
)
from faultcast.service.remediation.spares.prescheduler import Prescheduler
from faultcast.service.remediation.worker import Steps, Task, Worker
from faultcast.service.state.acks import Ack
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb

__all__ = ["BREAKER_WINDOW_KEY", "GRACE_DEADLINES_KEY", "Remediator"]

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Remediator:
    """Decides when an alert's node is taken out and has the actuator do it, once per alert,
    behind the circuit breaker, retried with backoff, carried across restarts (the state store)."""

    def __init__(
        self,
        store: StateStore,
        actuator: Actuator,
        metrics: ServiceMetrics,
        *,
        grace_s: float = 300.0,
        breaker: CircuitBreaker | None = None,
        retry: RetryPolicy | None = None,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        rng: random.Random | None = None,
        store_retry_s: float = 1.0,
        prescheduler: Prescheduler | None = None,
        incident_s: float = 3600.0,
    ) -> None:
        """`clock` times everything in this process; `wall` dates what is kept for the next one.
        `store_retry_s`: how soon work the store refused to record is tried again. `prescheduler`:
        the spares readied during alerts, handed the job at its snapshot (None: none are).
        `incident_s`: a node taken out within this long is not taken out again (one incident, one
        drain: its jobs were requeued once; repair takes longer); a failure stored within it and
        never remediated (a kill came between) is remediated at the next start."""
        if incident_s <= 0:
            raise ValueError(f"incident_s must be positive, got {incident_s}")
        self.incident_s = incident_s
        self.actuator, self.grace_s, self.clock, self.wall = actuator, grace_s, clock, wall
        self.breaker = breaker or CircuitBreaker()
        self.records = Records(store, actuator.name, clock=clock, wall=wall, store_retry_s=store_retry_s)
        # Who paused remediation (SetRemediation), None while it runs; kept across restarts.
        self.paused_by: str | None = self.records.paused_by()
        self._pause_dirty = False  # paused_by changed since it was last written
        self.retry = retry or RetryPolicy()
        self._cv = threading.Condition()  # guards the timers, the worker's queues and what is below
        self._timers = policy.GraceTimers()
        self._draining: dict[str, int] = {}  # node -> the alert it was last taken out for
        self._replacing: set[str] = set()  # jobs that replace their nodes themselves: never requeued
        self._waiting: set[int] = set()  # failures whose node's drain under way has no outcome yet
        # What jobs asked for at registration is on disk: a restart neither requeues a job that
        # replaces its nodes nor forgets which jobs can stand by.
        for job, flags in store.jobs.flags().items():
            if flags.replaces_nodes:
                self._replacing.add(job)
            if prescheduler is not None and flags.stands_by:
                prescheduler.note_job(job, stands_by=True)
        self._resumed = False
        self.handover = HandOver(prescheduler, self.records)
        steps = Steps(
            claim=self._claim,
            admit=self._admit,
            fire=self._fire,
            resume=self.resume,
            save_settings=self._save_settings,
        )
        self.worker = Worker(
            self.records,
            actuator,
            metrics,
            self._timers,
            self._cv,
            steps,
            retry=self.retry,
            rng=rng or random.Random(),  # noqa: S311 (jitter, not cryptography)
            clock=clock,
        )
        self.records.restore_breaker(self.breaker)
        self.records.restore_grace(self._timers, grace_s)
        # Every outcome exists from the start, so the first failure shows in increase().
        for outcome in ("ok", "failed", "refused", "joined"):
            metrics.remediations.labels(actuator.name, outcome)
        metrics.circuit_open.set_function(lambda: 1.0 if self.breaker.is_open(self.clock()) else 0.0)
        metrics.remediation_retries_pending.set_function(lambda: float(self.worker.retries_pending()))

    @property
    def done(self) -> list[tuple[Remediation, str, str]]:
        """(what, outcome, detail) of each remediation carried out, in order."""
        return self.worker.done

    # -- what a restart keeps -----------------------------------------------------------------

    def set_paused(self, by: str | None) -> None:
        """Pause remediation (`by` whom) or resume it (None): in force at once, even while the store
        refuses writes (a pause is what an admin reaches for in an incident); kept across restarts
        as soon as the store takes it, the worker trying again until then."""
        with self._cv:
            self.paused_by = by
            self._pause_dirty = True
        self._save_pause()

    def _save_pause(self) -> None:
        """Write who paused when it changed; kept to be written later when refused."""
        with self.records.save_lock:  # one writer at a time, each writing the newest value
            with self._cv:
                if not self._pause_dirty:
                    return
                self._pause_dirty = False
                value = self.paused_by
            if not self.records.save_pause(value):
                with self._cv:
                    self._pause_dirty = True
                    self.worker.retry_store_later()

    def _save_grace(self) -> None:
        """Write the grace deadlines when they changed; kept to be written later when refused."""
        with self.records.save_lock:
            with self._cv:
                if not self._timers.take_dirty():
                    return
                due = self._timers.on_disk(self.clock(), self.wall())
            if not self.records.save_grace(due):
                with self._cv:
                    self._timers.mark_dirty()
                    self.worker.retry_store_later()

    def _save_settings(self) -> None:
        self._save_grace()
        self._save_pause()

    def _settle(self, opened_id: int) -> None:
        """The alert's grace timer has nothing left to do: forget its deadline."""
        with self._cv:
            self._timers.settle(opened_id)

    # -- inputs -----------------------------------------------------------------------------

    def on_alerts(self, alerts: Sequence[apb.Alert]) -> None:
        """A listener on the alert book: start the grace timer of each alert the first time one of
        its events recommends snapshot-and-migrate (a FAILED event's, due at once); forget it once
        the risk fell."""
        with self._cv:
            for alert in alerts:
                step = policy.grace_step(alert, self._timers)
                if step is None:
                    continue
                key, what = step
                if what is GraceStep.SETTLE:
                    self._timers.settle(key)
                elif self._may_have_job(alert.node):
                    now = self.clock()
                    self._timers.start(key, now if what is GraceStep.NOW else now + self.grace_s)
            self._cv.notify_all()
        self._save_grace()  # on disk before the alert is a second old, if the store takes it
        failures = [a.id for a in alerts if a.kind == apb.EVENT_KIND_FAILED]
        if failures:  # decided (a timer, or no job to remediate): a start need not look again
            self.records.save_seen(max(failures))

    def _may_have_job(self, node: str) -> bool:
        """Whether a registered job runs on `node`; True when the store cannot say (the timer
        checks again when it fires)."""
        try:
            return bool(self.records.job_on(node))
        except sqlite3.OperationalError as exc:
            self.records.trouble(exc)
            return True

    def on_ack(self, ack: Ack) -> str:
        """Record an acknowledgement (of the alert, whichever of its events it names); returns what
        the service will do, in words."""
        alert = self.records.newest(ack.alert_id)
        if alert is None:
            self.records.record_ack(ack)
            return f"no alert {ack.alert_id}"
        ack = replace(ack, alert_id=alert.opened_id or alert.id)
        self.records.record_ack(ack)
        if ack.action == apb.ACK_ACTION_DECLINED:
            self.handover.release(ack.job_id, "the job declined the alert")
            return policy.declined_answer(alert)
        fell = self.records.risk_fell(alert.opened_id)
        answer = policy.ack_answer(alert, ack.action, self.grace_s, fell=fell)
        if answer is not None:
            return answer
        return self._queue(alert, ack.job_id, ack.checkpoint_uri, step=ack.step)[1]

    def note_job(self, job_id: str, *, replaces_nodes: bool) -> None:
        """A job's registration: whether it replaces a lost or warned node itself (then its
        remediations drain the node and requeue nothing)."""
        with self._cv:
            if replaces_nodes:
                self._replacing.add(job_id)
            else:
                self._replacing.discard(job_id)

    # -- the decision -----------------------------------------------------------------------

    def _queue(
        self, alert: apb.Alert, job_id: str, checkpoint_uri: str, *, grace: bool = False, step: int = 0
    ) -> tuple[bool, str]:
        """Queue the alert's remediation; (whether it was queued, what the service does, in words).
        A standby waiting for the job takes it over at this snapshot (not on the grace timer's)."""
        jobs = self.records.jobs_on(alert.node)
        if not job_id and not jobs:
            return False, f"no registered job on {alert.node}: nothing to remediate"
        claimed = self.records.outcome_of(alert.opened_id)
        if claimed is not None:
            return False, self._answer_again(alert, *claimed)
        with self._cv:
            replacing = set(self._replacing)
        other = self._taken_out_for(alert.node, alert.opened_id)
        if other is not None:
            said = f"{alert.node} is already being taken out for alert {other}: not drained twice"
            if alert.kind != apb.EVENT_KIND_FAILED:
                return False, said
            if (self.records.outcome_of(other) or ("pending",))[0] == "pending":
                # Its drain may yet fail: the failure waits to see, rather than join it blindly.
                with self._cv:
                    self._waiting.add(alert.opened_id)
                return False, f"{said} (waiting for its outcome)"
            jobs = self._not_moved(alert.node, other, jobs, replacing)
            if not jobs:
                self._join(alert, other, said)
                return False, said
            # Jobs the earlier drain did not move (another job's prediction, or jobs that came to
            # the node since): the node is drained again (no harm) and they are requeued.
        # A job that replaces its nodes goes on without this one: nothing to requeue. A failure
        # that happened moves every job on the node, each by its own policy.
        job, requeue, others = policy.jobs_moved(
            jobs, replacing, failed=alert.kind == apb.EVENT_KIND_FAILED, own=job_id
        )
        remediation = policy.remediation_for(
            alert, job, requeue=requeue, checkpoint_uri=checkpoint_uri, also_requeue=others
        )
        handed = self.handover.at_snapshot(
            remediation,
            step,
            grace=grace,
            admissible=lambda: self._admissible(alert.node),
            settle=self._settle,
        )
        if handed is not None and not handed.requeue:
            remediation = handed
        elif handed is not None:  # another remediation claimed the alert meanwhile
            return False, self._answer_again(alert, "pending")
        standby = remediation.handover_to
        task = Task(remediation, claimed=bool(standby), grace=grace)
        if not grace and not standby:
            task, instead = self._decide(task, alert)
            if instead is not None:
                return False, instead
        with self._cv:
            self.worker.queue([task])
            self._draining[alert.node] = alert.opened_id  # queued: a second alert waits for this one
        return True, policy.queued_answer(self.actuator.name, remediation)

    def _not_moved(self, node: str, other: int, jobs: list[str], replacing: set[str]) -> list[str]:
        """The `jobs` on `node` that neither the remediation of alert `other` nor any other that took
        the node out lately moved, and that a failure would (those that replace their nodes
        themselves need nothing)."""
        moved: set[str] = set()
        for taken in {other, *self.records.taken_out_since(node, self.wall() - self.incident_s)}:
            stored = self.records.stored_request(taken)
            if stored is not None:
                moved |= {stored.job_id, *stored.requeued}
        return [job for job in jobs if job not in moved and job not in replacing]

    def _join(self, failed: apb.Alert, other: int, said: str) -> None:
        """A failure on a node taken out lately is part of that incident: its outcome says so on
        disk ("joined"), so that every FAILED event's fate can be read, and nothing is acted on."""
        r = policy.remediation_for(failed, "", requeue=False, checkpoint_uri="")
        try:
            if self.records.claim(r):
                self.worker.finish(r, "joined", said)
        except sqlite3.OperationalError as exc:  # the node is out already: only the record is lost
            self.records.trouble(exc)

    def _answer_again(self, alert: apb.Alert, outcome: str, detail: str = "") -> str:
        """What a repeated acknowledgement is told: the decision made the first time."""
        stored = None if outcome == "refused" else self.records.stored_request(alert.opened_id)
        return policy.answer_again(alert.opened_id, outcome, detail, stored, self.actuator.name)

    def _admissible(self, node: str) -> bool:
        """Whether `node` may go now: remediation not paused, and the breaker would let it."""
        return self.paused_by is None and policy.would_admit(self.breaker, node, self.clock())

    def _taken_out_for(self, node: str, opened_id: int) -> int | None:
        """Another alert, still open, that `node` is being (or was) taken out for, if any: queued in
        this process, or claimed in the store (by this run or an earlier one) and not failed."""
        queued = self._draining.get(node)
        if queued is not None and queued != opened_id:
            outcome = (self.records.outcome_of(queued) or ("pending",))[0]
            # A drain that failed (or was refused) took nothing out: it holds no node.
            if outcome in ("pending", "ok") and self.records.holds_node(queued, outcome):
                return queued
        for other, outcome in self.records.claimed_on(node):
            if other == opened_id or outcome not in ("pending", "ok"):
                continue
            if self.records.holds_node(other, outcome):
                return other
        # Taken out lately, whatever for: the Xid, the silence that follows it and the alert that
        # foresaw them are one incident; a second drain would requeue jobs already moved.
        recent = [
            a for a in self.records.taken_out_since(node, self.wall() - self.incident_s) if a != opened_id
        ]
        return recent[-1] if recent else None

    def _fire(self, alert_id: int) -> None:
        """The alert's grace period ended: remediate unless it was declined or the risk fell."""
        with self._cv:
            if not self._timers.running(alert_id):
                return  # settled meanwhile
        alert = self.records.newest(alert_id)
        # DECLINED leaves the node to the operator. A SNAPSHOT_DONE does not stop the timer: one
        # given under snapshot-and-migrate queued the drain already (the claim stops a second),
        # and one given while the alert only asked for a snapshot says nothing about the move.
        if alert is None or self.records.declined(alert_id):
            self._settle(alert_id)
            return
        if self.records.risk_fell(alert_id):
            log.info("alert %d: the risk fell back before the grace period ended; nothing to do", alert_id)
            self._settle(alert_id)
            return
        if alert.kind == apb.EVENT_KIND_FAILED:
            log.warning("alert %d: %s failed (%s); remediating", alert_id, alert.node, alert.failure.detail)
        else:
            log.warning("alert %d: no SNAPSHOT_DONE within %.0f s; remediating", alert_id, self.grace_s)
        queued, _ = self._queue(alert, "", "", grace=True)
        with self._cv:
            waiting = alert_id in self._waiting
            self._waiting.discard(alert_id)
            if waiting:  # look again once the drain it waits for may have an outcome
                self._timers.look_again(alert_id, self.clock() + self.retry.initial_s)
                self._cv.notify_all()
                return
        if not queued:
            self._settle(alert_id)

    def _claim(self, task: Task) -> bool:
        """Claim the alert on disk; False when it is not remediated here (claimed before, or its
        node is being taken out for another alert)."""
        r = task.remediation
        # A failure's remediation was decided against the node's drains just now (it may carry the
        # jobs an earlier drain did not move): only a prediction's is checked again.
        if not r.evidence and self._taken_out_for(r.node, r.alert_id) is not None:
            if task.grace:
                self._settle(r.alert_id)
            return False
        claimed = self.records.claim(r)
        self._settle(r.alert_id)  # claimed, now or before: its grace timer has nothing left to do
        return claimed

    def _admit(self, r: Remediation) -> str | None:
        """None when the node may go (its admission is on disk first); else why not (the caller
        finishes the remediation as refused)."""
        fact = policy.bypasses_breaker(r)
        refused = policy.refusal(self.paused_by, self.breaker, r.node, self.clock(), fact=fact)
        if refused is not None:
            return refused
        if fact:
            return None  # not counted: nothing of the breaker's window to write
        # Before the actuator runs: a kill right after must not forget the node.
        self.records.save_breaker(self.breaker)
        return None

    def _decide(self, task: Task, alert: apb.Alert) -> tuple[Task, str | None]:
        """An acknowledgement's remediation claimed and admitted at once, on the caller's thread, so
        that what the job is told is what was decided (the worker then only acts): the task, and
        None, or what the job is told instead (refused, or claimed meanwhile). A store that cannot
        be written now leaves the rest to the worker, which decides as it always does."""
        r = task.remediation
        try:
            if not self._claim(task):
                return task, self._answer_again(alert, "pending")
            task = replace(task, claimed=True)
            refused = self._admit(r)
            if refused is not None:
                self.worker.finish(r, "refused", refused)
        except sqlite3.OperationalError as exc:
            self.records.trouble(exc)
            return task, None
        if refused is not None:
            return task, f"refused: {refused}; job {r.job_id} is not requeued; the operator decides"
        return replace(task, admitted=True), None

    # -- a start ----------------------------------------------------------------------------

    def resume(self) -> int:
        """Queue the remediations an earlier run claimed and never finished (it was killed, or
        stopped while they waited for a retry); returns how many. Once per Remediator: `start`
        calls it (and the worker again while the store cannot be read), tests call it before
        `run_once`."""
        with self._cv:
            if self._resumed:
                return 0
            self._resumed = True
        try:
            self._rearm_grace()
            pending = self.records.pending()
        except BaseException:
            with self._cv:
                self._resumed = False  # nothing queued yet: the next call starts over
            raise
        tasks = []
        for p in pending:
            request = self.records.read_request(p)
            if isinstance(request, str):  # an operator hears of the node instead of it waiting forever
                stub = Remediation(p.alert_id, p.node, -1, "unknown", 0.0, "", requeue=False)
                why = f"left unfinished by an earlier run with {request}: drain {p.node} by hand"
                self.worker.finish(stub, "failed", why)
                continue
            given_up = policy.given_up(p.attempts, self.retry.max_attempts, p.detail)
            if given_up is not None:
                self.worker.finish(request, "failed", given_up)
                continue
            log.warning(
                "alert %d: remediation of %s left unfinished by an earlier run (%s begun); carrying on",
                p.alert_id,
                p.node,
                policy.plural(p.attempts, "attempt"),
            )
            tasks.append(Task(request, claimed=True))
        self.worker.queue(tasks)
        self._save_grace()
        return len(tasks)

    def _rearm_grace(self) -> None:
        """Every open snapshot-and-migrate alert on a registered job's node that nobody claimed or
        declined and whose deadline did not reach the disk (a version that kept none, or a write
        refused before a kill) gets a full grace period from now."""
        for alert in self.records.open_alerts():
            if not policy.moves_node(alert) or not self.records.job_on(alert.node):
                continue
            if self._timers.started(alert.opened_id) or self.records.outcome_of(alert.opened_id) is not None:
                continue
            if self.records.declined(alert.opened_id):
                continue
            with self._cv:
                if not self._timers.started(alert.opened_id):
                    self._timers.start(alert.opened_id, self.clock() + self.grace_s)
        # A failure stored but never decided on (a kill between its event and its timer's write):
        # due now, if it is recent (an old one's node was dealt with by hand meanwhile). One decided
        # on is not looked at again: no job ran on its node then, whatever registered since.
        seen = self.records.seen_through()
        for failed in self.records.recent_failures(self.wall() - self.incident_s):
            if failed.id <= seen or self._timers.started(failed.id) or self.records.outcome_of(failed.id):
                continue
            if not self.records.job_on(failed.node):
                continue
            with self._cv:
                if not self._timers.started(failed.id):
                    log.warning(
                        "failure %d on %s was never remediated; remediating now", failed.id, failed.node
                    )
                    self._timers.start(failed.id, self.clock())

    # -- the worker -------------------------------------------------------------------------

    def run_once(self, wait_s: float = 0.0) -> int:
        """Fire due grace and backoff timers, write refused outcomes and carry out queued
        remediations; returns how many were taken up."""
        return self.worker.run_once(wait_s)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Block until `count` remediations have been carried out (True) or the timeout passes."""
        return self.worker.wait_done(count, timeout_s)

    def start(self) -> None:
        """Resume what a previous run left unfinished, then start the worker thread."""
        self.worker.start()

    def stop(self) -> None:
        """Stop the worker thread (what is pending stays in the store for the next start)."""
        self.worker.stop()
