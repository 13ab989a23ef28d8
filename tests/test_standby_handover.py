"""A standby in one process, against a real gRPC server on port 0 playing the service's AwaitHandOver:
every request carries the spare's claim from the environment (and no log line shows it); a word
naming a snapshot outside the standby's own store ends the standby without training; one naming a
whole snapshot in its store is taken over."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from faultcast.client import standby
from faultcast.client.protection import Protection
from faultcast.client.train_state import TrainState
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

CLAIM = "claim-6f1c2e9a-never-logged"
OLD_JOB, STANDBY_JOB = "41", "77"
pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)


class HandOverService(apb_grpc.AlertsServicer):
    """Records every AwaitHandOver and answers it with `answer()` (called on the server's thread, as
    the old job would snapshot while its standby waits). Every other call: UNIMPLEMENTED."""

    def __init__(self, answer: Callable[[], apb.HandOver]) -> None:
        self.answer = answer
        self.lock = threading.Lock()
        self.requests: list[apb.AwaitHandOverRequest] = []

    def AwaitHandOver(  # noqa: N802 (gRPC method name)
        self, request: apb.AwaitHandOverRequest, context: grpc.ServicerContext
    ) -> apb.HandOver:
        with self.lock:
            self.requests.append(request)
        return self.answer()

    def RegisterJob(  # noqa: N802 (gRPC method name)
        self, request: apb.RegisterJobRequest, context: grpc.ServicerContext
    ) -> apb.RegisterJobResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "only AwaitHandOver here")

    def ListActiveAlerts(  # noqa: N802 (gRPC method name)
        self, request: apb.ListActiveAlertsRequest, context: grpc.ServicerContext
    ) -> apb.ListActiveAlertsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "only AwaitHandOver here")

    def Subscribe(  # noqa: N802 (gRPC method name)
        self, request: apb.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[apb.SubscribeResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "only AwaitHandOver here")

    def Acknowledge(  # noqa: N802 (gRPC method name)
        self, request: apb.AcknowledgeRequest, context: grpc.ServicerContext
    ) -> apb.AcknowledgeResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "only AwaitHandOver here")


@pytest.fixture
def serve() -> Iterator[Callable[[HandOverService], str]]:
    servers: list[grpc.Server] = []

    def start(servicer: HandOverService) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        apb_grpc.add_AlertsServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(grace=None)


@pytest.fixture(autouse=True)
def _standby_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The scheduler's environment for a standby; the process-wide generators given back after."""
    monkeypatch.setenv(standby.STANDBY_FOR, OLD_JOB)
    monkeypatch.setenv(standby.STANDBY_ALERT, "9")
    monkeypatch.setenv(standby.STANDBY_CLAIM, CLAIM)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


def _model(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return model


def _standby(directory: Path, target: str, model: torch.nn.Module) -> Protection:
    return Protection(directory, TrainState(model=model), target=target, job_id=STANDBY_JOB, node="spare-1")


def test_the_standby_sends_its_claim_from_the_environment_and_never_logs_it(
    serve: Callable[[HandOverService], str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    service = HandOverService(lambda: apb.HandOver(state=apb.HAND_OVER_STATE_RELEASED, reason="false alarm"))
    protection = _standby(tmp_path, serve(service), _model(0.0))
    with pytest.raises(standby.StandbyReleased):
        protection.resume()
    protection.close()
    (request,) = service.requests
    assert request.claim == CLAIM
    assert (request.standby_for, request.job_id, request.node, request.alert_id) == (
        OLD_JOB,
        STANDBY_JOB,
        "spare-1",
        9,
    )
    assert caplog.records  # it did log (the release), just never the claim
    assert CLAIM not in caplog.text


def test_the_asker_sends_the_claim_it_was_given(serve: Callable[[HandOverService], str]) -> None:
    service = HandOverService(lambda: apb.HandOver(state=apb.HAND_OVER_STATE_WAITING))
    asker = standby.HandOverAsker(serve(service), None, STANDBY_JOB, "spare-1", 9, "another-claim")
    try:
        reply = asker.ask(OLD_JOB, 0.0)
    finally:
        asker.close()
    assert reply is not None
    assert reply.state == apb.HAND_OVER_STATE_WAITING
    assert [r.claim for r in service.requests] == ["another-claim"]
