"""When to take a node out: an alert event recommending snapshot-and-migrate, on a node that runs
a registered job, is remediated once the job acknowledges it with SNAPSHOT_DONE (its state is safe),
or once `grace_s` passes with no SNAPSHOT_DONE (the hardware must go anyway; the job restarts from
its last checkpoint) unless the alert cleared because the risk fell. A DECLINED acknowledgement
leaves the node to the operator; a SNAPSHOT_DONE for a snapshot-only alert is noted and the node
stays. Each alert is remediated at most once, across restarts; the circuit breaker caps nodes per
window; actuators run on a worker thread so a slow scheduler never holds up scoring.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Sequence

from faultcast.service.alerting import PB_TO_MODE
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation import Actuator, CircuitBreaker, Remediation
from faultcast.service.state import Ack, StateStore
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class Remediator:
    def __init__(
        self,
        store: StateStore,
        actuator: Actuator,
        metrics: ServiceMetrics,
        *,
        grace_s: float = 300.0,
        breaker: CircuitBreaker | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.store, self.actuator, self.metrics = store, actuator, metrics
        self.grace_s, self.clock = grace_s, clock
        self.breaker = breaker or CircuitBreaker()
        self._deadlines: list[tuple[float, int]] = []  # (clock time, alert id): grace timers
        self._work: list[Remediation] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.done: list[tuple[Remediation, str, str]] = []  # (what, outcome, detail), in order
        # Every outcome exists from the start, so the first failure shows in increase().
        for outcome in ("ok", "failed", "refused"):
            metrics.remediations.labels(actuator.name, outcome)
        metrics.circuit_open.set_function(lambda: 1.0 if self.breaker.is_open(self.clock()) else 0.0)

    # -- inputs -----------------------------------------------------------------------------

    def on_alerts(self, alerts: Sequence[apb.Alert]) -> None:
        """A listener on the alert book: start the grace timer of each alert that may need it."""
        with self._cv:
            for alert in alerts:
                migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
                if alert.state == apb.ALERT_STATE_OPEN and migrate and self._job_on(alert.node):
                    heapq.heappush(self._deadlines, (self.clock() + self.grace_s, alert.id))
            self._cv.notify_all()

    def on_ack(self, ack: Ack) -> str:
        """Record an acknowledgement; returns what the service will do, in words."""
        self.store.record_ack(ack)
        alert = self.store.get(ack.alert_id)
        if alert is None:
            return f"no alert {ack.alert_id}"
        if ack.action == apb.ACK_ACTION_DECLINED:
            return f"declined: {alert.node} stays in service; the operator decides"
        migrate = alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        if not migrate:
            what = apb.RecommendedAction.Name(alert.action)
            return f"noted; alert {alert.id} recommends {what}: {alert.node} stays in service"
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
        if self.store.remediation(alert.opened_id) is not None:
            return f"alert {alert.opened_id} is already remediated"
        remediation = Remediation(
            alert_id=alert.opened_id, node=alert.node, gpu=alert.gpu, mode=PB_TO_MODE.get(alert.mode, "unknown"),
            risk=alert.risk, job_id=job, requeue=True, checkpoint_uri=checkpoint_uri,
        )  # fmt: skip
        with self._cv:
            self._work.append(remediation)
            self._cv.notify_all()
        return f"{self.actuator.name}: drain {alert.node} and requeue job {job}"

    def _due(self) -> list[int]:
        now = self.clock()
        due = []
        while self._deadlines and self._deadlines[0][0] <= now:
            due.append(heapq.heappop(self._deadlines)[1])
        return due

    def run_once(self, wait_s: float = 0.0) -> int:
        """Fire due grace timers and carry out queued remediations; returns how many ran."""
        with self._cv:
            if wait_s > 0 and not self._work and not self._stopping:
                timeout = wait_s
                if self._deadlines:
                    timeout = min(wait_s, max(0.0, self._deadlines[0][0] - self.clock()))
                self._cv.wait(timeout)
            due = self._due()
        for alert_id in due:
            alert = self.store.get(alert_id)
            acks = self.store.acks(alert_id)
            if alert is None or any(
                a.action in (apb.ACK_ACTION_SNAPSHOT_DONE, apb.ACK_ACTION_DECLINED) for a in acks
            ):
                continue
            log.warning("alert %d: no SNAPSHOT_DONE within %.0f s; remediating", alert_id, self.grace_s)
            self._queue(alert, "", "")
        with self._cv:
            work, self._work = self._work, []
        for r in work:
            self._carry_out(r)
        return len(work)

    def _carry_out(self, r: Remediation) -> None:
        if not self.store.claim_remediation(r.alert_id, r.node, self.actuator.name):
            return
        if not self.breaker.allow(r.node, self.clock()):
            detail = (
                f"circuit breaker: {self.breaker.max_nodes} nodes already taken out in "
                f"{self.breaker.window_s:.0f} s; {r.node} left in service"
            )
            outcome = "refused"
        else:
            try:
                result = self.actuator.remediate(r)
            except Exception as exc:  # an actuator bug must not stop remediation of others
                log.exception("actuator %s failed on alert %d", self.actuator.name, r.alert_id)
                outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
            else:
                outcome, detail = ("ok" if result.ok else "failed"), result.detail
        self.store.finish_remediation(r.alert_id, outcome, detail)
        self.metrics.remediations.labels(self.actuator.name, outcome).inc()
        with self._cv:
            self.done.append((r, outcome, detail))
            self._cv.notify_all()
        log.warning("remediation of alert %d on %s: %s (%s)", r.alert_id, r.node, outcome, detail)

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Block until `count` remediations have been carried out (True) or the timeout passes."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self.done) >= count, timeout_s)

    # -- the worker -------------------------------------------------------------------------

    def start(self) -> None:
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
