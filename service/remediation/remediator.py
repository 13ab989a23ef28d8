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
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TypeVar

from faultcast.service.alert_book import PB_TO_MODE
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Actuator, CircuitBreaker, Remediation, RetryPolicy
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareState
from faultcast.service.state.acks import Ack
from faultcast.service.state.remediations import PendingRemediation
from faultcast.service.state.store import StateStore
from faultcast.service.supervise import start_supervised
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")

# Settings (StateStore.settings) that carry remediation across a restart, in unix time.
GRACE_DEADLINES_KEY = "remediation_grace_deadlines"  # {opened_id: when its grace period ends}
PAUSED_BY_KEY = "remediation_paused_by"  # who paused remediation (SetRemediation)
BREAKER_WINDOW_KEY = "remediation_breaker_window"  # [[when, node], ...] admitted within the window
# Clear reasons after which a grace timer has nothing to do (others may be the failure itself).
_RISK_FELL = (apb.CLEAR_REASON_RISK_FELL, apb.CLEAR_REASON_SUPERSEDED)


@dataclass(frozen=True, slots=True)
class _Task:
    """One remediation to attempt; `claimed` once its store row exists (a retry, or one resumed
    after a restart), `admitted` once this process's circuit breaker has counted its node, `grace`
    when its grace timer queued it (the deadline stays on disk until the claim is)."""

    remediation: Remediation
    claimed: bool = False
    admitted: bool = False
    grace: bool = False


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


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
    ) -> None:
        """`clock` times everything in this process; `wall` dates what is kept for the next one.
        `store_retry_s`: how soon work the store refused to record is tried again. `prescheduler`:
        the spares readied during alerts, handed the job at its snapshot (None: none are)."""
        self.store, self.actuator, self.metrics = store, actuator, metrics
        self.prescheduler = prescheduler
        self.grace_s, self.clock, self.wall, self.store_retry_s = grace_s, clock, wall, store_retry_s
        self.breaker = breaker or CircuitBreaker()
        # Who paused remediation (SetRemediation), None while it runs; kept across restarts.
        self.paused_by: str | None = store.settings.get(PAUSED_BY_KEY)
        self._pause_dirty = False  # paused_by changed since it was last written
        self.retry = retry or RetryPolicy()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._deadlines: list[tuple[float, int]] = []  # (clock time, opened_id): grace timers to look at
        self._grace: dict[int, float] = {}  # opened_id -> clock time its grace ends, until it is settled
        self._grace_dirty = False  # _grace changed since it was last written
        self._save_lock = threading.Lock()  # what is persisted is written in the order it was read
        self._timed: set[int] = set()  # alerts whose grace timer started (once per alert)
        self._draining: dict[str, int] = {}  # node -> the alert it was last taken out for
        self._replacing: set[str] = set()  # jobs that replace their nodes themselves: never requeued
        self._retry_at: list[tuple[float, int]] = []  # (clock time, alert id): backoff timers
        self._retrying: dict[int, _Task] = {}  # alert id -> the task its backoff timer runs
        self._work: list[_Task] = []
        self._stalled: list[_Task] = []  # tasks a refused write stopped before the actuator ran
        self._unwritten: list[tuple[Remediation, str, str]] = []  # outcomes the store refused
        self._store_retry_at: float | None = None  # clock time to try refused writes again
        self._store_failing = False  # for the log: one line when writes fail, one when they work again
        self._cv = threading.Condition()
        self._stopped = threading.Event()  # stop(): the worker and its supervisor end
        self._resumed = False
        self._thread: threading.Thread | None = None
        self.done: list[tuple[Remediation, str, str]] = []  # (what, outcome, detail), in order
        self._breaker_saved: list[tuple[float, str]] = []  # the breaker's window as last written
        self._restore_breaker()
        self._restore_grace()
        # Every outcome exists from the start, so the first failure shows in increase().
        for outcome in ("ok", "failed", "refused"):
            metrics.remediations.labels(actuator.name, outcome)
        metrics.circuit_open.set_function(lambda: 1.0 if self.breaker.is_open(self.clock()) else 0.0)
        metrics.remediation_retries_pending.set_function(lambda: float(len(self._retrying)))

    # -- what a restart keeps -----------------------------------------------------------------

    def _saved(self, key: str) -> object:
        raw = self.store.settings.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            log.error("state setting %s is unreadable (%r); going on without it", key, raw[:200])
            return None

    def _restore_breaker(self) -> None:
        """Count again the nodes earlier runs took out within the window."""
        saved = self._saved(BREAKER_WINDOW_KEY)
        now, wall = self.clock(), self.wall()
        admissions = []
        for entry in saved if isinstance(saved, list) else []:
            match entry:
                case [int() | float() as at, str() as node]:
                    # A wall clock set back since makes an admission count from now: longer, not shorter.
                    admissions.append((now - max(0.0, wall - at), node))
        self.breaker.restore(admissions)
        self._breaker_saved = self.breaker.admissions(now)

    def _save_breaker(self) -> None:
        """Write the breaker's window when it changed; raises when the store refuses."""
        now, wall = self.clock(), self.wall()
        with self._save_lock:
            taken = self.breaker.admissions(now)
            if taken == self._breaker_saved:
                return
            value = json.dumps([[round(wall - (now - at), 3), node] for at, node in taken]) if taken else None
            self._write(
                "the circuit breaker's window", lambda: self.store.settings.save(BREAKER_WINDOW_KEY, value)
            )
            self._breaker_saved = taken

    def _restore_grace(self) -> None:
        """Arm the grace timers an earlier run left, at their original deadlines."""
        saved = self._saved(GRACE_DEADLINES_KEY)
        now, wall = self.clock(), self.wall()
        for key, due in saved.items() if isinstance(saved, dict) else ():
            if str(key).isdigit() and isinstance(due, int | float):
                # A wall clock set back since must not stretch a deadline past a full grace period.
                self._arm(int(key), now + min(due - wall, self.grace_s))

    def _arm(self, opened_id: int, due: float) -> None:
        """Start the alert's grace timer (the lock held, or before the worker runs)."""
        self._timed.add(opened_id)
        self._grace[opened_id] = due
        heapq.heappush(self._deadlines, (due, opened_id))

    def _settle(self, opened_id: int) -> None:
        """The alert's grace timer has nothing left to do: forget its deadline."""
        with self._cv:
            if self._grace.pop(opened_id, None) is not None:
                self._grace_dirty = True

    def _save_grace(self) -> None:
        """Write the grace deadlines when they changed; kept to be written later when refused."""
        with self._save_lock:
            with self._cv:
                if not self._grace_dirty:
                    return
                self._grace_dirty = False
                now, wall = self.clock(), self.wall()
                due = {str(k): round(wall + (at - now), 3) for k, at in sorted(self._grace.items())}
            value = json.dumps(due) if due else None
            try:
                self._write("grace deadlines", lambda: self.store.settings.save(GRACE_DEADLINES_KEY, value))
            except sqlite3.OperationalError as exc:  # the timers still run here; only a kill would lose them
                self._store_trouble(exc)
                with self._cv:
                    self._grace_dirty = True
                    self._retry_store_later()

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
        with self._save_lock:  # one writer at a time, each writing the newest value
            with self._cv:
                if not self._pause_dirty:
                    return
                self._pause_dirty = False
                value = self.paused_by
            try:
                self._write("remediation pause", lambda: self.store.settings.save(PAUSED_BY_KEY, value))
            except sqlite3.OperationalError as exc:
                self._store_trouble(exc)
                log.error("%s: the remediation pause is in force but would not outlive a restart yet", exc)
                with self._cv:
                    self._pause_dirty = True
                    self._retry_store_later()

    # -- writes the store may refuse -----------------------------------------------------------

    def _write(self, what: str, write: Callable[[], T]) -> T:
        """A store write; a refusal (full disk, I/O error; the store counts it) is raised for the
        caller to keep its work, and the first write that works after refusals is logged."""
        result = write()
        if self._store_failing:
            self._store_failing = False
            log.warning("the state database takes remediation's writes again (%s); carrying on", what)
        return result

    def _store_trouble(self, exc: sqlite3.Error) -> None:
        """Say once that the store fails (the store counts each failed write)."""
        if not self._store_failing:
            self._store_failing = True
            log.error(
                "the state database failed remediation (%s): the work is kept and tried again every %.0f s; "
                "no node is taken out before its claim is on disk",
                exc,
                self.store_retry_s,
            )

    def _retry_store_later(self) -> None:
        """Try refused writes again after store_retry_s (the lock held)."""
        at = self.clock() + self.store_retry_s
        if self._store_retry_at is None or at < self._store_retry_at:
            self._store_retry_at = at
        self._cv.notify_all()

    # -- inputs -----------------------------------------------------------------------------

    def on_alerts(self, alerts: Sequence[apb.Alert]) -> None:
        """A listener on the alert book: start the grace timer of each alert the first time one of
        its events recommends snapshot-and-migrate; forget it once the risk fell."""
        with self._cv:
            for alert in alerts:
                if alert.kind == apb.EVENT_KIND_FAILED:
                    # It has happened: no grace to wait for a snapshot. The node goes now (unless it
                    # is being taken out already) and the job is requeued from its last checkpoint.
                    if alert.failure.drains_node and self._may_have_job(alert.node):
                        self._arm(alert.id, self.clock())
                        self._grace_dirty = True
                    continue
                migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
                key = alert.opened_id or alert.id
                if alert.state == apb.ALERT_STATE_CLEARED and alert.clear_reason in _RISK_FELL:
                    self._settle(key)
                    continue
                if alert.state != apb.ALERT_STATE_OPEN or not migrate or key in self._timed:
                    continue
                if self._may_have_job(alert.node):
                    self._arm(key, self.clock() + self.grace_s)
                    self._grace_dirty = True
            self._cv.notify_all()
        self._save_grace()  # on disk before the alert is a second old, if the store takes it

    def _may_have_job(self, node: str) -> bool:
        """Whether a registered job runs on `node`; True when the store cannot say (the timer
        checks again when it fires)."""
        try:
            return bool(self._job_on(node))
        except sqlite3.OperationalError as exc:
            self._store_trouble(exc)
            return True

    def _newest(self, alert_id: int) -> apb.Alert | None:
        """The newest event of the alert that event `alert_id` belongs to (its CLEARED event once it
        has cleared, which still names the node and the last recommended action)."""
        event = self.store.alerts.get(alert_id)
        return None if event is None else self.store.alerts.newest_event(event.opened_id or event.id)

    def on_ack(self, ack: Ack) -> str:
        """Record an acknowledgement (of the alert, whichever of its events it names); returns what
        the service will do, in words."""
        alert = self._newest(ack.alert_id)
        if alert is None:
            self.store.acks.record(ack)
            return f"no alert {ack.alert_id}"
        ack = replace(ack, alert_id=alert.opened_id or alert.id)
        self.store.acks.record(ack)
        if ack.action == apb.ACK_ACTION_DECLINED:
            if self.prescheduler is not None:
                self.prescheduler.release(ack.job_id, "the job declined the alert")
            return f"declined: {alert.node} stays in service; the operator decides"
        if self._risk_fell(alert.opened_id):
            return f"noted; alert {alert.opened_id} has cleared (its risk fell back): nothing to remediate"
        migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        if not migrate:
            what = apb.RecommendedAction.Name(alert.action)
            return f"noted; alert {alert.opened_id} recommends {what}: {alert.node} stays in service"
        if ack.action != apb.ACK_ACTION_SNAPSHOT_DONE:
            return f"noted; {alert.node} is drained after SNAPSHOT_DONE or in {self.grace_s:.0f} s"
        return self._queue(alert, ack.job_id, ack.checkpoint_uri, step=ack.step)[1]

    # -- the decision -----------------------------------------------------------------------

    def _job_on(self, node: str) -> str:
        for job, nodes in sorted(self.store.jobs.all().items()):
            if node in nodes:
                return job
        return ""

    def _queue(
        self, alert: apb.Alert, job_id: str, checkpoint_uri: str, *, grace: bool = False, step: int = 0
    ) -> tuple[bool, str]:
        """Queue the alert's remediation; (whether it was queued, what the service does, in words).
        A standby waiting for the job takes it over at this snapshot (not on the grace timer's)."""
        job = job_id or self._job_on(alert.node)
        if not job:
            return False, f"no registered job on {alert.node}: nothing to remediate"
        claimed = self.store.remediations.of(alert.opened_id)
        if claimed is not None:
            return False, self._answer_again(alert, *claimed)
        other = self._taken_out_for(alert.node, alert.opened_id)
        if other is not None:
            return False, f"{alert.node} is already being taken out for alert {other}: not drained twice"
        remediation = Remediation(
            alert_id=alert.opened_id,
            node=alert.node,
            gpu=alert.gpu,
            mode=PB_TO_MODE.get(alert.mode, "unknown"),
            risk=alert.risk,
            job_id=job,
            requeue=job not in self._replacing,  # a job that replaces its nodes goes on without this one
            checkpoint_uri=checkpoint_uri,
        )
        handed = self._hand_over(remediation, step, grace=grace)
        if handed is not None and not handed.requeue:
            remediation = handed
        elif handed is not None:  # another remediation claimed the alert meanwhile
            return False, self._answer_again(alert, "pending")
        standby = remediation.handover_to
        task = _Task(remediation, claimed=bool(standby), grace=grace)
        if not grace and not standby:
            task, instead = self._decide(task, alert)
            if instead is not None:
                return False, instead
        with self._cv:
            self._work.append(task)
            self._draining[alert.node] = alert.opened_id  # queued: a second alert waits for this one
            self._cv.notify_all()
        if standby:
            return (
                True,
                f"{self.actuator.name}: drain {alert.node} and hand job {job} over to standby {standby}",
            )
        if not remediation.requeue:
            return True, f"{self.actuator.name}: drain {alert.node}; job {job} replaces the node itself"
        return True, f"{self.actuator.name}: drain {alert.node} and requeue job {job}"

    def note_job(self, job_id: str, *, replaces_nodes: bool) -> None:
        """A job's registration: whether it replaces a lost or warned node itself (then its
        remediations drain the node and requeue nothing)."""
        with self._cv:
            if replaces_nodes:
                self._replacing.add(job_id)
            else:
                self._replacing.discard(job_id)

    def _answer_again(self, alert: apb.Alert, outcome: str, detail: str = "") -> str:
        """What a repeated acknowledgement is told: the decision made the first time (a job that
        hears it again must hold again, not train on beside a standby or a requeue; one refused
        hears the refusal again)."""
        if outcome == "refused":
            return f"refused: {detail}; alert {alert.opened_id} is not remediated; the operator decides"
        doing = "being remediated" if outcome == "pending" else "already remediated"
        try:
            stored = Remediation(**json.loads(self.store.remediations.request_of(alert.opened_id)))
        except (ValueError, TypeError):
            return f"alert {alert.opened_id} is {doing}"
        if not stored.requeue and not stored.handover_to:
            return f"alert {alert.opened_id} is {doing}"
        name = self.actuator.name
        if stored.handover_to:
            what = f"drain {stored.node} and hand job {stored.job_id} over to standby {stored.handover_to}"
        else:
            what = f"drain {stored.node} and requeue job {stored.job_id}"
        return f"{name}: {what} (alert {alert.opened_id} is {doing})"

    def _hand_over(self, remediation: Remediation, step: int, *, grace: bool) -> Remediation | None:
        """With a standby waiting for the job at this snapshot: the remediation that ends the job
        instead of requeueing it, claimed on disk BEFORE the standby is told to go (a restart or
        the grace timer then finds the hand-over, never a requeue beside the standby). Returns None
        when there is no hand-over (the spare released; today's path), the claimed hand-over, or
        `remediation` itself (requeue still True) when the alert was claimed by another meanwhile."""
        job = remediation.job_id
        if self.prescheduler is None:
            return None
        if grace:
            self.prescheduler.release(job, "the node is drained without a snapshot to hand over")
            return None
        if self.paused_by is not None or not self._would_admit(remediation.node):
            self.prescheduler.release(job, "remediation is paused or the circuit breaker is open")
            return None
        spare = self.prescheduler.reserve(job, remediation.checkpoint_uri)
        if spare is None:
            return None
        if spare.state != SpareState.RESERVED:  # handed over already, for another alert of the job
            return None
        handed = replace(remediation, requeue=False, handover_to=spare.standby_job)
        try:
            claimed = self._write(
                "a claim",
                lambda: self.store.remediations.claim(
                    handed.alert_id, handed.node, self.actuator.name, json.dumps(asdict(handed))
                ),
            )
        except sqlite3.OperationalError as exc:
            self._store_trouble(exc)
            self.prescheduler.unreserve(spare, "the hand-over could not be recorded (state database)")
            return None
        if not claimed:
            self.prescheduler.unreserve(spare, "the alert was claimed by another remediation")
            return remediation
        self._settle(handed.alert_id)
        self.prescheduler.go(spare, handed.alert_id, step, handed.checkpoint_uri)
        return handed

    def _would_admit(self, node: str) -> bool:
        """Whether the circuit breaker would let `node` go now (without counting it)."""
        now = self.clock()
        return not self.breaker.is_open(now) or any(n == node for _, n in self.breaker.admissions(now))

    def _risk_fell(self, opened_id: int) -> bool:
        """Whether the alert cleared because its risk fell back (its other endings, a GPU gone dark or
        a node gone silent, may be the failure itself: the node still goes)."""
        event = self.store.alerts.cleared_event(opened_id)
        return event is not None and event.clear_reason in _RISK_FELL

    def _taken_out_for(self, node: str, opened_id: int) -> int | None:
        """Another alert, still open, that `node` is being (or was) taken out for, if any: queued in
        this process, or claimed in the store (by this run or an earlier one) and not failed."""
        queued = self._draining.get(node)
        if queued is not None and queued != opened_id:
            claimed = self.store.remediations.of(queued)
            if self._holds_node(queued, claimed[0] if claimed is not None else "pending"):
                return queued
        for other, outcome in self.store.remediations.on_node(node):
            if other != opened_id and outcome in ("pending", "ok") and self._holds_node(other, outcome):
                return other
        return None

    def _holds_node(self, alert_id: int, outcome: str) -> bool:
        """Whether the alert still keeps its node taken out: an alert not yet cleared, or a FAILED
        event (which never clears) only while its own remediation is under way."""
        event = self.store.alerts.get(alert_id)
        if event is not None and event.kind == apb.EVENT_KIND_FAILED:
            return outcome == "pending"
        return self.store.alerts.cleared_event(alert_id) is None

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
            pending = self.store.remediations.pending()
        except BaseException:
            with self._cv:
                self._resumed = False  # nothing queued yet: the next call starts over
            raise
        tasks = []
        for p in pending:
            remediation = self._request(p)
            if remediation is None:
                continue
            if p.attempts >= self.retry.max_attempts:
                last = p.detail or "no outcome stored"
                self._finish(
                    remediation,
                    "failed",
                    f"{last}; gave up after {_plural(p.attempts, 'attempt')} (the last cut off by a restart)",
                )
                continue
            log.warning(
                "alert %d: remediation of %s left unfinished by an earlier run (%s begun); carrying on",
                p.alert_id,
                p.node,
                _plural(p.attempts, "attempt"),
            )
            tasks.append(_Task(remediation, claimed=True))
        with self._cv:
            self._work.extend(tasks)
            self._cv.notify_all()
        self._save_grace()
        return len(tasks)

    def _rearm_grace(self) -> None:
        """Every open snapshot-and-migrate alert on a registered job's node that nobody claimed or
        declined and whose deadline did not reach the disk (a version that kept none, or a write
        refused before a kill) gets a full grace period from now."""
        for alert in self.store.alerts.open_now():
            if alert.action != apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE or not self._job_on(alert.node):
                continue
            if alert.opened_id in self._timed or self.store.remediations.of(alert.opened_id) is not None:
                continue
            if any(a.action == apb.ACK_ACTION_DECLINED for a in self.store.acks.of(alert.opened_id)):
                continue
            with self._cv:
                if alert.opened_id not in self._timed:
                    self._arm(alert.opened_id, self.clock() + self.grace_s)
                    self._grace_dirty = True

    def _request(self, pending: PendingRemediation) -> Remediation | None:
        """The stored request of a pending remediation; one that cannot be read is finished as
        failed, so that an operator hears of the node instead of it waiting forever."""
        try:
            return Remediation(**json.loads(pending.request))
        except (ValueError, TypeError) as exc:  # a row from a version that stored no request
            stub = Remediation(pending.alert_id, pending.node, -1, "unknown", 0.0, "", requeue=False)
            why = "no stored request" if not pending.request else f"unreadable request ({exc})"
            self._finish(
                stub, "failed", f"left unfinished by an earlier run with {why}: drain {pending.node} by hand"
            )
            return None

    def _due(self, timers: list[tuple[float, int]]) -> list[int]:
        now = self.clock()
        due = []
        while timers and timers[0][0] <= now:
            due.append(heapq.heappop(timers)[1])
        return due

    def _timeout(self, wait_s: float) -> float:
        """How long the worker may sleep: until the next timer, at most `wait_s` (the lock held)."""
        now = self.clock()
        nexts = [timers[0][0] for timers in (self._deadlines, self._retry_at) if timers]
        if self._store_retry_at is not None:
            nexts.append(self._store_retry_at)
        return min([wait_s, *(max(0.0, at - now) for at in nexts)])

    def _refused_due(self) -> tuple[list[_Task], list[tuple[Remediation, str, str]]]:
        """The work the store refused, once it is time to try again (the lock held)."""
        if self._store_retry_at is None or self._store_retry_at > self.clock():
            return [], []
        self._store_retry_at = None
        stalled, self._stalled = self._stalled, []
        unwritten, self._unwritten = self._unwritten, []
        return stalled, unwritten

    def run_once(self, wait_s: float = 0.0) -> int:
        """Fire due grace and backoff timers, write refused outcomes and carry out queued
        remediations; returns how many were taken up."""
        with self._cv:
            if wait_s > 0 and not self._work and not self._stopped.is_set():
                self._cv.wait(self._timeout(wait_s))
            due = self._due(self._deadlines)
            retries = [self._retrying.pop(alert_id) for alert_id in self._due(self._retry_at)]
            stalled, unwritten = self._refused_due()
        for r, outcome, detail in unwritten:
            if self._store_outcome(r, outcome, detail):
                self._finished(r, outcome, detail)
        self._fire_all(due)
        with self._cv:
            work, self._work = retries + stalled + self._work, []
        self._attempt_all(work)
        with self._cv:
            backing_off = self._store_retry_at is not None
        if not backing_off:
            self._save_grace()
            self._save_pause()
        return len(work)

    def _fire_all(self, due: list[int]) -> None:
        for i, alert_id in enumerate(due):
            try:
                self._fire(alert_id)
            except sqlite3.OperationalError as exc:  # the store could not be read: look again later
                self._store_trouble(exc)
                with self._cv:
                    heapq.heappush(self._deadlines, (self.clock() + self.store_retry_s, alert_id))
            except BaseException:
                with self._cv:  # the timers not yet looked at stay armed (firing again queues nothing twice)
                    for later in due[i:]:
                        heapq.heappush(self._deadlines, (self.clock(), later))
                raise

    def _fire(self, alert_id: int) -> None:
        """The alert's grace period ended: remediate unless it was declined or the risk fell."""
        with self._cv:
            if alert_id not in self._grace:
                return  # settled meanwhile
        alert = self._newest(alert_id)
        # DECLINED leaves the node to the operator. A SNAPSHOT_DONE does not stop the timer: one
        # given under snapshot-and-migrate queued the drain already (the claim stops a second),
        # and one given while the alert only asked for a snapshot says nothing about the move.
        if alert is None or any(a.action == apb.ACK_ACTION_DECLINED for a in self.store.acks.of(alert_id)):
            self._settle(alert_id)
            return
        if self._risk_fell(alert_id):
            log.info("alert %d: the risk fell back before the grace period ended; nothing to do", alert_id)
            self._settle(alert_id)
            return
        if alert.kind == apb.EVENT_KIND_FAILED:
            log.warning("alert %d: %s failed (%s); remediating", alert_id, alert.node, alert.failure.detail)
        else:
            log.warning("alert %d: no SNAPSHOT_DONE within %.0f s; remediating", alert_id, self.grace_s)
        queued, _ = self._queue(alert, "", "", grace=True)
        if not queued:
            self._settle(alert_id)

    def _attempt_all(self, work: list[_Task]) -> None:
        for i, task in enumerate(work):
            try:
                self._attempt(task)
            except BaseException:
                # The tasks not yet tried are kept; the one that raised is on disk if it was claimed,
                # for the next start (trying it again here might drain twice).
                with self._cv:
                    self._work[:0] = work[i + 1 :]
                raise

    def _attempt(self, task: _Task) -> None:
        r = task.remediation
        try:
            if not task.claimed:
                if not self._claim(task):
                    return
                task = replace(task, claimed=True)
            if not task.admitted:
                if self._admit(r) is not None:
                    return
                task = replace(task, admitted=True)
            attempts = self._write(
                "an attempt", lambda: self.store.remediations.begin_attempt(r.alert_id, self.actuator.name)
            )
        except sqlite3.OperationalError as exc:  # nothing done yet: again once the store takes writes
            self._store_trouble(exc)
            with self._cv:
                self._stalled.append(task)
                self._retry_store_later()
            return
        self._act(task, attempts)

    def _claim(self, task: _Task) -> bool:
        """Claim the alert on disk; False when it is not remediated here (claimed before, or its
        node is being taken out for another alert)."""
        r = task.remediation
        if self._taken_out_for(r.node, r.alert_id) is not None:
            if task.grace:
                self._settle(r.alert_id)
            return False
        request = json.dumps(asdict(r))
        claimed = self._write(
            "a claim", lambda: self.store.remediations.claim(r.alert_id, r.node, self.actuator.name, request)
        )
        self._settle(r.alert_id)  # claimed, now or before: its grace timer has nothing left to do
        return claimed

    def _admit(self, r: Remediation) -> str | None:
        """None when the node may go (its admission is on disk first); else why not, the
        remediation finished as refused."""
        if self.paused_by is not None:
            detail = f"remediation paused by {self.paused_by}; {r.node} left in service"
            self._finish(r, "refused", detail)
            return detail
        # The breaker counts the node once, at its first attempt here: a retry takes out no more
        # nodes, and must not be refused because the window moved on meanwhile.
        if not self.breaker.allow(r.node, self.clock()):
            detail = (
                f"circuit breaker: {self.breaker.max_nodes} nodes already taken out in "
                f"{self.breaker.window_s:.0f} s; {r.node} left in service"
            )
            self._finish(r, "refused", detail)
            return detail
        self._save_breaker()  # before the actuator runs: a kill right after must not forget the node
        return None

    def _decide(self, task: _Task, alert: apb.Alert) -> tuple[_Task, str | None]:
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
        except sqlite3.OperationalError as exc:
            self._store_trouble(exc)
            return task, None
        if refused is not None:
            return task, f"refused: {refused}; job {r.job_id} is not requeued; the operator decides"
        return replace(task, admitted=True), None

    def _act(self, task: _Task, attempts: int) -> None:
        r = task.remediation
        if attempts > 1:
            self.metrics.remediation_retries.inc()
        try:
            result = self.actuator.remediate(r)
        except Exception as exc:  # an actuator bug must not stop remediation of others
            log.warning("actuator %s raised on alert %d", self.actuator.name, r.alert_id, exc_info=True)
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        else:
            ok, detail = result.ok, result.detail
        if ok:
            self._finish(r, "ok", detail if attempts == 1 else f"{detail} (on attempt {attempts})")
        elif attempts >= self.retry.max_attempts:
            self._finish(r, "failed", f"{detail}; gave up after {_plural(attempts, 'attempt')}")
        else:
            delay_s = self.retry.delay_s(attempts, self._rng.random())
            try:
                self._write(
                    "why an attempt failed",
                    lambda: self.store.remediations.note_failed_attempt(r.alert_id, detail),
                )
            except sqlite3.OperationalError as exc:  # only the reason is lost; the retry goes on
                self._store_trouble(exc)
            with self._cv:
                self._retrying[r.alert_id] = replace(task, claimed=True, admitted=True)
                heapq.heappush(self._retry_at, (self.clock() + delay_s, r.alert_id))
                self._cv.notify_all()
            log.warning(
                "remediation of alert %d on %s: attempt %d of %d failed (%s); retrying in %.1f s",
                r.alert_id,
                r.node,
                attempts,
                self.retry.max_attempts,
                detail,
                delay_s,
            )

    def _finish(self, r: Remediation, outcome: str, detail: str) -> None:
        if self._store_outcome(r, outcome, detail):
            self._finished(r, outcome, detail)
            return
        log.warning(
            "remediation of alert %d on %s: %s (%s); the outcome is written once the state database "
            "takes writes (the remediation stays pending there meanwhile)",
            r.alert_id,
            r.node,
            outcome,
            detail,
        )

    def _store_outcome(self, r: Remediation, outcome: str, detail: str) -> bool:
        """Write the outcome; False when the store refused it (kept, to be written later)."""
        try:
            self._write("an outcome", lambda: self.store.remediations.finish(r.alert_id, outcome, detail))
        except sqlite3.OperationalError as exc:
            self._store_trouble(exc)
            with self._cv:
                self._unwritten.append((r, outcome, detail))
                self._retry_store_later()
            return False
        return True

    def _finished(self, r: Remediation, outcome: str, detail: str) -> None:
        """The outcome is on disk: count it, and say it."""
        self.metrics.remediations.labels(self.actuator.name, outcome).inc()
        with self._cv:
            self.done.append((r, outcome, detail))
            self._cv.notify_all()
        # A failure after every retry leaves a node predicted to fail in service: an operator must act.
        level = logging.ERROR if outcome == "failed" else logging.WARNING
        log.log(level, "remediation of alert %d on %s: %s (%s)", r.alert_id, r.node, outcome, detail)
        if outcome == "ok" and r.handover_to:
            self._forget_handed_over(r)

    def _forget_handed_over(self, r: Remediation) -> None:
        """The job ended on the drained node and its standby registered under its own id: without this
        the node would stay the old job's, and a later alert there would remediate a job long gone."""
        try:
            self._write("a job's end", lambda: self.store.jobs.forget(r.job_id))
        except sqlite3.OperationalError as exc:  # StateWriteError too: the store counted it
            log.warning("job %s, handed over to %s, stays registered: %s", r.job_id, r.handover_to, exc)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Block until `count` remediations have been carried out (True) or the timeout passes."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self.done) >= count, timeout_s)

    # -- the worker -------------------------------------------------------------------------

    def start(self) -> None:
        """Resume what a previous run left unfinished, then start the worker thread."""
        try:
            self.resume()
        except sqlite3.OperationalError as exc:  # the worker tries again
            self._store_trouble(exc)
        # Supervised like the service's other threads: a bug, or the store failing where nothing
        # expected it, restarts the loop (what was not yet tried is kept: run_once puts it back).
        self._thread = start_supervised("remediator", self._loop, self._stopped, self._restarted)

    def _restarted(self, thread: str) -> None:
        self.metrics.thread_restarts.labels(thread).inc()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self.resume()
            self.run_once(wait_s=1.0)

    def stop(self) -> None:
        """Stop the worker thread (what is pending stays in the store for the next start)."""
        self._stopped.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
