"""Remediation's worker: a thread that fires due grace timers, runs the actuator on each queued
remediation (so a slow scheduler never holds up scoring), tries a failed attempt again after the
retry policy's backoff, and keeps the work a refused store write stopped, trying it again every
`store_retry_s`. Whether a remediation is claimed and admitted is the remediator's to say (the
`claim` and `admit` it is given); what is written goes through `Records`.
"""

from __future__ import annotations

import heapq
import logging
import random
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation import policy
from faultcast.service.remediation.actuators import Actuator, Remediation, RetryPolicy
from faultcast.service.remediation.records import Clock, Records
from faultcast.service.supervise import start_supervised

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Task:
    """One remediation to attempt; `claimed` once its store row exists (a retry, or one resumed
    after a restart), `admitted` once this process's circuit breaker has counted its node, `grace`
    when its grace timer queued it (the deadline stays on disk until the claim is)."""

    remediation: Remediation
    claimed: bool = False
    admitted: bool = False
    grace: bool = False


@dataclass(frozen=True, slots=True)
class Steps:
    """What the worker asks of the remediator: `claim` a task on disk (False: not remediated here),
    `admit` a remediation past the pause and the circuit breaker (None, or why not: the worker
    finishes it as refused), `fire` a due grace timer, `resume` what an earlier run left, `save_settings` (the grace
    deadlines and pause, once the store is not being waited for)."""

    claim: Callable[[Task], bool]
    admit: Callable[[Remediation], str | None]
    fire: Callable[[int], None]
    resume: Callable[[], int]
    save_settings: Callable[[], None]


class Worker:
    """Runs queued remediations, their retries and the refused writes, on its own thread (or in
    `run_once`, for tests). Its state is guarded by `cv`, the remediator's lock."""

    def __init__(
        self,
        records: Records,
        actuator: Actuator,
        metrics: ServiceMetrics,
        timers: policy.GraceTimers,
        cv: threading.Condition,
        steps: Steps,
        *,
        retry: RetryPolicy,
        rng: random.Random,
        clock: Clock,
    ) -> None:
        self.records, self.actuator, self.metrics = records, actuator, metrics
        self.timers, self.cv, self.steps = timers, cv, steps
        self.retry, self.rng, self.clock = retry, rng, clock
        self._work: list[Task] = []
        self._retry_at: list[tuple[float, int]] = []  # (clock time, alert id): backoff timers
        self._retrying: dict[int, Task] = {}  # alert id -> the task its backoff timer runs
        self._stalled: list[Task] = []  # tasks a refused write stopped before the actuator ran
        self._unwritten: list[tuple[Remediation, str, str]] = []  # outcomes the store refused
        self._store_retry_at: float | None = None  # clock time to try refused writes again
        self._stopped = threading.Event()  # stop(): the worker and its supervisor end
        self._thread: threading.Thread | None = None
        self.done: list[tuple[Remediation, str, str]] = []  # (what, outcome, detail), in order

    def queue(self, tasks: list[Task]) -> None:
        with self.cv:
            self._work.extend(tasks)
            self.cv.notify_all()

    def retries_pending(self) -> int:
        return len(self._retrying)

    def retry_store_later(self) -> None:
        """Try refused writes again after store_retry_s (the lock held)."""
        at = self.clock() + self.records.store_retry_s
        if self._store_retry_at is None or at < self._store_retry_at:
            self._store_retry_at = at
        self.cv.notify_all()

    def _timeout(self, wait_s: float) -> float:
        """How long the worker may sleep: until the next timer, at most `wait_s` (the lock held)."""
        now = self.clock()
        timers = (
            self.timers.next_due(),
            self._retry_at[0][0] if self._retry_at else None,
            self._store_retry_at,
        )
        nexts = [at for at in timers if at is not None]
        return min([wait_s, *(max(0.0, at - now) for at in nexts)])

    def _refused_due(self) -> tuple[list[Task], list[tuple[Remediation, str, str]]]:
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
        with self.cv:
            if wait_s > 0 and not self._work and not self._stopped.is_set():
                self.cv.wait(self._timeout(wait_s))
            due = self.timers.due(self.clock())
            backoffs = policy.due_ids(self._retry_at, self.clock())
            retries = [self._retrying.pop(alert_id) for alert_id in backoffs]
            stalled, unwritten = self._refused_due()
        for r, outcome, detail in unwritten:
            if self._store_outcome(r, outcome, detail):
                self._finished(r, outcome, detail)
        self._fire_all(due)
        with self.cv:
            work, self._work = retries + stalled + self._work, []
        self._attempt_all(work)
        with self.cv:
            backing_off = self._store_retry_at is not None
        if not backing_off:
            self.steps.save_settings()
        return len(work)

    def _fire_all(self, due: list[int]) -> None:
        for i, alert_id in enumerate(due):
            try:
                self.steps.fire(alert_id)
            except sqlite3.OperationalError as exc:  # the store could not be read: look again later
                self.records.trouble(exc)
                with self.cv:
                    self.timers.look_again(alert_id, self.clock() + self.records.store_retry_s)
            except BaseException:
                with self.cv:  # the timers not yet looked at stay armed (firing again queues nothing twice)
                    for later in due[i:]:
                        self.timers.look_again(later, self.clock())
                raise

    def _attempt_all(self, work: list[Task]) -> None:
        for i, task in enumerate(work):
            try:
                self._attempt(task)
            except BaseException:
                # The tasks not yet tried are kept; the one that raised is on disk if it was claimed,
                # for the next start (trying it again here might drain twice).
                with self.cv:
                    self._work[:0] = work[i + 1 :]
                raise

    def _attempt(self, task: Task) -> None:
        r = task.remediation
        try:
            if not task.claimed:
                if not self.steps.claim(task):
                    return
                task = replace(task, claimed=True)
            if not task.admitted:
                refused = self.steps.admit(r)
                if refused is not None:
                    self.finish(r, "refused", refused)
                    return
                task = replace(task, admitted=True)
            attempts = self.records.begin_attempt(r.alert_id)
        except sqlite3.OperationalError as exc:  # nothing done yet: again once the store takes writes
            self.records.trouble(exc)
            with self.cv:
                self._stalled.append(task)
                self.retry_store_later()
            return
        self._act(task, attempts)

    def _act(self, task: Task, attempts: int) -> None:
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
        verdict = policy.attempt_verdict(ok, detail, attempts, self.retry.max_attempts)
        if verdict.outcome != "retry":
            self.finish(r, verdict.outcome, verdict.detail)
            return
        delay_s = self.retry.delay_s(attempts, self.rng.random())
        self.records.note_failed_attempt(r.alert_id, detail)  # only the reason is lost when refused
        with self.cv:
            self._retrying[r.alert_id] = replace(task, claimed=True, admitted=True)
            heapq.heappush(self._retry_at, (self.clock() + delay_s, r.alert_id))
            self.cv.notify_all()
        log.warning(
            "remediation of alert %d on %s: attempt %d of %d failed (%s); retrying in %.1f s",
            r.alert_id,
            r.node,
            attempts,
            self.retry.max_attempts,
            detail,
            delay_s,
        )

    def finish(self, r: Remediation, outcome: str, detail: str) -> None:
        """The remediation ended (`outcome`): on disk, or kept until the store takes it."""
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
        if self.records.store_outcome(r, outcome, detail):
            return True
        with self.cv:
            self._unwritten.append((r, outcome, detail))
            self.retry_store_later()
        return False

    def _finished(self, r: Remediation, outcome: str, detail: str) -> None:
        """The outcome is on disk: count it, and say it."""
        self.metrics.remediations.labels(self.actuator.name, outcome).inc()
        with self.cv:
            self.done.append((r, outcome, detail))
            self.cv.notify_all()
        # A failure after every retry leaves a node predicted to fail in service: an operator must act.
        level = logging.ERROR if outcome == "failed" else logging.WARNING
        log.log(level, "remediation of alert %d on %s: %s (%s)", r.alert_id, r.node, outcome, detail)
        if outcome == "ok" and r.handover_to:
            self.records.forget_handed_over(r)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Block until `count` remediations have been carried out (True) or the timeout passes."""
        with self.cv:
            return self.cv.wait_for(lambda: len(self.done) >= count, timeout_s)

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        """Resume what a previous run left unfinished, then start the thread."""
        try:
            self.steps.resume()
        except sqlite3.OperationalError as exc:  # the thread tries again
            self.records.trouble(exc)
        # Supervised like the service's other threads: a bug, or the store failing where nothing
        # expected it, restarts the loop (what was not yet tried is kept: run_once puts it back).
        self._thread = start_supervised("remediator", self._loop, self._stopped, self._restarted)

    def _restarted(self, thread: str) -> None:
        self.metrics.thread_restarts.labels(thread).inc()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self.steps.resume()
            self.run_once(wait_s=1.0)

    def stop(self) -> None:
        """Stop the thread (what is pending stays in the store for the next start)."""
        self._stopped.set()
        with self.cv:
            self.cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
