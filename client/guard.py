"""The trainer's side of faultcast: a `Guard` watches the service's alerts for this job's nodes and
tells the training loop when to snapshot, then acknowledges the snapshot so the service can move
the job off the doomed node.

It subscribes on a background thread, reconnects with backoff and resumes after the last alert id it
saw, and never raises into the training loop: while the service is unreachable, training goes on,
and a warning (log line, `faultcast_client_connected` 0) says so.

    guard = Guard("faultcast:50051", job_id=os.environ["SLURM_JOB_ID"]).start()
    for step in range(start, steps):
        train_step()
        if guard.should_snapshot():
            uri = save_snapshot(step)
            guard.snapshot_done(step, uri)

A failure that has happened on any node of the job (a FAILED event: a critical Xid, a GPU lost, the
node gone silent, or a rank's report through `report_failure`) is kept in `failures` and handed to
`on_failure` at once, on the guard's thread: the place to end a collective that will never complete
(the NCCL watchdog would wait minutes) so the job restarts now. Warnings (alerts) are acted on only
for the guard's own nodes.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from faultcast.actions import action_rank, asks_snapshot
from faultcast.alert_text import alert_summary
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)


def _covers(taken_for: apb.Alert, pending: apb.Alert) -> bool:
    """True when a snapshot taken for `taken_for` answers `pending` too: the same event, or a later
    event of the same alert that asks for no more (a re-estimate of risk, mode or time to failure).
    Without this, re-estimates arriving during each write would ask for snapshot after snapshot."""
    if pending.id == taken_for.id:
        return True
    same_alert = (pending.opened_id or pending.id) == (taken_for.opened_id or taken_for.id)
    return same_alert and action_rank(pending.action) <= action_rank(taken_for.action)


# Waits before sending an acknowledgement again after UNAVAILABLE (then it is given up, logged).
_ACK_RETRY_S = (0.25, 0.5, 1.0, 2.0)


def channel_to(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    """A channel to the service: TLS (and a token) when credentials are given, else plaintext."""
    return (
        grpc.secure_channel(target, credentials) if credentials is not None else grpc.insecure_channel(target)
    )


class Guard:
    """Watches the service's alerts for this job's nodes on a background thread and turns those that
    ask for a snapshot into one pending request for the training loop. Thread-safe; the loop's calls
    are cheap and never raise, whether or not the service is reachable."""

    def __init__(
        self,
        target: str,
        job_id: str,
        nodes: Sequence[str] | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        register: bool = True,
        job_nodes: Sequence[str] | None = None,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        rpc_timeout_s: float = 5.0,
        registry: CollectorRegistry | None = None,
        stands_by: bool = False,
        on_failure: Callable[[apb.Alert], None] | None = None,
        replaces_nodes: bool = False,
    ) -> None:
        """`nodes`: the nodes this process watches (default: this host); `register`: tell the service
        the job runs on `job_nodes` (default: `nodes`; a multi-node job names all of its nodes, since
        each registration replaces the last); `stands_by`: the trainer can stand by on a spare and
        take over at a snapshot (faultcast.client.standby), so the service may ready one;
        `on_failure`: called with each FAILED event of a watched node, on the guard's thread (an
        exception it raises is logged). `replaces_nodes`: the job replaces a lost or warned node itself
        (faultcast.client.elastic): the service drains such a node and never requeues the job. No
        I/O here: `start()` connects."""
        self.stands_by, self.on_failure, self.replaces_nodes = stands_by, on_failure, replaces_nodes
        self.failures: list[apb.Alert] = []  # FAILED events of the watched nodes, oldest first
        self.target, self.job_id = target, job_id
        self.nodes = list(nodes) if nodes is not None else [socket.gethostname()]
        self.job_nodes = list(job_nodes) if job_nodes is not None else self.nodes
        self.credentials, self.register, self.backoff_s, self.rpc_timeout_s = (
            credentials,
            register,
            backoff_s,
            rpc_timeout_s,
        )
        self.last_id = 0  # the resume cursor: the newest alert event seen
        self.connected = False
        self.caught_up = False  # the current subscription has delivered its replay
        self.model: apb.ModelInfo | None = None  # the serving model, from the latest caught-up marker
        self.last_error = ""
        self._pending: apb.Alert | None = None  # the newest snapshot request not yet acted on
        self._asked: dict[int, int] = {}  # alert (opened_id) -> the strongest action it asked for
        self._warnings: dict[int, apb.Alert] = {}  # open alerts of this process's nodes asking for protection
        self.pending_since = 0.0  # time.monotonic() when the pending request first arrived
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None
        self._call: grpc.Call | None = None
        registry = registry or CollectorRegistry()
        self.metric_connected = Gauge(
            "faultcast_client_connected",
            "1 while the trainer's guard is subscribed to the faultcast service.",
            registry=registry,
        )
        self.metric_alerts = Counter(
            "faultcast_client_alerts",
            "Alert events the trainer's guard received, by state.",
            ["state"],
            registry=registry,
        )

    # -- the training loop's side: cheap, never raises ------------------------------------------

    def should_snapshot(self) -> bool:
        """True when an alert on this job's nodes asks for a snapshot that has not been taken."""
        return self._pending is not None

    def protecting(self) -> bool:
        """True while an alert on this process's nodes that asks for a snapshot is open (either tier):
        the job keeps its replicas frequent until it clears."""
        with self._lock:
            return bool(self._warnings)

    def pending(self) -> apb.Alert | None:
        """The newest alert event asking for a snapshot not yet taken (or declined), else None."""
        with self._lock:
            return self._pending

    def snapshot_done(self, step: int, uri: str, taken_for: apb.Alert | None = None) -> str:
        """Acknowledge the pending alert with SNAPSHOT_DONE; returns what the service will do (or
        why nothing was sent). Clears the request either way: the state is safe. With `taken_for`
        (the alert event the snapshot was taken for), a newer event pending since (an escalation, a
        new alert) is neither acknowledged with this older snapshot nor cleared: it gets its own. A
        newer event of the same alert that asks for no more (a re-estimate) is answered by it."""
        with self._lock:
            if taken_for is not None and self._pending is not None and not _covers(taken_for, self._pending):
                return f"not sent: alert event {self._pending.id} came after the snapshot's {taken_for.id}"
            alert, self._pending = self._pending, None
        if alert is None:
            return "no alert pending"
        return self._acknowledge(alert, apb.ACK_ACTION_SNAPSHOT_DONE, step, uri)

    def decline(self, step: int) -> str:
        """Refuse the pending alert (the operator decides what happens to the node)."""
        with self._lock:
            alert, self._pending = self._pending, None
        if alert is None:
            return "no alert pending"
        return self._acknowledge(alert, apb.ACK_ACTION_DECLINED, step, "")

    def _acknowledge(self, alert: apb.Alert, action: apb.AckAction.ValueType, step: int, uri: str) -> str:
        channel = self._channel
        if channel is None:
            return "not connected: acknowledgement not sent"
        request = apb.AcknowledgeRequest(
            alert_id=alert.id, job_id=self.job_id, action=action, step=step, checkpoint_uri=uri
        )
        stub = apb_grpc.AlertsStub(channel)
        attempt = 0
        while True:
            try:
                return stub.Acknowledge(request, timeout=self.rpc_timeout_s).remediation
            except grpc.RpcError as exc:
                # UNAVAILABLE: the service kept nothing (its state disk refused the write, or it is
                # restarting); a DECLINED or SNAPSHOT_DONE lost here would let a grace timer drain
                # the node regardless, so it is sent again a few times.
                retry = isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE
                if not retry or attempt == len(_ACK_RETRY_S):
                    log.warning("faultcast: acknowledging alert %d failed: %s", alert.id, _describe(exc))
                    return f"acknowledgement failed: {_describe(exc)}"
                delay_s = _ACK_RETRY_S[attempt]
                log.info(
                    "faultcast: acknowledging alert %d: %s; again in %.2f s",
                    alert.id,
                    _describe(exc),
                    delay_s,
                )
                if self._stop.wait(delay_s):  # a retry delay that close() cuts short
                    log.warning(
                        "faultcast: acknowledging alert %d abandoned: guard closed (last answer %s)",
                        alert.id,
                        _describe(exc),
                    )
                    return f"acknowledgement failed: guard closed (last answer {_describe(exc)})"
                attempt += 1

    # -- the background subscription ------------------------------------------------------------

    def start(self) -> Guard:
        """Start the background subscription (register, subscribe, reconnect with backoff) and return
        self; call once. Logs a warning when there are no credentials (plaintext)."""
        if self.credentials is None:
            log.warning(
                "faultcast: the guard talks to %s in plaintext without identity; in production give "
                "credentials=faultcast.tls.channel_credentials(ca, token=...) (or a client certificate)",
                self.target,
            )
        self._thread = threading.Thread(target=self._run, name="faultcast-guard", daemon=True)
        self._thread.start()
        return self

    def wait_connected(self, timeout_s: float, *, connected: bool = True) -> bool:
        """Block until the guard is (or is no longer) subscribed; for tests and startup scripts."""
        with self._changed:
            return self._changed.wait_for(lambda: self.connected == connected, timeout_s)

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Block until the current subscription has replayed what it asked for (the service's
        caught-up marker): what follows is live."""
        with self._changed:
            return self._changed.wait_for(lambda: self.caught_up, timeout_s)

    def wait_seen(self, event_id: int, timeout_s: float) -> bool:
        """Block until the guard has taken the event with this id (or a later one); for tests and tools."""
        with self._changed:
            return self._changed.wait_for(lambda: self.last_id >= event_id, timeout_s)

    def wait_failed(self, timeout_s: float) -> apb.Alert | None:
        """Block until a FAILED event of a watched node has come; the newest, or None on timeout."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self.failures), timeout_s)
            return self.failures[-1] if self.failures else None

    def report_failure(
        self, what: apb.TrainerFailure.ValueType, *, node: str | None = None, rank: int = -1, detail: str = ""
    ) -> int:
        """Tell the service a rank died or the NCCL watchdog fired on `node` (default: the first
        watched node): every rank of the job hears it as a FAILED event. Returns the event's id
        (that of the failure the node already has, when one is known), 0 when not sent (logged)."""
        channel = self._channel
        if channel is None:
            log.warning("faultcast: not connected: failure report not sent")
            return 0
        request = apb.ReportFailureRequest(
            job_id=self.job_id, node=node or self.nodes[0], what=what, rank=rank, detail=detail
        )
        try:
            return apb_grpc.AlertsStub(channel).ReportFailure(request, timeout=self.rpc_timeout_s).alert_id
        except grpc.RpcError as exc:
            log.warning("faultcast: reporting the failure failed: %s", _describe(exc))
            return 0

    def wait_for_alert(self, timeout_s: float) -> apb.Alert | None:
        """Block until a snapshot request is pending; None on timeout."""
        with self._changed:
            self._changed.wait_for(lambda: self._pending is not None, timeout_s)
            return self._pending

    def close(self) -> None:
        """Stop the subscription and close the channel; waits up to 10 s for the thread."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Guard:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._stop.is_set():
            try:
                self._subscribe()
                delay = self.backoff_s[0]  # the stream ended cleanly (service shutdown): retry soon
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                self._set_connected(False, _describe(exc))
            except Exception as exc:  # never let the guard die silently, never raise into training
                log.exception("faultcast: guard error")
                self._set_connected(False, f"{type(exc).__name__}: {exc}")
            self._set_connected(False, self.last_error)
            if self._stop.wait(delay):  # a retry delay, not synchronisation
                break
            delay = min(delay * 2, self.backoff_s[1])

    def _subscribe(self) -> None:
        if self._channel is None:
            self._channel = channel_to(self.target, self.credentials)
        stub = apb_grpc.AlertsStub(self._channel)
        if self.register:
            stub.RegisterJob(
                apb.RegisterJobRequest(
                    job_id=self.job_id,
                    nodes=self.job_nodes,
                    stands_by=self.stands_by,
                    replaces_nodes=self.replaces_nodes,
                ),
                timeout=self.rpc_timeout_s,
            )
        # A first subscription (cursor 0) starts from the alerts open now: nothing stale to act on.
        call = stub.Subscribe(
            apb.SubscribeRequest(job_id=self.job_id, nodes=self.watched(), resume_after=self.last_id)
        )
        self._call = call
        self._set_connected(True, "")
        try:
            for event in call:
                if event.HasField("alert"):
                    self._take(event.alert)
                elif event.HasField("caught_up"):
                    self._caught_up(event.caught_up)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                # The service's log is behind our cursor: its state was lost, or it is another
                # service. Start over from the alerts open there now.
                log.warning(
                    "faultcast: the service refused cursor %d (%s); resubscribing from its open alerts",
                    self.last_id,
                    exc.details(),
                )
                with self._lock:
                    self.last_id = 0
                    # Ids there may repeat ours: what was asked of us here says nothing about them.
                    self._asked.clear()
                    self._warnings.clear()  # the open alerts come again from the new subscription
                    self._pending = None
            raise

    def _caught_up(self, marker: apb.CaughtUp) -> None:
        model = marker.model
        # Logged before waiters wake: whoever waited on the catch-up finds the line already there.
        log.info(
            "faultcast: caught up at alert %d; model %s (horizon %.0f s, alert at risk %.3g, hold above "
            "%.3g, %d scores to open, %d to clear, one score per %.0f s)",
            marker.head_id,
            model.version,
            model.horizon_seconds,
            model.threshold,
            model.hold_threshold,
            model.open_after_scores,
            model.clear_after_scores,
            model.cadence_seconds,
        )
        with self._changed:
            # Everything up to the head was delivered: a reconnect resumes after it, not from 0.
            self.last_id = max(self.last_id, marker.head_id)
            self.caught_up, self.model = True, marker.model
            self._changed.notify_all()

    def watched(self) -> list[str]:
        """The nodes subscribed to: this process's own (whose alerts it acts on) and every node of
        the job (whose failures end the job's collectives too, so they are heard as well)."""
        return sorted(set(self.nodes) | set(self.job_nodes))

    def _take(self, alert: apb.Alert) -> None:
        self.metric_alerts.labels(apb.AlertState.Name(alert.state)).inc()
        if alert.kind == apb.EVENT_KIND_FAILED:
            self._failed(alert)
            return
        if alert.node not in self.nodes:  # another node's warning: its own guard acts on it
            with self._changed:
                self.last_id = max(self.last_id, alert.id)
                self._changed.notify_all()
            return
        with self._changed:
            self.last_id = max(self.last_id, alert.id)
            pending = self._pending
            key = alert.opened_id or alert.id
            asked = action_rank(alert.action)
            if alert.state == apb.ALERT_STATE_OPEN and asks_snapshot(alert.action):
                self._warnings[key] = alert
            else:
                self._warnings.pop(key, None)
            if (
                alert.state == apb.ALERT_STATE_OPEN
                and asks_snapshot(alert.action)
                and (asked > self._asked.get(key, 0) or (pending is not None and pending.opened_id == key))
            ):
                # One snapshot per alert and action: an update that only re-estimates the mode or the
                # time to failure asks for nothing new; one that escalates to snapshot-and-migrate
                # asks again (the service drains once it hears SNAPSHOT_DONE).
                if pending is None:
                    self.pending_since = time.monotonic()
                self._asked[key] = max(asked, self._asked.get(key, 0))
                self._pending = alert  # the newest event of the alert waiting to be acted on
                log.warning(
                    "faultcast: alert %d on %s gpu %d: %s (%s): snapshot requested",
                    alert.id,
                    alert.node,
                    alert.gpu,
                    alert_summary(alert),  # when first, then the risk against its threshold
                    apb.RecommendedAction.Name(alert.action),
                )
            elif (
                alert.state == apb.ALERT_STATE_CLEARED
                and pending is not None
                and pending.opened_id == alert.opened_id
                # the enum, or the words of a service older than it
                and (
                    alert.clear_reason == apb.CLEAR_REASON_RISK_FELL
                    or alert.cleared_reason == "risk below threshold"
                )
            ):
                self._pending = None  # the risk fell back before the snapshot: nothing to do
            self._changed.notify_all()

    def _failed(self, alert: apb.Alert) -> None:
        """A failure happened on a watched node: kept (once, whatever the replays), told to on_failure."""
        with self._changed:
            self.last_id = max(self.last_id, alert.id)
            self._changed.notify_all()
            theirs = alert.failure.job_id and alert.failure.job_id != self.job_id  # another job's own rank
            if theirs or any(seen.id == alert.id for seen in self.failures):
                return
            self.failures.append(alert)
            self._changed.notify_all()
        log.error(
            "faultcast: FAILED on %s gpu %d (alert %d): %s",
            alert.node,
            alert.gpu,
            alert.id,
            alert.failure.detail,
        )
        if self.on_failure is not None:
            try:
                self.on_failure(alert)
            except Exception:  # the job's handler must not end the subscription
                log.exception("faultcast: on_failure raised")

    def _set_connected(self, connected: bool, error: str) -> None:
        with self._changed:
            if connected != self.connected:
                if connected:
                    log.info(
                        "faultcast: subscribed to %s for job %s (nodes %s)",
                        self.target,
                        self.job_id,
                        self.nodes,
                    )
                else:
                    log.warning(
                        "faultcast: service %s unreachable, training goes on unguarded: %s",
                        self.target,
                        error,
                    )
            self.connected, self.last_error = connected, error
            if not connected:
                self.caught_up = False
            self.metric_connected.set(1.0 if connected else 0.0)
            self._changed.notify_all()


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'error'}: {details}"
