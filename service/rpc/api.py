"""The alert and admin RPCs: thin servicers over the service's parts.

Subscribe streams the durable log: first the replay the request asks for (everything after its
cursor, the alerts open now, the whole history, or nothing), then one CaughtUp marker naming the
log's head and the serving model, then new events as they are appended. The replay ends at the head
read when the subscription opened and the live part starts after it, so no event is lost or sent
twice at the boundary; a subscriber that reconnects with its last id (even to a restarted service)
misses nothing. Delivery is at-least-once across reconnects: a subscriber dedupes by id.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar, TypeVarTuple

import grpc

from faultcast.failure_signs import Evidence, FailureSign
from faultcast.model.artifact import FaultModel
from faultcast.service.failure_events import TrainerReport
from faultcast.service.label_desk import LabelDesk, LabelRefusedError
from faultcast.service.model_info import model_info
from faultcast.service.model_registry import Refusal as RegistryRefusal
from faultcast.service.model_registry import RegisteredModel, RegistryRefusedError
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.remediation.spares.prescheduler import (
    MAX_WAIT_S,
    HandOverReply,
    Prescheduler,
    StandbyRefused,
)
from faultcast.service.rpc.auth import AccessPolicy, AuthError, Principal, Role, current, refuse
from faultcast.service.rpc.limits import CallerLimits, OpenCount
from faultcast.service.rpc.validation import is_host_name
from faultcast.service.scoring import model_version
from faultcast.service.shadow import Shadow
from faultcast.service.shadow_compare import Comparison, Outcome
from faultcast.service.state.acks import Ack
from faultcast.service.state.db import MAX_STORED_INT, StateWriteError
from faultcast.service.state.models import ModelEvent, ModelEventKind
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

_POLL_S = 0.5  # how often a quiet stream checks that its subscriber is still there
HAND_OVER_POLL_S = 0.02  # how often a held AwaitHandOver looks for its answer (GO costs at most this)
_BATCH = 1000  # events read from the log at a time
_SQL_NODES = 64  # a live stream's nodes are filtered by SQLite up to this many, beyond by Python
HEAD_ID_KEY = "faultcast-head-id"  # trailing metadata of an OUT_OF_RANGE refusal: the log's head
_ACK_ACTIONS = ", ".join(name for name, value in apb.AckAction.items() if value != apb.ACK_ACTION_UNSPECIFIED)
_STARTS = ", ".join(apb.StartFrom.keys())
_TRAINER_FAILURES = ", ".join(
    name for name, value in apb.TrainerFailure.items() if value != apb.TRAINER_FAILURE_UNSPECIFIED
)
_DETAIL_CHARS = 1024  # of a reported failure's words, kept in its event
_WHY_CHARS = 1024  # of an admin's reason for a registry change
_REFUSAL_CODES = {
    RegistryRefusal.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    RegistryRefusal.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    RegistryRefusal.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
}
_EVENT_KINDS = {
    ModelEventKind.ADDED: apb.MODEL_EVENT_KIND_ADDED,
    ModelEventKind.PROMOTED: apb.MODEL_EVENT_KIND_PROMOTED,
    ModelEventKind.ROLLED_BACK: apb.MODEL_EVENT_KIND_ROLLED_BACK,
    ModelEventKind.SHADOWED: apb.MODEL_EVENT_KIND_SHADOWED,
    ModelEventKind.SHADOW_STOPPED: apb.MODEL_EVENT_KIND_SHADOW_STOPPED,
}

Refusal = tuple[grpc.StatusCode, str]
# A trainer's report in, (its FAILED event's id, whether the node's failure was known already) out.
ReportFailure = Callable[[FailureSign, TrainerReport], tuple[int, bool]]
SubscribeContext = grpc.aio.ServicerContext[apb.SubscribeRequest, apb.SubscribeResponse]
T = TypeVar("T")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ts = TypeVarTuple("Ts")


class Operations(Protocol):
    """What admins may do to a running service."""

    def reload(self, path: str | None) -> tuple[bool, str, str]:
        """Load the model at `path` (None: the directory the service was started with); (loaded,
        version, error)."""

    def remediation_settings(self) -> apb.RemediationSettings:
        """Whether remediation is paused, and the circuit breaker's limits."""

    def set_remediation(self, request: apb.SetRemediationRequest, by: str) -> apb.RemediationSettings:
        """Apply an admin's change (`by` names the admin); ValueError on bad values."""

    @property
    def model(self) -> FaultModel:
        """The model serving now."""

    def list_models(self) -> tuple[list[RegisteredModel], list[ModelEvent]]:
        """The model registry's models and log."""

    def add_model(self, path: str, by: str, why: str) -> tuple[RegisteredModel, bool]:
        """Add a model to the registry: (its entry, whether it was there already)."""

    def promote_model(self, model_id: str, by: str, why: str, force: bool = False) -> ModelEvent:
        """Serve a registered model now (the shadowed challenger only when better, or with `force`)."""

    def shadow_model(self, model_id: str, by: str, why: str) -> ModelEvent:
        """Score a registered model beside the serving one."""

    def stop_shadow(self, by: str, why: str) -> ModelEvent:
        """End the shadow."""

    def compare_shadow(self) -> Comparison:
        """The shadowed challenger against the serving model."""

    @property
    def shadow(self) -> Shadow | None:
        """The challenger shadowed now."""

    def rollback_model(self, by: str, why: str) -> ModelEvent:
        """Serve again the registry's model that served before."""


class AlertsServicer(apb_grpc.AlertsServicer):
    """Subscribe, Acknowledge, ListActiveAlerts, RegisterJob and AwaitHandOver over the durable
    state."""

    def __init__(
        self,
        store: StateStore,
        remediator: Remediator,
        stopping: threading.Event,
        on_subscribers: Callable[[int], None] = lambda delta: None,
        policy: AccessPolicy | None = None,
        *,
        serving_model: Callable[[], FaultModel],
        limits: CallerLimits | None = None,
        on_throttle: Callable[[str], None] = lambda what: None,
        prescheduler: Prescheduler | None = None,
        report_failure: ReportFailure | None = None,
    ) -> None:
        """`policy`: who may read and acknowledge what (None: no checks, a servicer under test);
        `serving_model`: the model serving now (it changes on reload), described in CaughtUp;
        `limits`: nodes per job and subscriptions per job, refusals reported to `on_throttle`;
        `prescheduler`: the spares AwaitHandOver answers for (None: every standby is released);
        `report_failure`: where a trainer's ReportFailure goes (None: refused, UNIMPLEMENTED)."""
        self.store, self.remediator, self.stopping = store, remediator, stopping
        self.prescheduler, self.report_failure = prescheduler, report_failure
        self.on_subscribers, self.policy, self.serving_model = on_subscribers, policy, serving_model
        self.limits, self.on_throttle = limits or CallerLimits(), on_throttle
        self.job_subscribers = OpenCount(self.limits.job_subscribers)

    def _too_many_nodes(self, named: int) -> Refusal | None:
        """More nodes than a job may hold: each Subscribe and listing filters the log by them."""
        if named <= self.limits.job_nodes:
            return None
        self.on_throttle("job_nodes")
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{named} nodes named; a job holds at most {self.limits.job_nodes}",
        )

    def _authorize(self, job_id: str, nodes: list[str], peer: str) -> Refusal | None:
        """A trainer names its own job, and only nodes registered to it; else the refusal."""
        if self.policy is None:
            return None
        try:
            registered = self.store.jobs.all().get(job_id, [])
            self.policy.check_nodes(
                current(), job_id, nodes, registered, predecessors=self.store.remediations.predecessors
            )
        except AuthError as denied:
            return refuse(self.policy, denied, peer)
        return None

    def _resolve(self, job_id: str, nodes: list[str]) -> tuple[list[str], Refusal | None]:
        """The nodes a request names, or those of its registered job; else the status refusing it."""
        if nodes:
            return nodes, None
        if not job_id:
            return [], (grpc.StatusCode.INVALID_ARGUMENT, "name the nodes or a registered job id")
        registered = self.store.jobs.all().get(job_id)
        if registered is None:
            return [], (
                grpc.StatusCode.NOT_FOUND,
                f"job {job_id!r} is not registered (RegisterJob) and no nodes were named",
            )
        return registered, None

    def _nodes(self, job_id: str, nodes: list[str], context: grpc.ServicerContext) -> list[str]:
        resolved, refusal = self._resolve(job_id, nodes)
        if refusal is not None:
            context.abort(*refusal)
        return resolved

    @staticmethod
    def _check_start(request: apb.SubscribeRequest) -> Refusal | None:
        """A start choice is for new subscribers only, and must be one the API defines."""
        if request.start not in apb.StartFrom.values():
            return grpc.StatusCode.INVALID_ARGUMENT, f"start {request.start} is not one of {_STARTS}"
        if request.resume_after > 0 and request.start != apb.START_FROM_UNSPECIFIED:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"start {apb.StartFrom.Name(request.start)} with resume_after {request.resume_after}: "
                "a cursor already says where to start; send one or the other",
            )
        return None

    def _caught_up(self, head: int) -> apb.SubscribeResponse:
        return apb.SubscribeResponse(
            caught_up=apb.CaughtUp(head_id=head, model=model_info(self.serving_model()))
        )

    async def Subscribe(  # noqa: N802 (gRPC method name)
        self, request: apb.SubscribeRequest, context: SubscribeContext
    ) -> AsyncIterator[apb.SubscribeResponse]:
        """The replay `resume_after`/`start` ask for, CaughtUp, then live events.

        A coroutine on the server's event loop (a thread each would cap subscribers); waiting for
        new events happens on the loop's executor, half a second at a time."""
        # Authorization first: whether another job exists is not a stranger's business.
        refusal = self._too_many_nodes(len(request.nodes)) or self._authorize(
            request.job_id, list(request.nodes), context.peer()
        )
        nodes: list[str] = []
        if refusal is None:
            nodes, refusal = self._resolve(request.job_id, list(request.nodes))
        if refusal is None:
            refusal = self._check_start(request)
        if refusal is not None:
            await context.abort(*refusal)
        head = self.store.alerts.last_id  # the replay ends here, the live part starts after it
        if request.resume_after > head:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"resume_after {request.resume_after} is beyond the log's head {head}: the cursor "
                "comes from another service or a state that was lost; resubscribe with resume_after "
                "0 and a start choice (events up to the head may have been missed)",
                trailing_metadata=((HEAD_ID_KEY, str(head)),),
            )
        principal = current() if self.policy is not None else None
        job = request.job_id  # the job whose subscriptions this one counts against
        if job and not self.job_subscribers.enter(job):
            self.on_throttle("job_subscribers")
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"job {job!r} has {self.limits.job_subscribers} subscriptions open already",
            )
        self.on_subscribers(1)
        try:
            await context.send_initial_metadata(())  # the subscriber sees the subscription is open
            cursor = request.resume_after
            if request.resume_after == 0 and request.start in (
                apb.START_FROM_UNSPECIFIED,
                apb.START_FROM_OPEN_ALERTS,
            ):
                opened, head = self.store.alerts.open_at_head(nodes)  # read together with its head
                for alert in opened:
                    yield apb.SubscribeResponse(alert=alert)
            elif request.resume_after > 0 or request.start == apb.START_FROM_HISTORY:
                while not self.stopping.is_set():
                    await self._still_valid(principal, context)
                    batch = self.store.alerts.read_after(cursor, nodes, _BATCH, through=head)
                    for alert in batch:
                        yield apb.SubscribeResponse(alert=alert)
                    if len(batch) < _BATCH:
                        break
                    cursor = batch[-1].id
            # START_FROM_LIVE replays nothing.
            if self.stopping.is_set():
                # A replay cut short must not be called complete: the subscriber would move its cursor
                # past events it never received. It reconnects to the next service and resumes.
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "the service is stopping; resume after the last id"
                )
            yield self._caught_up(head)
            async for alert in self._live(head, nodes, principal, context):
                yield apb.SubscribeResponse(alert=alert)
            # The live part ends only when the service stops: an error, not the end of the stream,
            # so that a client reconnecting on errors resumes at the next service.
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the service is stopping; resubscribe with resume_after"
            )
        finally:
            self.on_subscribers(-1)
            if job:
                self.job_subscribers.leave(job)

    async def _live(
        self,
        cursor: int,
        nodes: list[str],
        principal: Principal | None,
        context: SubscribeContext,
    ) -> AsyncIterator[apb.Alert]:
        """The events of `nodes` after `cursor`, as they are appended. An idle stream makes no
        query; a long node list is matched here, not by SQLite (the few new events cost less to
        check than thousands of names bound to every read, on the event loop)."""
        wanted = frozenset(nodes) if len(nodes) > _SQL_NODES else None
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            await self._still_valid(principal, context)
            seen = self.store.alerts.last_id
            if seen > cursor:
                batch = self.store.alerts.read_after(cursor, None if wanted else nodes, _BATCH)
                for alert in batch:
                    cursor = alert.id
                    if wanted is None or alert.node in wanted:
                        yield alert
                if len(batch) == _BATCH:
                    continue  # more may be waiting
                cursor = max(cursor, seen)  # nothing more for these nodes up to `seen`
            await loop.run_in_executor(None, self.store.alerts.wait_beyond, seen, _POLL_S)

    async def _still_valid(self, principal: Principal | None, context: SubscribeContext) -> None:
        """End the stream of a caller whose bearer token was revoked since it subscribed."""
        if principal is not None and self.policy is not None and not self.policy.still_valid(principal):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the bearer token was revoked")

    def Acknowledge(  # noqa: N802
        self, request: apb.AcknowledgeRequest, context: grpc.ServicerContext
    ) -> apb.AcknowledgeResponse:
        """Validated whatever the transport (insecure means unauthenticated, not unchecked): a
        defined action, a registered job, an OPEN event of an alert on one of the job's nodes."""
        refusal = self._check_ack(request, context.peer())
        if refusal is not None:
            context.abort(*refusal)
        ack = Ack(request.alert_id, request.job_id, int(request.action), request.step, request.checkpoint_uri)
        return apb.AcknowledgeResponse(accepted=True, remediation=self.remediator.on_ack(ack))

    def _check_ack(self, request: apb.AcknowledgeRequest, peer: str) -> Refusal | None:
        """Why the acknowledgement is refused, or None. The caller is authorised before anything is
        looked up; to a trainer, an alert that does not exist is refused like another job's, so
        the answer tells it nothing of alerts outside its own nodes."""
        if request.action not in apb.AckAction.values() or request.action == apb.ACK_ACTION_UNSPECIFIED:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"action {request.action} is not an acknowledgement; say what was done: one of {_ACK_ACTIONS}",
            )
        if not request.job_id:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                "job_id is required: the registered job running on the alert's node",
            )
        if request.step > MAX_STORED_INT:
            return grpc.StatusCode.INVALID_ARGUMENT, f"step {request.step} is beyond 2^63-1, the largest kept"
        refusal = self._authorize(request.job_id, [], peer)  # a trainer acts for its own job only
        if refusal is not None:
            return refusal
        registered = self.store.jobs.all().get(request.job_id)
        if registered is None:
            return (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {request.job_id!r} is not registered: RegisterJob with its nodes first, so that "
                "remediation knows what to requeue",
            )
        alert = self.store.alerts.get(request.alert_id)  # None too for an id beyond what SQLite holds
        if not self._reads_every_alert() and (alert is None or alert.node not in registered):
            if alert is not None:
                self._authorize(request.job_id, [alert.node], peer)  # counts the attempt
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"job {request.job_id!r} has no alert event {request.alert_id} to acknowledge: a job "
                "acknowledges only alerts of the nodes it is registered on",
            )
        # An admin reads every alert anyway: the precise answer tells it nothing new.
        if alert is None:
            return grpc.StatusCode.NOT_FOUND, f"no alert event {request.alert_id}"
        if alert.state != apb.ALERT_STATE_OPEN:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"event {request.alert_id} is the CLEARED event of alert {alert.opened_id}; acknowledge "
                f"the alert by its opened_id {alert.opened_id}",
            )
        if alert.node not in registered:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"alert {alert.opened_id} is on node {alert.node!r}, which job {request.job_id!r} is not "
                f"registered on (its nodes: {', '.join(registered)}): a job acknowledges only alerts "
                "of its own nodes",
            )
        return None

    def _reads_every_alert(self) -> bool:
        """Admins (and every caller with --insecure) may read any alert."""
        return self.policy is None or current().role is Role.ADMIN

    def ListActiveAlerts(  # noqa: N802
        self, request: apb.ListActiveAlertsRequest, context: grpc.ServicerContext
    ) -> apb.ListActiveAlertsResponse:
        """The newest event of each open alert, oldest alert first, read from the log together with
        its head id (a listing and then Subscribe(resume_after=head_id) leave no gap)."""
        refusal = self._too_many_nodes(len(request.nodes)) or self._authorize(
            request.job_id, list(request.nodes), context.peer()
        )
        if refusal is not None:
            context.abort(*refusal)
        nodes = (
            self._nodes(request.job_id, list(request.nodes), context)
            if request.nodes or request.job_id
            else None
        )
        alerts, head = self.store.alerts.open_at_head(nodes)
        return apb.ListActiveAlertsResponse(alerts=sorted(alerts, key=lambda a: a.opened_id), head_id=head)

    def RegisterJob(  # noqa: N802
        self, request: apb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> apb.RegisterJobResponse:
        """Set the job's nodes (replacing an earlier registration), at most `limits.job_nodes`."""
        if not request.job_id or not request.nodes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a job needs an id and at least one node")
        if self.policy is not None:
            try:
                self.policy.check_job(
                    current(),
                    request.job_id,
                    registering=True,
                    predecessors=self.store.remediations.predecessors,
                )
            except AuthError as denied:
                context.abort(*refuse(self.policy, denied, context.peer()))
        refusal = self._too_many_nodes(len(request.nodes))  # before the names are read one by one
        if refusal is not None:
            context.abort(*refusal)
        if not all(is_host_name(node) for node in request.nodes):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "every node must be a host name (none empty)")
        self.store.jobs.register(
            request.job_id,
            list(request.nodes),
            replaces_nodes=request.replaces_nodes,
            stands_by=request.stands_by,
        )
        self.remediator.note_job(request.job_id, replaces_nodes=request.replaces_nodes)
        if self.prescheduler is not None:
            self.prescheduler.note_job(request.job_id, stands_by=request.stands_by)
        return apb.RegisterJobResponse()

    def ReportFailure(  # noqa: N802
        self, request: apb.ReportFailureRequest, context: grpc.ServicerContext
    ) -> apb.ReportFailureResponse:
        """A trainer's word that a rank died or the NCCL watchdog fired on one of its job's nodes:
        a FAILED event at once (or the one the node already has), checked as Acknowledge is."""
        refusal = self._check_report(request, context.peer())
        if refusal is not None:
            context.abort(*refusal)
        if self.report_failure is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this service takes no failure reports")
        what = (
            apb.TrainerFailure.Name(request.what).removeprefix("TRAINER_FAILURE_").lower().replace("_", " ")
        )
        rank = f"rank {request.rank}" if request.rank >= 0 else "a rank"
        words = f"job {request.job_id} reports {what} ({rank})"
        if request.detail:
            words += f": {request.detail[:_DETAIL_CHARS]}"
        sign = FailureSign(request.node, -1, "", Evidence.TRAINER_REPORT, words, time.time_ns())
        report = TrainerReport(request.job_id, request.what, request.rank, request.detail[:_DETAIL_CHARS])
        try:
            alert_id, known = self.report_failure(sign, report)
        except StateWriteError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the report is not stored ({exc}); send it again")
        return apb.ReportFailureResponse(alert_id=alert_id, repeated=known)

    def _check_report(self, request: apb.ReportFailureRequest, peer: str) -> Refusal | None:
        """Why the report is refused, or None: what happened must be named, by a registered job
        for one of its own nodes."""
        if request.what not in apb.TrainerFailure.values() or request.what == apb.TRAINER_FAILURE_UNSPECIFIED:
            return (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"what {request.what} is not a failure a trainer reports; one of {_TRAINER_FAILURES}",
            )
        if not request.job_id or not is_host_name(request.node):
            return grpc.StatusCode.INVALID_ARGUMENT, "job_id and node (a host name) are required"
        refusal = self._authorize(request.job_id, [request.node], peer)
        if refusal is not None:
            return refusal
        registered = self.store.jobs.all().get(request.job_id)
        if registered is None:
            return (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {request.job_id!r} is not registered: RegisterJob with its nodes first",
            )
        if request.node not in registered:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"job {request.job_id!r} is not registered on node {request.node!r} (its nodes: "
                f"{', '.join(registered)}): a job reports failures of its own nodes only",
            )
        return None

    async def AwaitHandOver(  # noqa: N802
        self,
        request: apb.AwaitHandOverRequest,
        context: grpc.aio.ServicerContext[apb.AwaitHandOverRequest, apb.HandOver],
    ) -> apb.HandOver:
        """A standby's long poll: held up to its wait (at most spares.MAX_WAIT_S) until its job is
        handed over or its spare released. A coroutine on the event loop, looking every
        HAND_OVER_POLL_S: a held call costs no thread. A trainer asks only for its own job."""
        if not request.standby_for or not request.job_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "name the job stood by for and this standby's own job id"
            )
        if not (request.wait_seconds >= 0 and math.isfinite(request.wait_seconds)):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"wait_seconds {request.wait_seconds} is not a wait"
            )
        if self.policy is not None:
            try:
                self.policy.check_job(
                    current(), request.standby_for, predecessors=self.store.remediations.predecessors
                )
            except AuthError as denied:
                await context.abort(*refuse(self.policy, denied, context.peer()))
        if self.prescheduler is None:
            return apb.HandOver(
                state=apb.HAND_OVER_STATE_RELEASED, reason="this service readies no spares (no --spares)"
            )
        try:
            reply = await self._held(self.prescheduler, request)
        except StandbyRefused as refused:
            not_the_spare = AuthError(grpc.StatusCode.PERMISSION_DENIED, refused.reason, str(refused))
            if self.policy is not None:
                await context.abort(*refuse(self.policy, not_the_spare, context.peer()))
            await context.abort(not_the_spare.code, str(not_the_spare))
        return apb.HandOver(
            state=reply.state,
            alert_id=reply.alert_id,
            step=reply.step,
            checkpoint_uri=reply.checkpoint_uri,
            reason=reply.reason,
        )

    async def _held(self, prescheduler: Prescheduler, request: apb.AwaitHandOverRequest) -> HandOverReply:
        arrived = prescheduler.arrive(
            request.standby_for, request.job_id, request.node, alert_id=request.alert_id, claim=request.claim
        )
        if isinstance(arrived, HandOverReply):
            return arrived
        deadline = time.monotonic() + min(request.wait_seconds, MAX_WAIT_S)
        try:  # a standby that goes away cancels this coroutine: `leave` still runs
            while time.monotonic() < deadline and not self.stopping.is_set():
                if prescheduler.answer(arrived) is not None:
                    break
                await asyncio.sleep(HAND_OVER_POLL_S)
        finally:
            reply = prescheduler.leave(arrived)
        return reply


class AdminServicer(apb_grpc.AdminServicer):
    """ReloadModel, GetRemediation, SetRemediation and the label log's AddFailures, JudgeAlert and
    ListLabels: coroutines on the server's event loop that run their work on `executor`, which no other
    call uses, so that no load of other calls (the shared worker threads all busy) keeps an admin from
    pausing remediation."""

    def __init__(self, operations: Operations, executor: Executor, labels: LabelDesk) -> None:
        self.operations, self.executor, self.labels = operations, executor, labels

    async def _run(self, work: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    async def ReloadModel(  # noqa: N802
        self,
        request: apb.ReloadModelRequest,
        context: grpc.aio.ServicerContext[apb.ReloadModelRequest, apb.ReloadModelResponse],
    ) -> apb.ReloadModelResponse:
        """Reload the model on an admin thread; a refused model is an answer, not an error."""
        loaded, version, error = await self._run(self.operations.reload, request.path or None)
        return apb.ReloadModelResponse(loaded=loaded, model_version=version, error=error)

    async def GetRemediation(  # noqa: N802
        self,
        request: apb.GetRemediationRequest,
        context: grpc.aio.ServicerContext[apb.GetRemediationRequest, apb.RemediationSettings],
    ) -> apb.RemediationSettings:
        """The remediation settings in force."""
        return await self._run(self.operations.remediation_settings)

    async def SetRemediation(  # noqa: N802
        self,
        request: apb.SetRemediationRequest,
        context: grpc.aio.ServicerContext[apb.SetRemediationRequest, apb.RemediationSettings],
    ) -> apb.RemediationSettings:
        """Pause or resume remediation, or resize the breaker; INVALID_ARGUMENT on bad values."""
        by = str(current())  # here: the executor's threads do not see the call's context
        try:
            return await self._run(self.operations.set_remediation, request, by)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raised already; for the type checker

    async def AddFailures(  # noqa: N802
        self,
        request: apb.AddFailuresRequest,
        context: grpc.aio.ServicerContext[apb.AddFailuresRequest, apb.AddFailuresResponse],
    ) -> apb.AddFailuresResponse:
        """Add failures to the label log (all or none); INVALID_ARGUMENT naming a bad one."""
        by = str(current())
        return await self._labelled(context, self.labels.add_failures, request, by)

    async def JudgeAlert(  # noqa: N802
        self,
        request: apb.JudgeAlertRequest,
        context: grpc.aio.ServicerContext[apb.JudgeAlertRequest, apb.JudgeAlertResponse],
    ) -> apb.JudgeAlertResponse:
        """Record an operator's verdict on an alert; NOT_FOUND for an alert the log lacks."""
        by = str(current())
        return await self._labelled(context, self.labels.judge_alert, request, by)

    async def ListLabels(  # noqa: N802
        self,
        request: apb.ListLabelsRequest,
        context: grpc.aio.ServicerContext[apb.ListLabelsRequest, apb.ListLabelsResponse],
    ) -> apb.ListLabelsResponse:
        """A page of the label log."""
        return await self._run(self.labels.list_labels, request)

    async def _labelled(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[Req, str], Resp],
        request: Req,
        by: str,
    ) -> Resp:
        """Run a label write; a refusal is aborted with its words, a refused disk as UNAVAILABLE."""
        try:
            return await self._run(work, request, by)
        except LabelRefusedError as exc:
            code = grpc.StatusCode.NOT_FOUND if exc.not_found else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, str(exc))
        except StateWriteError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc}; nothing was recorded: try again")
        raise AssertionError("abort returned")  # for the type checker: abort always raises

    async def ListModels(  # noqa: N802
        self,
        request: apb.ListModelsRequest,
        context: grpc.aio.ServicerContext[apb.ListModelsRequest, apb.ListModelsResponse],
    ) -> apb.ListModelsResponse:
        """The model registry: its models, its log and which model serves."""
        models, events = await self._run(self.operations.list_models)
        serving = next((m.id for m in models if m.serving), "")
        return apb.ListModelsResponse(
            models=[_model_pb(m) for m in models],
            events=[_event_pb(e) for e in events],
            serving_id=serving,
            serving_version=model_version(self.operations.model),
            shadow_id=shadow.model_id if (shadow := self.operations.shadow) is not None else "",
        )

    async def AddModel(  # noqa: N802
        self,
        request: apb.AddModelRequest,
        context: grpc.aio.ServicerContext[apb.AddModelRequest, apb.AddModelResponse],
    ) -> apb.AddModelResponse:
        """Copy a model directory into the registry; INVALID_ARGUMENT for one that is no model."""
        by = str(current())
        if not request.path:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "AddModel needs the model directory's path")
        entry, known = await self._registry(
            context, self.operations.add_model, request.path, by, request.why[:_WHY_CHARS]
        )
        return apb.AddModelResponse(model=_model_pb(entry), already_there=known)

    async def PromoteModel(  # noqa: N802
        self,
        request: apb.PromoteModelRequest,
        context: grpc.aio.ServicerContext[apb.PromoteModelRequest, apb.ModelChange],
    ) -> apb.ModelChange:
        """Serve a registered model now; NOT_FOUND, FAILED_PRECONDITION or INVALID_ARGUMENT say why not."""
        by = str(current())
        event = await self._registry(
            context, self.operations.promote_model, request.id, by, request.why[:_WHY_CHARS], request.force
        )
        return apb.ModelChange(event=_event_pb(event), model_version=model_version(self.operations.model))

    async def RollbackModel(  # noqa: N802
        self,
        request: apb.RollbackModelRequest,
        context: grpc.aio.ServicerContext[apb.RollbackModelRequest, apb.ModelChange],
    ) -> apb.ModelChange:
        """Serve again the model that served before; FAILED_PRECONDITION when none of the registry's did."""
        by = str(current())
        event = await self._registry(context, self.operations.rollback_model, by, request.why[:_WHY_CHARS])
        return apb.ModelChange(event=_event_pb(event), model_version=model_version(self.operations.model))

    async def ShadowModel(  # noqa: N802
        self,
        request: apb.ShadowModelRequest,
        context: grpc.aio.ServicerContext[apb.ShadowModelRequest, apb.ModelChange],
    ) -> apb.ModelChange:
        """Shadow a registered model (or stop); the refusals of PromoteModel."""
        by = str(current())
        why = request.why[:_WHY_CHARS]
        if request.stop:
            event = await self._registry(context, self.operations.stop_shadow, by, why)
        else:
            event = await self._registry(context, self.operations.shadow_model, request.id, by, why)
        return apb.ModelChange(event=_event_pb(event), model_version=model_version(self.operations.model))

    async def CompareShadow(  # noqa: N802
        self,
        request: apb.CompareShadowRequest,
        context: grpc.aio.ServicerContext[apb.CompareShadowRequest, apb.ShadowComparison],
    ) -> apb.ShadowComparison:
        """The shadow's comparison; FAILED_PRECONDITION when no challenger is shadowed."""
        verdict = await self._registry(context, self.operations.compare_shadow)
        shadow = self.operations.shadow
        return apb.ShadowComparison(
            challenger_id=shadow.model_id if shadow is not None else "",
            steps=verdict.steps,
            node_days=verdict.node_days,
            failures=verdict.failures,
            serving=_outcome_pb(verdict.serving),
            challenger=_outcome_pb(verdict.challenger),
            matched=_outcome_pb(verdict.matched),
            extra_caught_low=verdict.extra_caught_low,
            extra_caught_high=verdict.extra_caught_high,
            better=verdict.better,
            summary=verdict.summary(),
        )

    async def _registry(
        self, context: grpc.aio.ServicerContext[Any, Any], work: Callable[[*Ts], T], *args: *Ts
    ) -> T:
        """Run a registry change; a refusal is aborted with its code and words."""
        try:
            return await self._run(work, *args)
        except RegistryRefusedError as exc:
            await context.abort(_REFUSAL_CODES[exc.refusal], str(exc))
        except StateWriteError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc}; nothing was recorded: try again")
        except OSError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"the registry's directory: {exc}")
        raise AssertionError("abort returned")  # for the type checker: abort always raises


def _outcome_pb(outcome: Outcome) -> apb.ShadowOutcome:
    return apb.ShadowOutcome(
        threshold=outcome.threshold, caught=outcome.caught, false_alarms=outcome.false_alarms
    )


def _event_pb(event: ModelEvent) -> apb.ModelEvent:
    return apb.ModelEvent(
        id=event.id,
        kind=_EVENT_KINDS[event.kind],
        model_id=event.model_id,
        from_model_id=event.from_model_id,
        by=event.by,
        why=event.why,
        recorded_unix_nano=event.recorded_ns,
    )


def _model_pb(model: RegisteredModel) -> apb.RegisteredModel:
    card = model.added.detail
    try:
        threshold = float(card.get("threshold", "nan"))
    except ValueError:
        threshold = math.nan
    return apb.RegisteredModel(
        id=model.id,
        digest=model.digest,
        path=str(model.path),
        source=card.get("source", ""),
        version=card.get("version", ""),
        threshold=threshold,
        trained_at=card.get("trained_at", ""),
        training_data=card.get("training_data", ""),
        serving=model.serving,
        added=_event_pb(model.added),
    )
