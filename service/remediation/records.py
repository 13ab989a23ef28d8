"""What remediation keeps in the state store, and reads back: each alert's claim and attempts, its
outcome, and in the store's settings (wall-clock time, which the next process can use) the circuit
breaker's window, the grace deadlines and who paused remediation. Also what remediation reads of
alerts, acknowledgements and jobs.

A write the store refuses (full disk, I/O error; the store counts it) is raised to the caller or
answered False, for the caller to keep its work and try again; it is logged once when writes start
failing and once when they work again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import TypeVar

from faultcast.service.remediation import policy
from faultcast.service.remediation.actuators import CircuitBreaker, Remediation
from faultcast.service.state.acks import Ack
from faultcast.service.state.remediations import PendingRemediation
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")

# Settings (StateStore.settings) that carry remediation across a restart, in unix time.
GRACE_DEADLINES_KEY = "remediation_grace_deadlines"  # {opened_id: when its grace period ends}
PAUSED_BY_KEY = "remediation_paused_by"  # who paused remediation (SetRemediation)
BREAKER_WINDOW_KEY = "remediation_breaker_window"  # [[when, node], ...] admitted within the window
SEEN_THROUGH_KEY = "remediation_seen_through"  # the newest alert event the remediator has decided on


class Records:
    """Remediation's reads and writes of the state store, for one actuator."""

    def __init__(
        self, store: StateStore, actuator: str, *, clock: Clock, wall: Clock, store_retry_s: float
    ) -> None:
        """`clock` times this process; `wall` dates what is kept for the next one. `store_retry_s`:
        how soon refused work is tried again (said in the log)."""
        self.store, self.actuator, self.clock, self.wall = store, actuator, clock, wall
        self.store_retry_s = store_retry_s
        self.save_lock = threading.Lock()  # what is persisted is written in the order it was read
        self._failing = False  # for the log: one line when writes fail, one when they work again
        self._breaker_saved: list[tuple[float, str]] = []  # the breaker's window as last written

    # -- writes the store may refuse -----------------------------------------------------------

    def write(self, what: str, write: Callable[[], T]) -> T:
        """A store write; a refusal (full disk, I/O error; the store counts it) is raised for the
        caller to keep its work, and the first write that works after refusals is logged."""
        result = write()
        if self._failing:
            self._failing = False
            log.warning("the state database takes remediation's writes again (%s); carrying on", what)
        return result

    def trouble(self, exc: sqlite3.Error) -> None:
        """Say once that the store fails (the store counts each failed write)."""
        if not self._failing:
            self._failing = True
            log.error(
                "the state database failed remediation (%s): the work is kept and tried again every %.0f s; "
                "no node is taken out before its claim is on disk",
                exc,
                self.store_retry_s,
            )

    # -- settings: what a restart keeps ---------------------------------------------------------

    def _saved(self, key: str) -> object:
        raw = self.store.settings.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            log.error("state setting %s is unreadable (%r); going on without it", key, raw[:200])
            return None

    def paused_by(self) -> str | None:
        """Who paused remediation, as last written (None: it runs)."""
        return self.store.settings.get(PAUSED_BY_KEY)

    def restore_breaker(self, breaker: CircuitBreaker) -> None:
        """Count again the nodes earlier runs took out within the window."""
        saved = self._saved(BREAKER_WINDOW_KEY)
        now, wall = self.clock(), self.wall()
        breaker.restore(policy.window_from_disk(saved, now, wall))
        self._breaker_saved = breaker.admissions(now)

    def save_breaker(self, breaker: CircuitBreaker) -> None:
        """Write the breaker's window when it changed; raises when the store refuses."""
        now, wall = self.clock(), self.wall()
        with self.save_lock:
            taken = breaker.admissions(now)
            if taken == self._breaker_saved:
                return
            value = json.dumps(policy.window_on_disk(taken, now, wall)) if taken else None
            self.write(
                "the circuit breaker's window", lambda: self.store.settings.save(BREAKER_WINDOW_KEY, value)
            )
            self._breaker_saved = taken

    def restore_grace(self, timers: policy.GraceTimers, grace_s: float) -> None:
        """Arm the grace timers an earlier run left, at their original deadlines."""
        saved = self._saved(GRACE_DEADLINES_KEY)
        timers.restore(saved, self.clock(), self.wall(), grace_s)

    def save_grace(self, due: dict[str, float]) -> bool:
        """Write the grace deadlines (`GraceTimers.on_disk`; the save lock held); False when refused."""
        value = json.dumps(due) if due else None
        try:
            self.write("grace deadlines", lambda: self.store.settings.save(GRACE_DEADLINES_KEY, value))
        except sqlite3.OperationalError as exc:  # the timers still run here; only a kill would lose them
            self.trouble(exc)
            return False
        return True

    def seen_through(self) -> int:
        """The newest event an earlier run's remediator decided on (0: none kept)."""
        saved = self._saved(SEEN_THROUGH_KEY)
        return saved if isinstance(saved, int) and not isinstance(saved, bool) else 0

    def save_seen(self, event_id: int) -> None:
        """Keep the newest event decided on (after the grace deadlines it led to); a refusal is said
        and costs only a second look at a start."""
        try:
            self.write("events seen", lambda: self.store.settings.save(SEEN_THROUGH_KEY, str(event_id)))
        except sqlite3.OperationalError as exc:
            self.trouble(exc)

    def save_pause(self, by: str | None) -> bool:
        """Write who paused (the save lock held); False when refused."""
        try:
            self.write("remediation pause", lambda: self.store.settings.save(PAUSED_BY_KEY, by))
        except sqlite3.OperationalError as exc:
            self.trouble(exc)
            log.error("%s: the remediation pause is in force but would not outlive a restart yet", exc)
            return False
        return True

    # -- alerts, acknowledgements and jobs ------------------------------------------------------

    def newest(self, alert_id: int) -> apb.Alert | None:
        """The newest event of the alert that event `alert_id` belongs to (its CLEARED event once it
        has cleared, which still names the node and the last recommended action)."""
        event = self.store.alerts.get(alert_id)
        return None if event is None else self.store.alerts.newest_event(event.opened_id or event.id)

    def record_ack(self, ack: Ack) -> None:
        self.store.acks.record(ack)

    def open_alerts(self) -> list[apb.Alert]:
        """Every alert open now (its newest event)."""
        return self.store.alerts.open_now()

    def declined(self, opened_id: int) -> bool:
        return policy.declined(self.store.acks.of(opened_id))

    def risk_fell(self, opened_id: int) -> bool:
        return policy.risk_fell(self.store.alerts.cleared_event(opened_id))

    def holds_node(self, alert_id: int, outcome: str) -> bool:
        """Whether the alert still keeps its node taken out (`policy.holds_node`)."""
        event = self.store.alerts.get(alert_id)
        failed = event is not None and event.kind == apb.EVENT_KIND_FAILED
        cleared = None if failed else self.store.alerts.cleared_event(alert_id)  # a FAILED event never clears
        return policy.holds_node(event, outcome, cleared)

    def job_on(self, node: str) -> str:
        """The registered job that runs on `node` ("" when none does)."""
        jobs = self.store.jobs.on_node(node)
        return jobs[0] if jobs else ""

    def jobs_on(self, node: str) -> list[str]:
        """Every registered job that runs on `node`, sorted."""
        return self.store.jobs.on_node(node)

    def recent_failures(self, since_unix: float) -> list[apb.Alert]:
        """The FAILED events that drain their node and happened at or after `since_unix`."""
        since_ns = int(since_unix * 1e9)
        return [
            e for e in self.store.alerts.failures() if e.failure.drains_node and e.time_unix_nano >= since_ns
        ]

    def taken_out_since(self, node: str, since_unix: float) -> list[int]:
        """The alerts `node` was taken out for (or is being) since `since_unix` (wall clock)."""
        return self.store.remediations.taken_out_since(node, since_unix)

    # -- claims, attempts and outcomes ----------------------------------------------------------

    def outcome_of(self, opened_id: int) -> tuple[str, str] | None:
        """(outcome, detail) of the alert's claim; None when it was never claimed."""
        return self.store.remediations.of(opened_id)

    def claimed_on(self, node: str) -> list[tuple[int, str]]:
        """(alert, outcome) of every claim on `node`."""
        return self.store.remediations.on_node(node)

    def pending(self) -> list[PendingRemediation]:
        """The remediations claimed and not finished (retrying, or cut off by a kill)."""
        return self.store.remediations.pending()

    def stored_request(self, opened_id: int) -> Remediation | None:
        """The remediation claimed for the alert; None when none can be read."""
        try:
            return Remediation(**json.loads(self.store.remediations.request_of(opened_id)))
        except (ValueError, TypeError):
            return None

    def read_request(self, pending: PendingRemediation) -> Remediation | str:
        """The stored request of a pending remediation, or why it cannot be read."""
        try:
            return Remediation(**json.loads(pending.request))
        except (ValueError, TypeError) as exc:  # a row from a version that stored no request
            return "no stored request" if not pending.request else f"unreadable request ({exc})"

    def claim(self, r: Remediation) -> bool:
        """Claim the alert on disk with its request; False when it was claimed before. Raises when
        the store refuses."""
        request = json.dumps(asdict(r))
        return self.write(
            "a claim",
            lambda: self.store.remediations.claim(
                r.alert_id, r.node, self.actuator, request, at_unix=self.wall()
            ),
        )

    def begin_attempt(self, alert_id: int) -> int:
        """Count an attempt on disk before it is made; how many were begun. Raises when refused."""
        return self.write(
            "an attempt", lambda: self.store.remediations.begin_attempt(alert_id, self.actuator)
        )

    def note_failed_attempt(self, alert_id: int, detail: str) -> None:
        """Keep why an attempt failed; only the reason is lost when the store refuses."""
        try:
            self.write(
                "why an attempt failed",
                lambda: self.store.remediations.note_failed_attempt(alert_id, detail, at_unix=self.wall()),
            )
        except sqlite3.OperationalError as exc:
            self.trouble(exc)

    def store_outcome(self, r: Remediation, outcome: str, detail: str) -> bool:
        """Write the outcome; False when the store refused it (the caller keeps it)."""
        try:
            self.write(
                "an outcome",
                lambda: self.store.remediations.finish(r.alert_id, outcome, detail, at_unix=self.wall()),
            )
        except sqlite3.OperationalError as exc:
            self.trouble(exc)
            return False
        return True

    def forget_handed_over(self, r: Remediation) -> None:
        """The job ended on the drained node and its standby registered under its own id: without this
        the node would stay the old job's, and a later alert there would remediate a job long gone."""
        try:
            self.write("a job's end", lambda: self.store.jobs.forget(r.job_id))
        except sqlite3.OperationalError as exc:  # StateWriteError too: the store counted it
            log.warning("job %s, handed over to %s, stays registered: %s", r.job_id, r.handover_to, exc)
