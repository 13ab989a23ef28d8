"""AwaitHandOver through a real service over TLS with bearer tokens: who may ask, what a malformed
request gets, and what a service without spares answers (the prescheduler behind it is tested in
tests/test_spares.py, the whole hand-over on Slurm in tests/test_handover_e2e.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.tokened import Tokened, tokened_service


@pytest.fixture(scope="module")
def served(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tokened]:
    with tokened_service(stub_model, tmp_path_factory.mktemp("handover")) as running:
        yield running


def _ask(served: Tokened, who: str, request: apb.AwaitHandOverRequest) -> apb.HandOver:
    with served.channel(who) as channel:
        return apb_grpc.AlertsStub(channel).AwaitHandOver(request, timeout=10)


def _request(standby_for: str = "job-a", job_id: str = "77", wait_s: float = 0.0) -> apb.AwaitHandOverRequest:
    return apb.AwaitHandOverRequest(
        standby_for=standby_for, job_id=job_id, node="node-9", wait_seconds=wait_s
    )


def test_a_service_without_spares_lets_a_standby_go(served: Tokened) -> None:
    reply = _ask(served, "job-a", _request())
    assert reply.state == apb.HAND_OVER_STATE_RELEASED
    assert "no spares" in reply.reason


@pytest.mark.parametrize("who", ["job-b", "node-1"])
def test_only_the_jobs_own_identity_may_wait_for_its_hand_over(served: Tokened, who: str) -> None:
    before = served.counted("faultcast_auth_denied_total", reason="wrong_job" if who == "job-b" else "role")
    with pytest.raises(grpc.RpcError) as refused:
        _ask(served, who, _request(standby_for="job-a"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    after = served.counted("faultcast_auth_denied_total", reason="wrong_job" if who == "job-b" else "role")
    assert after == before + 1


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (_request(standby_for=""), "name the job stood by for"),
        (_request(job_id=""), "name the job stood by for"),
        (_request(wait_s=-1.0), "is not a wait"),
        (_request(wait_s=math.nan), "is not a wait"),
        (_request(wait_s=math.inf), "is not a wait"),
    ],
)
def test_a_malformed_request_is_refused_with_the_reason(
    served: Tokened, request_: apb.AwaitHandOverRequest, says: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _ask(served, "job-a", request_)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (refused.value.details() or "")
