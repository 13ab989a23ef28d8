"""When to take a node out: an alert (one incident, all its events sharing opened_id) whose newest
event recommends snapshot-and-migrate, on a node that runs a registered job, is remediated once the
job acknowledges it with SNAPSHOT_DONE (its state is safe), or once `grace_s` passes after the first
such event with no SNAPSHOT_DONE (the hardware must go anyway; the job restarts from its last
checkpoint) unless the alert cleared because the risk fell. A DECLINED acknowledgement leaves the
node to the operator; a SNAPSHOT_DONE for a snapshot-only alert is noted and the node stays.

One incident, one drain: each alert is claimed once, across restarts, whatever its updates; an
acknowledgement of any of its events counts for the alert; and a node already being drained for
another alert still open is not drained again. The circuit breaker caps nodes per window; actuators
run on a worker thread so a slow scheduler never holds up scoring.

A failed attempt (an exception or an outcome not ok) is tried again after a backoff (`RetryPolicy`),
scheduled like the grace timers so other remediations go on meanwhile; the breaker counts the node
once, when it first admits it. After the last attempt the remediation is "failed". The claim and
each attempt are on disk first, so a service killed mid-remediation carries it on at the next
start (`resume`), with the attempts it already made counted: the actuator may then see one alert
twice (the kill came after it acted, before the outcome was stored), which actuators tolerate.
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from faultcast.service.alerting import PB_TO_MODE
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation import Actuator, CircuitBreaker, Remediation, RetryPolicy
from faultcast.service.state import Ack, PendingRemediation, StateStore
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Task:
    """One remediation to attempt; `claimed` once its store row exists (a retry, or one resumed
    after a restart), `admitted` once this process's circuit breaker has counted its node."""

    remediation: Remediation
    claimed: bool = False
    admitted: bool = False


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class Remediator:
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
        rng: random.Random | None = None,
    ) -> None:
        self.store, self.actuator, self.metrics = store, actuator, metrics
        self.grace_s, self.clock = grace_s, clock
        self.breaker = breaker or CircuitBreaker()
        # Who paused remediation (SetRemediation), None while it runs; kept across restarts.
        self.paused_by: str | None = store.setting("remediation_paused_by")
        self.retry = retry or RetryPolicy()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._deadlines: list[tuple[float, int]] = []  # (clock time, opened_id): grace timers
        self._timed: set[int] = set()  # alerts whose grace timer started (once per alert)
        self._draining: dict[str, int] = {}  # node -> the alert it was last taken out for
        self._retry_at: list[tuple[float, int]] = []  # (clock time, alert id): backoff timers
        self._retrying: dict[int, _Task] = {}  # alert id -> the task its backoff timer runs
        self._work: list[_Task] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._resumed = False
        self._thread: threading.Thread | None = None
        self.done: list[tuple[Remediation, str, str]] = []  # (what, outcome, detail), in order
        # Every outcome exists from the start, so the first failure shows in increase().
        for outcome in ("ok", "failed", "refused"):
            metrics.remediations.labels(actuator.name, outcome)
        metrics.circuit_open.set_function(lambda: 1.0 if self.breaker.is_open(self.clock()) else 0.0)
        metrics.remediation_retries_pending.set_function(lambda: float(len(self._retrying)))

    # -- inputs -----------------------------------------------------------------------------

    def on_alerts(self, alerts: Sequence[apb.Alert]) -> None:
        """A listener on the alert book: start the grace timer of each alert the first time one of
        its events recommends snapshot-and-migrate."""
        with self._cv:
            for alert in alerts:
                migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
                key = alert.opened_id or alert.id
                if alert.state != apb.ALERT_STATE_OPEN or not migrate or key in self._timed:
                    continue
                if self._job_on(alert.node):
                    self._timed.add(key)
                    heapq.heappush(self._deadlines, (self.clock() + self.grace_s, key))
            self._cv.notify_all()

    def _newest(self, alert_id: int) -> apb.Alert | None:
        """The newest event of the alert that event `alert_id` belongs to (its CLEARED event once it
        has cleared, which still names the node and the last recommended action)."""
        event = self.store.get(alert_id)
        return None if event is None else self.store.newest_event(event.opened_id or event.id)

    def on_ack(self, ack: Ack) -> str:
        """Record an acknowledgement (of the alert, whichever of its events it names); returns what
        the service will do, in words."""
        alert = self._newest(ack.alert_id)
        if alert is None:
            self.store.record_ack(ack)
            return f"no alert {ack.alert_id}"
        ack = replace(ack, alert_id=alert.opened_id or alert.id)
        self.store.record_ack(ack)
        if ack.action == apb.ACK_ACTION_DECLINED:
            return f"declined: {alert.node} stays in service; the operator decides"
        if self._risk_fell(alert.opened_id):
            return f"noted; alert {alert.opened_id} has cleared (its risk fell back): nothing to remediate"
        migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        if not migrate:
            what = apb.RecommendedAction.Name(alert.action)
            return f"noted; alert {alert.opened_id} recommends {what}: {alert.node} stays in service"
        if ack.action != apb.ACK_ACTION_SNAPSHOT_DONE:
            return f"noted; {alert.node} is drained after SNAPSHOT_DONE or in {self.grace_s:.0f} s"
        return self._queue(alert, ack.job_id, ack.checkpoint_uri)

    # -- the decision -----------------------------------------------------------------------

    def _job_on(self, node: str) -> str:
        for job, nodes in sorted(self.store.jobs().items()):
            if node in nodes:
                return job
        return ""

    def _queue(self, alert: apb.Alert, job_id: str, checkpoint_uri: str) -> str:
        job = job_id or self._job_on(alert.node)
        if not job:
            return f"no registered job on {alert.node}: nothing to remediate"
        claimed = self.store.remediation(alert.opened_id)
        if claimed is not None:
            doing = "being remediated" if claimed[0] == "pending" else "already remediated"
            return f"alert {alert.opened_id} is {doing}"
        other = self._taken_out_for(alert.node, alert.opened_id)
        if other is not None:
            return f"{alert.node} is already being taken out for alert {other}: not drained twice"
        remediation = Remediation(
            alert_id=alert.opened_id, node=alert.node, gpu=alert.gpu, mode=PB_TO_MODE.get(alert.mode, "unknown"),
            risk=alert.risk, job_id=job, requeue=True, checkpoint_uri=checkpoint_uri,
        )  # fmt: skip
        with self._cv:
            self._work.append(_Task(remediation))
            self._draining[alert.node] = alert.opened_id  # queued: a second alert waits for this one
            self._cv.notify_all()
        return f"{self.actuator.name}: drain {alert.node} and requeue job {job}"

    def _risk_fell(self, opened_id: int) -> bool:
        """Whether the alert cleared because its risk fell back (its other endings, a GPU gone dark or
        a node gone silent, may be the failure itself: the node still goes)."""
        event = self.store.cleared_event(opened_id)
        return event is not None and event.clear_reason in (
            apb.CLEAR_REASON_RISK_FELL,
            apb.CLEAR_REASON_SUPERSEDED,
        )

    def _taken_out_for(self, node: str, opened_id: int) -> int | None:
        """Another alert, still open, that `node` is being (or was) taken out for, if any: queued in
        this process, or claimed in the store (by this run or an earlier one) and not failed."""
        queued = self._draining.get(node)
        if queued is not None and queued != opened_id and self.store.cleared_event(queued) is None:
            return queued
        for other, outcome in self.store.remediations_on(node):
            if (
                other != opened_id
                and outcome in ("pending", "ok")
                and self.store.cleared_event(other) is None
            ):
                return other
        return None

    def resume(self) -> int:
        """Queue the remediations an earlier run claimed and never finished (it was killed, or
        stopped while they waited for a retry); returns how many. Once per Remediator: `start`
        calls it, tests call it before `run_once`."""
        with self._cv:
            if self._resumed:
                return 0
            self._resumed = True
        tasks = []
        for pending in self.store.pending_remediations():
            remediation = self._request(pending)
            if remediation is None:
                continue
            if pending.attempts >= self.retry.max_attempts:
                last = pending.detail or "no outcome stored"
                self._finish(
                    remediation, "failed",
                    f"{last}; gave up after {_plural(pending.attempts, 'attempt')} (the last cut off by a restart)",
                )  # fmt: skip
                continue
            log.warning(
                "alert %d: remediation of %s left unfinished by an earlier run (%s begun); carrying on",
                pending.alert_id, pending.node, _plural(pending.attempts, "attempt"),
            )  # fmt: skip
            tasks.append(_Task(remediation, claimed=True))
        with self._cv:
            self._work.extend(tasks)
            self._cv.notify_all()
        self._rearm_grace()
        return len(tasks)

    def _rearm_grace(self) -> None:
        """Grace timers live in memory: after a restart, every open snapshot-and-migrate alert on a
        registered job's node that nobody claimed, acknowledged with SNAPSHOT_DONE or declined gets
        a full grace period again."""
        for alert in self.store.open_alerts():
            if alert.action != apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE or not self._job_on(alert.node):
                continue
            if self.store.remediation(alert.opened_id) is not None:
                continue
            if any(a.action == apb.ACK_ACTION_DECLINED for a in self.store.acks(alert.opened_id)):
                continue
            with self._cv:
                if alert.opened_id not in self._timed:
                    self._timed.add(alert.opened_id)
                    heapq.heappush(self._deadlines, (self.clock() + self.grace_s, alert.opened_id))

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

    def run_once(self, wait_s: float = 0.0) -> int:
        """Fire due grace and backoff timers and carry out queued remediations; returns how many
        attempts were made."""
        with self._cv:
            if wait_s > 0 and not self._work and not self._stopping:
                timeout = wait_s
                for timers in (self._deadlines, self._retry_at):
                    if timers:
                        timeout = min(timeout, max(0.0, timers[0][0] - self.clock()))
                self._cv.wait(timeout)
            due = self._due(self._deadlines)
            retries = [self._retrying.pop(alert_id) for alert_id in self._due(self._retry_at)]
        for alert_id in due:
            alert = self._newest(alert_id)
            # DECLINED leaves the node to the operator. A SNAPSHOT_DONE does not stop the timer: one
            # given under snapshot-and-migrate queued the drain already (the claim stops a second),
            # and one given while the alert only asked for a snapshot says nothing about the move.
            if alert is None or any(a.action == apb.ACK_ACTION_DECLINED for a in self.store.acks(alert_id)):
                continue
            if self._risk_fell(alert_id):
                log.info(
                    "alert %d: the risk fell back before the grace period ended; nothing to do", alert_id
                )
                continue
            log.warning("alert %d: no SNAPSHOT_DONE within %.0f s; remediating", alert_id, self.grace_s)
            self._queue(alert, "", "")
        with self._cv:
            work, self._work = retries + self._work, []
        for task in work:
            self._attempt(task)
        return len(work)

    def _attempt(self, task: _Task) -> None:
        r = task.remediation
        if not task.claimed and (
            self._taken_out_for(r.node, r.alert_id) is not None
            or not self.store.claim_remediation(r.alert_id, r.node, self.actuator.name, json.dumps(asdict(r)))
        ):
            return
        if not task.admitted and self.paused_by is not None:
            self._finish(r, "refused", f"remediation paused by {self.paused_by}; {r.node} left in service")
            return
        # The breaker counts the node once, at its first attempt here: a retry takes out no more
        # nodes, and must not be refused because the window moved on meanwhile.
        if not task.admitted and not self.breaker.allow(r.node, self.clock()):
            detail = (
                f"circuit breaker: {self.breaker.max_nodes} nodes already taken out in "
                f"{self.breaker.window_s:.0f} s; {r.node} left in service"
            )
            self._finish(r, "refused", detail)
            return
        attempts = self.store.begin_attempt(r.alert_id, self.actuator.name)
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
            self.store.note_failed_attempt(r.alert_id, detail)
            with self._cv:
                self._retrying[r.alert_id] = replace(task, claimed=True, admitted=True)
                heapq.heappush(self._retry_at, (self.clock() + delay_s, r.alert_id))
                self._cv.notify_all()
            log.warning(
                "remediation of alert %d on %s: attempt %d of %d failed (%s); retrying in %.1f s",
                r.alert_id, r.node, attempts, self.retry.max_attempts, detail, delay_s,
            )  # fmt: skip

    def _finish(self, r: Remediation, outcome: str, detail: str) -> None:
        self.store.finish_remediation(r.alert_id, outcome, detail)
        self.metrics.remediations.labels(self.actuator.name, outcome).inc()
        with self._cv:
            self.done.append((r, outcome, detail))
            self._cv.notify_all()
        # A failure after every retry leaves a node predicted to fail in service: an operator must act.
        level = logging.ERROR if outcome == "failed" else logging.WARNING
        log.log(level, "remediation of alert %d on %s: %s (%s)", r.alert_id, r.node, outcome, detail)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Block until `count` remediations have been carried out (True) or the timeout passes."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self.done) >= count, timeout_s)

    # -- the worker -------------------------------------------------------------------------

    def start(self) -> None:
        self.resume()
        self._thread = threading.Thread(target=self._loop, name="faultcast-remediator", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping:
            self.run_once(wait_s=1.0)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
