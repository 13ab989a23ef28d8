"""The guard resends an acknowledgement the service answered UNAVAILABLE (its state disk refused the
write, or it is restarting), and `close()` cuts those retries short. A real gRPC server on port 0
plays the service: it hands the guard one snapshot request, then answers Acknowledge as told."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from faultcast.client import Guard
from faultcast.client import guard as guard_module
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

NODE = "node-ack"
WAIT_S = 30.0
MAX_ATTEMPTS = len(guard_module._ACK_RETRY_S) + 1  # the first send and one per retry delay


class FakeAlerts(apb_grpc.AlertsServicer):
    """Takes the guard's registration, streams it one open snapshot-and-migrate alert and the
    caught-up marker, then answers UNAVAILABLE to the first `unavailable` acknowledgements (None:
    to all of them) and accepts the next."""

    def __init__(self, unavailable: int | None) -> None:
        self.unavailable = unavailable
        self.lock = threading.Lock()
        self.acks: list[apb.AcknowledgeRequest] = []

    def calls(self) -> int:
        with self.lock:
            return len(self.acks)

    def RegisterJob(  # noqa: N802 (gRPC method name)
        self, request: apb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> apb.RegisterJobResponse:
        return apb.RegisterJobResponse()

    def ListActiveAlerts(  # noqa: N802 (gRPC method name)
        self, request: apb.ListActiveAlertsRequest, context: grpc.ServicerContext
    ) -> apb.ListActiveAlertsResponse:
        return apb.ListActiveAlertsResponse(alerts=[_alert()], head_id=1)

    def Subscribe(  # noqa: N802 (gRPC method name)
        self, request: apb.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[apb.SubscribeResponse]:
        ended = threading.Event()
        if not context.add_callback(ended.set):
            return  # the call is already over
        if request.resume_after < 1:
            yield apb.SubscribeResponse(alert=_alert())
        yield apb.SubscribeResponse(caught_up=apb.CaughtUp(head_id=1))
        ended.wait()  # held open like a live stream until the guard cancels it or the server stops

    def Acknowledge(  # noqa: N802 (gRPC method name)
        self, request: apb.AcknowledgeRequest, context: grpc.ServicerContext
    ) -> apb.AcknowledgeResponse:
        with self.lock:
            self.acks.append(request)
            calls = len(self.acks)
        if self.unavailable is None or calls <= self.unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "state disk full: nothing kept")
        return apb.AcknowledgeResponse(accepted=True, remediation=f"drain {NODE}")

    def AwaitHandOver(  # noqa: N802 (gRPC method name)
        self, request: apb.AwaitHandOverRequest, context: grpc.ServicerContext
    ) -> apb.HandOver:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no standbys here")

    def ReportFailure(  # noqa: N802 (gRPC method name)
        self, request: apb.ReportFailureRequest, context: grpc.ServicerContext
    ) -> apb.ReportFailureResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no failure reports here")


def _alert() -> apb.Alert:
    return apb.Alert(
        id=1,
        opened_id=1,
        node=NODE,
        gpu=0,
        state=apb.ALERT_STATE_OPEN,
        risk=0.9,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
    )


class _RetryScheduled(logging.Handler):
    """Sets `event` when the guard logs that it will send an acknowledgement again: from then until
    the delay ends it waits, with no RPC in flight."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "again in" in record.getMessage():
            self.event.set()


def _serve(servicer: FakeAlerts) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    apb_grpc.add_AlertsServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _guard_with_an_alert(port: int) -> Guard:
    guard = Guard(f"127.0.0.1:{port}", "job-ack", [NODE], backoff_s=(0.05, 0.2)).start()
    try:
        assert guard.wait_caught_up(WAIT_S), guard.last_error
        pending = guard.wait_for_alert(WAIT_S)
        assert pending is not None
        assert pending.id == 1
    except BaseException:
        guard.close()
        raise
    return guard


def test_an_acknowledgement_answered_unavailable_is_sent_again_until_it_is_taken() -> None:
    servicer = FakeAlerts(unavailable=2)
    server, port = _serve(servicer)
    try:
        guard = _guard_with_an_alert(port)
        try:
            reply = guard.snapshot_done(1234, "file:///ckpt/1234")
        finally:
            guard.close()
        assert reply == f"drain {NODE}"
        assert servicer.calls() == 3
        assert all(ack.alert_id == 1 and ack.job_id == "job-ack" for ack in servicer.acks)
        assert all(ack.action == apb.ACK_ACTION_SNAPSHOT_DONE for ack in servicer.acks)
        assert all(ack.checkpoint_uri == "file:///ckpt/1234" for ack in servicer.acks)
        assert not guard.should_snapshot()
    finally:
        server.stop(0)


def test_closing_the_guard_ends_the_retries_of_an_acknowledgement(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=guard_module.__name__)
    retry_scheduled = _RetryScheduled()
    logging.getLogger(guard_module.__name__).addHandler(retry_scheduled)
    servicer = FakeAlerts(unavailable=None)  # the state disk never takes the write
    server, port = _serve(servicer)
    try:
        guard = _guard_with_an_alert(port)
        with futures.ThreadPoolExecutor(max_workers=1) as trainer:
            try:
                acknowledging = trainer.submit(guard.snapshot_done, 1234, "file:///ckpt/1234")
                # The first answer was UNAVAILABLE and the guard waits to send it again.
                assert retry_scheduled.event.wait(WAIT_S)
            finally:
                guard.close()
            reply = acknowledging.result(timeout=WAIT_S)
        assert reply.startswith("acknowledgement failed: guard closed"), reply
        assert "UNAVAILABLE" in reply
        # Returned during the first retry delay: none of the later sends were made.
        assert servicer.calls() == 1 < MAX_ATTEMPTS
    finally:
        logging.getLogger(guard_module.__name__).removeHandler(retry_scheduled)
        server.stop(0)
