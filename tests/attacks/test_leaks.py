"""Information and resource leaks: what a refusal reveals, what one job may hold,
what malformed bytes and out-of-range integers do."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.rpc.limits import CallerLimits
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.tokened import Tokened, tokened_service

FLEET = FleetConfig(nodes=2, days=1.0, seed=5, acceleration=1.0)
JOB_SUBSCRIBERS = 100  # below the probe's 300, so that the attack crosses it
WAIT_S = 30.0
MALFORMED = b"\xff"  # a field tag whose varint never ends


@pytest.fixture(scope="module")
def tokened(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tokened]:
    limits = CallerLimits(job_subscribers=JOB_SUBSCRIBERS)
    with tokened_service(stub_model, tmp_path_factory.mktemp("leaks"), caller_limits=limits) as running:
        yield running


def _refusal(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def _code(error: grpc.RpcError) -> grpc.StatusCode:
    return error.code()


# -- Acknowledge reveals nothing of other jobs' alerts ----------------------------------------


def test_acknowledge_answers_alike_for_an_absent_alert_and_another_jobs_alerts(tokened: Tokened) -> None:
    store = tokened.service.store
    store.jobs.register("job-a", ["node-1", "node-3"])
    store.jobs.register("job-b", ["node-2"])
    opened, elsewhere, own = store.alerts.append(
        [
            apb.Alert(node=node, gpu=0, state=apb.ALERT_STATE_OPEN, risk=0.9)
            for node in ("node-1", "node-3", "node-2")
        ]
    )
    (cleared,) = store.alerts.append(
        [apb.Alert(node="node-1", gpu=0, state=apb.ALERT_STATE_CLEARED, opened_id=opened.id)]
    )
    absent = store.alerts.last_id + 1000
    with tokened.channel("job-b") as channel:
        stub = apb_grpc.AlertsStub(channel)

        def ack(alert_id: int) -> apb.AcknowledgeResponse:
            request = apb.AcknowledgeRequest(
                alert_id=alert_id, job_id="job-b", action=apb.ACK_ACTION_DECLINED
            )
            return stub.Acknowledge(request, timeout=WAIT_S)

        refusals = {
            name: _refusal(partial(ack, alert_id))
            for name, alert_id in (
                ("absent", absent),
                ("cleared event", cleared.id),
                ("on node-3", elsewhere.id),
                ("open on node-1", opened.id),
            )
        }
        assert ack(own.id).accepted  # its own node's alert, as before
    codes = {name: _code(error) for name, error in refusals.items()}
    shapes = {name: re.sub(r"\d+", "N", error.details() or "") for name, error in refusals.items()}
    assert set(codes.values()) == {grpc.StatusCode.PERMISSION_DENIED}, codes
    assert len(set(shapes.values())) == 1, shapes
    told = " ".join(shapes.values())
    for secret in ("CLEARED", "node-3", "node-1"):
        assert secret not in told
    assert [store.acks.of(a.id) for a in (opened, elsewhere)] == [[], []]  # no trace of the refused ones


# -- what one job may hold -------------------------------------------------------------------


def test_a_job_of_80000_nodes_and_300_subscriptions_is_held_to_its_caps(tokened: Tokened) -> None:
    limits = tokened.service.caller_limits
    huge = [f"n{i:05d}" for i in range(80_000)]
    with tokened.channel("job-c") as channel, tokened.channel("alice") as admin:
        stub = apb_grpc.AlertsStub(channel)
        too_many = _refusal(lambda: stub.RegisterJob(apb.RegisterJobRequest(job_id="job-c", nodes=huge)))
        assert "job-c" not in tokened.service.store.jobs.all()
        stub.RegisterJob(
            apb.RegisterJobRequest(job_id="job-c", nodes=huge[: limits.job_nodes]), timeout=WAIT_S
        )
        # Naming more nodes than a job may hold is refused to admins too (their lists reach SQLite).
        listing = _refusal(
            lambda: apb_grpc.AlertsStub(admin).ListActiveAlerts(
                apb.ListActiveAlertsRequest(nodes=huge[:5000])
            )
        )
    assert _code(too_many) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(limits.job_nodes) in (too_many.details() or "")
    assert _code(listing) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert tokened.throttled("job_nodes") == 2

    async def attack() -> tuple[list[object], int]:
        async with tokened.aio_channel("job-c") as trainer:
            stub = apb_grpc.AlertsStub(trainer)
            streams = [stub.Subscribe(apb.SubscribeRequest(job_id="job-c")) for _ in range(300)]
            firsts = await asyncio.wait_for(
                asyncio.gather(*(s.read() for s in streams), return_exceptions=True), WAIT_S
            )
            # Meanwhile another collector pushes its 5 samples and has them acknowledged.
            with tokened.channel("node-1") as collector:
                samples = twin_snapshots(TwinSource(FLEET, 0, []), "node-1", 5)
                acks = await asyncio.to_thread(push, collector, "node-1", samples)
            for stream in streams:
                stream.cancel()
        return firsts, acks[-1].acked_through

    firsts, acked = asyncio.run(attack())
    opened = [f for f in firsts if isinstance(f, apb.SubscribeResponse)]
    refused = [f.code() for f in firsts if isinstance(f, grpc.aio.AioRpcError)]
    assert len(opened) == JOB_SUBSCRIBERS
    assert all(f.HasField("caught_up") for f in opened)
    assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * (300 - JOB_SUBSCRIBERS)
    assert tokened.throttled("job_subscribers") == 300 - JOB_SUBSCRIBERS
    assert acked == 5


# -- malformed bytes and integers SQLite cannot hold -----------------------------------------


def test_malformed_protobuf_bytes_are_invalid_argument_counted_and_not_logged_as_errors(
    tokened: Tokened, caplog: pytest.LogCaptureFixture
) -> None:
    before = tokened.counted("faultcast_ingest_rejects_total", reason="malformed_message")
    codes = []
    with caplog.at_level(logging.WARNING):
        for who, method, kind in (
            ("job-a", "/faultcast.v1.Alerts/Acknowledge", "unary"),
            ("alice", "/faultcast.v1.Admin/SetRemediation", "unary"),
            (None, "/grpc.health.v1.Health/Check", "unary"),
            ("job-a", "/faultcast.v1.Alerts/Subscribe", "server stream"),
            ("node-1", "/faultcast.v1.Telemetry/Push", "bidi stream"),
        ):
            with tokened.channel(who) as channel:
                codes.append(_code(_refusal(lambda: _send_raw(channel, method, kind))))  # noqa: B023
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 5
    after = tokened.counted("faultcast_ingest_rejects_total", reason="malformed_message")
    assert after == before + 5
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in errors if "DecodeError" in r.getMessage()]  # no traceback per bad message


def _send_raw(channel: grpc.Channel, method: str, kind: str) -> object:
    """MALFORMED as the request (or the stream's first message), past the stubs' serializers."""
    if kind == "unary":
        return channel.unary_unary(method, None, None)(MALFORMED, timeout=WAIT_S)
    if kind == "server stream":
        return list(channel.unary_stream(method, None, None)(MALFORMED, timeout=WAIT_S))
    return list(channel.stream_stream(method, None, None)(iter([MALFORMED]), timeout=WAIT_S))


def test_integers_beyond_what_sqlite_holds_and_non_finite_windows_are_invalid_argument(
    tokened: Tokened,
) -> None:
    store = tokened.service.store
    store.jobs.register("job-a", ["node-1", "node-3"])
    (alert,) = store.alerts.append([apb.Alert(node="node-1", gpu=1, state=apb.ALERT_STATE_OPEN, risk=0.9)])
    with tokened.channel("job-a") as channel, tokened.channel("alice") as admin_channel:
        stub = apb_grpc.AlertsStub(channel)

        def ack(alert_id: int, step: int) -> apb.AcknowledgeResponse:
            request = apb.AcknowledgeRequest(
                alert_id=alert_id, job_id="job-a", action=apb.ACK_ACTION_RECEIVED, step=step
            )
            return stub.Acknowledge(request, timeout=WAIT_S)

        refused = [_code(_refusal(lambda: ack(alert.id, 2**63)))]
        beyond = _code(_refusal(lambda: ack(2**63, 1)))  # no alert has that id: as for any absent one
        assert ack(alert.id, 2**63 - 1).accepted  # the largest step SQLite holds
        admin = apb_grpc.AdminStub(admin_channel)
        window = admin.GetRemediation(apb.GetRemediationRequest()).drain_window_seconds
        for bad in (math.nan, math.inf, -math.inf):
            request = apb.SetRemediationRequest(drain_window_seconds=bad)
            refused.append(_code(_refusal(lambda: admin.SetRemediation(request, timeout=WAIT_S))))  # noqa: B023
        after = admin.GetRemediation(apb.GetRemediationRequest()).drain_window_seconds
    assert refused == [grpc.StatusCode.INVALID_ARGUMENT] * 4
    assert beyond == grpc.StatusCode.PERMISSION_DENIED
    assert after == window  # nothing changed
    assert [a.step for a in store.acks.of(alert.id)] == [2**63 - 1]
