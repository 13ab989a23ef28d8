"""A standby in one process, against a real gRPC server on port 0 playing the service's AwaitHandOver:
every request carries the spare's claim from the environment (and no log line shows it); a word
naming a snapshot outside the standby's own store ends the standby without training; one naming a
whole snapshot in its store is taken over."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import torch

from faultcast.client import standby
from faultcast.client.protection import Protection
from faultcast.client.snapshots import Snapshot, SnapshotStore
from faultcast.client.train_state import TrainState
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.torch_parts import filled_linear, global_rng_kept

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

    def ReportFailure(  # noqa: N802 (gRPC method name)
        self, request: apb.ReportFailureRequest, context: grpc.ServicerContext
    ) -> apb.ReportFailureResponse:
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
    with global_rng_kept():
        yield


def _model(value: float) -> torch.nn.Linear:
    return filled_linear(value)


def _snapshot(directory: Path, step: int, value: float) -> Snapshot:
    """A whole snapshot of `step` in `directory` whose model holds `value`, as the job writes it."""
    # The old job's run, in this process: not a standby, whatever the environment says.
    protection = Protection(
        directory, TrainState(model=_model(value)), checkpoint_every=step, agree_every=step, standby_for=""
    )
    protection.step_end(step)
    protection.close()
    written = SnapshotStore(directory).latest()
    assert written is not None
    assert written.step == step
    return written


def _go(snapshot: Callable[[], Snapshot]) -> Callable[[], apb.HandOver]:
    def answer() -> apb.HandOver:
        taken = snapshot()
        return apb.HandOver(
            state=apb.HAND_OVER_STATE_GO, alert_id=9, step=taken.step, checkpoint_uri=taken.uri
        )

    return answer


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


class _Refusing(HandOverService):
    """The service's answer to a standby whose claim is not the spare's."""

    def AwaitHandOver(  # noqa: N802 (gRPC method name)
        self, request: apb.AwaitHandOverRequest, context: grpc.ServicerContext
    ) -> apb.HandOver:
        with self.lock:
            self.requests.append(request)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no standby of job 41 was started with this claim")


def test_a_standby_the_service_refuses_stands_down_at_once_instead_of_asking_for_an_hour(
    serve: Callable[[HandOverService], str], tmp_path: Path
) -> None:
    service = _Refusing(lambda: apb.HandOver())
    protection = _standby(tmp_path, serve(service), _model(0.0))
    with pytest.raises(standby.StandbyReleased) as released:
        protection.resume()
    protection.close()
    assert "the service refused this standby: no standby of job 41" in released.value.reason
    assert len(service.requests) == 1  # not asked again: the answer would not change


def test_a_word_naming_a_snapshot_outside_the_store_ends_the_standby_without_training(
    serve: Callable[[HandOverService], str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "job"
    _snapshot(store, 10, 1.0)
    foreign = _snapshot(tmp_path / "elsewhere", 20, 666.0)  # whole, of the step the word names
    service = HandOverService(_go(lambda: foreign))
    model = _model(0.0)
    protection = _standby(store, serve(service), model)
    with pytest.raises(standby.HandOverRefused) as refused:
        protection.resume()
    protection.close()
    assert refused.value.code == standby.EXIT_HANDOVER_REFUSED == 65
    assert "outside this job's snapshot store" in refused.value.reason
    assert any(
        r.levelno == logging.ERROR and "refuses the hand-over and ends without training" in r.getMessage()
        for r in caplog.records
    )
    assert torch.equal(model.weight, torch.full((2, 3), 1.0))  # the warm snapshot's, not the foreign one's
    assert protection.stats.warm_from == 10
    assert not standby.took_over(SnapshotStore(store), STANDBY_JOB)
    assert not (store / standby.TAKEN_OVER).exists()


def test_a_word_naming_a_whole_snapshot_in_the_store_is_taken_over(
    serve: Callable[[HandOverService], str], tmp_path: Path
) -> None:
    store = tmp_path / "job"
    _snapshot(store, 10, 1.0)
    # The old job snapshots while its standby waits: the word names that snapshot.
    service = HandOverService(_go(lambda: _snapshot(store, 20, 2.0)))
    model = _model(0.0)
    protection = _standby(store, serve(service), model)
    try:
        assert protection.resume() == 20
    finally:
        protection.close()
    assert protection.stats.warm_from == 10
    assert protection.stats.handover_source == "files"
    assert torch.equal(model.weight, torch.full((2, 3), 2.0))
    assert standby.took_over(SnapshotStore(store), STANDBY_JOB)
    assert [r.claim for r in service.requests] == [CLAIM]
