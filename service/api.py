"""The alert and admin RPCs: thin servicers over the service's parts.

Subscribe streams the durable log from `resume_after`: first everything stored since, then new events
as they are appended, so a subscriber that reconnects (even to a restarted service) misses nothing.
Delivery is at-least-once: a subscriber dedupes by id.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from faultcast.service.alerting import AlertBook
from faultcast.service.auth import AccessPolicy, AuthError, current, refuse
from faultcast.service.remediator import Remediator
from faultcast.service.state import Ack, StateStore
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

_POLL_S = 0.5  # how often a quiet stream checks that its subscriber is still there


class Operations(Protocol):
    """What admins may do to a running service."""

    def reload(self, path: str | None) -> tuple[bool, str, str]: ...

    def remediation_settings(self) -> apb.RemediationSettings: ...

    def set_remediation(self, request: apb.SetRemediationRequest, by: str) -> apb.RemediationSettings: ...


class AlertsServicer(apb_grpc.AlertsServicer):
    def __init__(
        self,
        store: StateStore,
        book: AlertBook,
        remediator: Remediator,
        stopping: threading.Event,
        on_subscribers: Callable[[int], None] = lambda delta: None,
        policy: AccessPolicy | None = None,
    ) -> None:
        """`policy`: who may read and acknowledge what (None: no checks, a servicer under test)."""
        self.store, self.book, self.remediator, self.stopping = store, book, remediator, stopping
        self.on_subscribers, self.policy = on_subscribers, policy

    def _authorize(self, job_id: str, nodes: list[str], peer: str) -> tuple[grpc.StatusCode, str] | None:
        """A trainer names its own job, and only nodes registered to it; else the refusal."""
        if self.policy is None:
            return None
        try:
            self.policy.check_nodes(current(), job_id, nodes, self.store.jobs().get(job_id, []))
        except AuthError as denied:
            return refuse(self.policy, denied, peer)
        return None

    def _resolve(self, job_id: str, nodes: list[str]) -> tuple[list[str], tuple[grpc.StatusCode, str] | None]:
        """The nodes a request names, or those of its registered job; else the status refusing it."""
        if nodes:
            return nodes, None
        if not job_id:
            return [], (grpc.StatusCode.INVALID_ARGUMENT, "name the nodes or a registered job id")
        registered = self.store.jobs().get(job_id)
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

    async def Subscribe(  # noqa: N802 (gRPC method name)
        self, request: apb.SubscribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[apb.SubscribeResponse]:
        """A coroutine on the server's event loop (a thread each would cap subscribers); waiting for
        new events happens on the loop's executor, half a second at a time."""
        # Authorization first: whether another job exists is not a stranger's business.
        refusal = self._authorize(request.job_id, list(request.nodes), context.peer())
        nodes: list[str] = []
        if refusal is None:
            nodes, refusal = self._resolve(request.job_id, list(request.nodes))
        if refusal is not None:
            await context.abort(*refusal)
        principal = current() if self.policy is not None else None
        await context.send_initial_metadata(())  # the subscriber sees the subscription is open
        cursor = request.resume_after
        loop = asyncio.get_running_loop()
        self.on_subscribers(1)
        try:
            while not self.stopping.is_set():
                if (
                    principal is not None
                    and self.policy is not None
                    and not self.policy.still_valid(principal)
                ):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the bearer token was revoked")
                seen = self.store.last_id
                batch = self.store.read_after(cursor, nodes)
                for alert in batch:
                    yield apb.SubscribeResponse(alert=alert)
                    cursor = alert.id
                if len(batch) == 0:
                    # Nothing for these nodes up to `seen`: skip past it, then wait for more.
                    cursor = max(cursor, seen)
                    await loop.run_in_executor(None, self.store.wait_beyond, seen, _POLL_S)
        finally:
            self.on_subscribers(-1)

    def Acknowledge(  # noqa: N802
        self, request: apb.AcknowledgeRequest, context: grpc.ServicerContext
    ) -> apb.AcknowledgeResponse:
        alert = self.store.get(request.alert_id)
        if alert is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no alert {request.alert_id}")
        if alert.state != apb.ALERT_STATE_OPEN:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"alert {request.alert_id} is a CLEARED event; acknowledge the OPEN alert {alert.opened_id}",
            )
        refusal = self._authorize(request.job_id, [alert.node], context.peer())
        if refusal is not None:
            context.abort(*refusal)
        if request.action == apb.ACK_ACTION_UNSPECIFIED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "say what was done (action)")
        ack = Ack(request.alert_id, request.job_id, int(request.action), request.step, request.checkpoint_uri)
        return apb.AcknowledgeResponse(accepted=True, remediation=self.remediator.on_ack(ack))

    def ListActiveAlerts(  # noqa: N802
        self, request: apb.ListActiveAlertsRequest, context: grpc.ServicerContext
    ) -> apb.ListActiveAlertsResponse:
        alerts = self.book.active()
        refusal = self._authorize(request.job_id, list(request.nodes), context.peer())
        if refusal is not None:
            context.abort(*refusal)
        if request.nodes or request.job_id:
            nodes = set(self._nodes(request.job_id, list(request.nodes), context))
            alerts = [a for a in alerts if a.node in nodes]
        return apb.ListActiveAlertsResponse(alerts=alerts)

    def RegisterJob(  # noqa: N802
        self, request: apb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> apb.RegisterJobResponse:
        if not request.job_id or not request.nodes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a job needs an id and at least one node")
        if self.policy is not None:
            try:
                self.policy.check_job(current(), request.job_id, registering=True)
            except AuthError as denied:
                context.abort(*refuse(self.policy, denied, context.peer()))
        self.store.register_job(request.job_id, list(request.nodes))
        return apb.RegisterJobResponse()


class AdminServicer(apb_grpc.AdminServicer):
    def __init__(self, operations: Operations) -> None:
        self.operations = operations

    def ReloadModel(  # noqa: N802
        self, request: apb.ReloadModelRequest, context: grpc.ServicerContext
    ) -> apb.ReloadModelResponse:
        loaded, version, error = self.operations.reload(request.path or None)
        return apb.ReloadModelResponse(loaded=loaded, model_version=version, error=error)

    def GetRemediation(  # noqa: N802
        self, request: apb.GetRemediationRequest, context: grpc.ServicerContext
    ) -> apb.RemediationSettings:
        return self.operations.remediation_settings()

    def SetRemediation(  # noqa: N802
        self, request: apb.SetRemediationRequest, context: grpc.ServicerContext
    ) -> apb.RemediationSettings:
        try:
            return self.operations.set_remediation(request, str(current()))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raised already; for the type checker
