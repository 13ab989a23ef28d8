"""Nobody can lock out the admin. The probe: 300 `Health.Watch` streams without
any credentials took every worker thread for good, so SetRemediation, Acknowledge, RegisterJob and
ListActiveAlerts timed out, even after the client left; one Watch kept `faultcast serve` from
exiting on SIGTERM while its /metrics port stayed up."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from faultcast.service.rpc.health import ALL
from faultcast.service.rpc.limits import CallerLimits
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.tokened import Tokened, tokened_service
from tests.serve_process import ServeProcess

WATCHES = 300  # the probe's number: more than the 256 worker threads `serve` starts with
WAIT_S = 30.0  # detects a hang; an answered call takes milliseconds
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def tokened(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tokened]:
    # The probe opened every Watch from one host, more than a host's share without an identity
    # (health_watches_per_host): raised to its number here, where the point is threads, not caps.
    limits = CallerLimits(health_watches_per_host=WATCHES)
    with tokened_service(stub_model, tmp_path_factory.mktemp("starve"), caller_limits=limits) as running:
        yield running


def _open_alert(tokened: Tokened, node: str) -> apb.Alert:
    (alert,) = tokened.service.store.alerts.append(
        [apb.Alert(node=node, gpu=0, state=apb.ALERT_STATE_OPEN, risk=0.9)]
    )
    return alert


async def _everyone_is_answered(tokened: Tokened, alert_id: int) -> list[object]:
    """An admin pauses and resumes remediation; a trainer registers, lists and acknowledges."""
    async with tokened.aio_channel("alice") as admin, tokened.aio_channel("job-a") as trainer:
        pause = apb_grpc.AdminStub(admin).SetRemediation
        alerts = apb_grpc.AlertsStub(trainer)
        return [
            (await pause(apb.SetRemediationRequest(paused=True), timeout=WAIT_S)).paused,
            await alerts.RegisterJob(
                apb.RegisterJobRequest(job_id="job-a", nodes=["node-1"]), timeout=WAIT_S
            ),
            len(
                (
                    await alerts.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id="job-a"), timeout=WAIT_S)
                ).alerts
            )
            > 0,
            (
                await alerts.Acknowledge(
                    apb.AcknowledgeRequest(alert_id=alert_id, job_id="job-a", action=apb.ACK_ACTION_DECLINED),
                    timeout=WAIT_S,
                )
            ).accepted,
            (await pause(apb.SetRemediationRequest(paused=False), timeout=WAIT_S)).paused,
        ]


def test_300_watch_streams_without_credentials_leave_every_other_call_answered(tokened: Tokened) -> None:
    alert = _open_alert(tokened, "node-1")

    async def attack() -> tuple[list[int], list[object], list[object]]:
        async with tokened.aio_channel() as stranger:  # TLS, no token: no identity at all
            health = health_pb2_grpc.HealthStub(stranger)
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(WATCHES)]
            first = await asyncio.wait_for(asyncio.gather(*(w.read() for w in watches)), WAIT_S)
            during = await _everyone_is_answered(tokened, alert.id)
        after = await _everyone_is_answered(tokened, alert.id)  # the attacker has gone
        return [f.status for f in first], during, after

    statuses, during, after = asyncio.run(attack())
    assert statuses == [SERVING] * WATCHES  # every Watch was open and served (on the event loop)
    expected = [True, apb.RegisterJobResponse(), True, True, False]
    assert during == expected
    assert after == expected


def test_watch_streams_past_the_cap_are_refused_and_counted(stub_model: Path, tmp_path: Path) -> None:
    cap = 3
    with tokened_service(stub_model, tmp_path, caller_limits=CallerLimits(health_watches=cap)) as tokened:

        async def attack() -> tuple[grpc.StatusCode, int]:
            async with tokened.aio_channel() as stranger:
                health = health_pb2_grpc.HealthStub(stranger)
                watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(cap)]
                await asyncio.wait_for(asyncio.gather(*(w.read() for w in watches)), WAIT_S)
                extra = health.Watch(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await extra.read()
                checked = await health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
                assert checked.status == SERVING  # Check has no cap: it holds nothing open
            # The client left: its streams no longer count. Wait for the server to see them end.
            await asyncio.wait_for(_until_watching(tokened, 0), WAIT_S)
            async with tokened.aio_channel() as later:
                again = health_pb2_grpc.HealthStub(later).Watch(health_pb2.HealthCheckRequest())
                reopened = await asyncio.wait_for(again.read(), WAIT_S)
                again.cancel()
            return refused.value.code(), reopened.status

        code, reopened = asyncio.run(attack())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert tokened.throttled("health_watches") == 1
        assert reopened == SERVING


async def _until_watching(tokened: Tokened, count: int) -> None:
    """The service's own count of open Watch streams (it changes on the event loop)."""
    while tokened.service.health.watching() != count:
        await asyncio.sleep(0.01)


def test_admin_pauses_remediation_under_watches_subscriptions_and_a_flood_of_calls(
    stub_model: Path, tmp_path: Path
) -> None:
    # Few shared worker threads, so that the flood of trainers' calls keeps all of them busy.
    with tokened_service(stub_model, tmp_path, max_threads=4) as tokened:
        store = tokened.service.store
        for job, node in (("job-a", "node-1"), ("job-b", "node-2"), ("job-c", "node-2")):
            store.jobs.register(job, [node])
        stop, calls = threading.Event(), [0]
        refused: set[grpc.StatusCode] = set()

        def flood(who: str) -> None:
            with tokened.channel(who) as channel:
                stub = apb_grpc.AlertsStub(channel)
                while not stop.is_set():
                    try:
                        stub.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id=who), timeout=WAIT_S)
                    except grpc.RpcError as exc:  # past its call rate: refused, and it keeps trying
                        refused.add(exc.code())
                    calls[0] += 1

        flooders = [threading.Thread(target=flood, args=(who,)) for who in ("job-b", "job-c") * 4]

        async def attack() -> tuple[bool, bool, int]:
            async with tokened.aio_channel() as stranger, tokened.aio_channel("job-a") as trainer:
                health = health_pb2_grpc.HealthStub(stranger)
                watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(100)]
                subscriptions = [
                    apb_grpc.AlertsStub(trainer).Subscribe(apb.SubscribeRequest(job_id="job-a"))
                    for _ in range(50)
                ]
                opened = [w.read() for w in watches] + [s.initial_metadata() for s in subscriptions]
                await asyncio.wait_for(asyncio.gather(*opened), WAIT_S)
                for flooder in flooders:
                    flooder.start()
                before = calls[0]
                async with tokened.aio_channel("alice") as admin:
                    stub = apb_grpc.AdminStub(admin)
                    paused = await stub.SetRemediation(apb.SetRemediationRequest(paused=True), timeout=WAIT_S)
                    settings = await stub.GetRemediation(apb.GetRemediationRequest(), timeout=WAIT_S)
                during = calls[0] - before
                stop.set()
                return paused.paused, settings.paused, during

        try:
            paused, settings, during = asyncio.run(attack())
        finally:
            stop.set()
            for flooder in flooders:
                if flooder.ident is not None:
                    flooder.join(WAIT_S)
        assert paused
        assert settings
        assert tokened.service.remediator.paused_by is not None
        assert during > 0  # the flood was on while the admin was served
        assert refused <= {grpc.StatusCode.RESOURCE_EXHAUSTED}  # the flood's calls were answered too


def test_serve_exits_on_sigterm_with_watch_streams_and_a_subscription_open(
    stub_model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    served = ServeProcess(stub_model, state, tmp_path / "serve.log")
    try:
        health = health_pb2_grpc.HealthStub(served.channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest(), timeout=WAIT_S) for _ in range(3)]
        assert [next(w).status for w in watches] == [SERVING] * 3
        subscription = apb_grpc.AlertsStub(served.channel).Subscribe(
            apb.SubscribeRequest(nodes=["node-1"]), timeout=WAIT_S
        )
        assert next(iter(subscription)).HasField("caught_up")  # open and live
        served.process.send_signal(signal.SIGTERM)
        stopping = [next(w).status for w in watches]  # watchers are told before the streams end
        code = served.process.wait(timeout=WAIT_S)  # a hang here is the bug
    finally:
        served.close()
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log[-3000:]
    assert stopping == [NOT_SERVING] * 3
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", served.metrics_port)):
        pass  # /metrics went with the process: Prometheus sees the service down


def test_any_thread_sets_health_and_watchers_and_checks_see_it(tokened: Tokened) -> None:
    """The handle the rest of the service uses, e.g. NOT_SERVING while the state disk fails."""
    health_handle = tokened.service.health

    def set_all(serving: bool) -> None:  # from a thread that is not the event loop's
        health_handle.set_serving(ALL, serving).result(timeout=WAIT_S)

    async def watch() -> list[int]:
        async with tokened.aio_channel() as stranger:
            health = health_pb2_grpc.HealthStub(stranger)
            watch = health.Watch(health_pb2.HealthCheckRequest(service="faultcast.v1.Alerts"))
            seen = [(await asyncio.wait_for(watch.read(), WAIT_S)).status]
            await asyncio.to_thread(set_all, False)
            seen.append((await asyncio.wait_for(watch.read(), WAIT_S)).status)
            seen.append((await health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)).status)
            await asyncio.to_thread(set_all, True)
            seen.append((await asyncio.wait_for(watch.read(), WAIT_S)).status)
            watch.cancel()
            return seen

    assert asyncio.run(watch()) == [SERVING, NOT_SERVING, NOT_SERVING, SERVING]
    assert health_handle.serving("faultcast.v1.Alerts")
    with pytest.raises(ValueError, match=r"faultcast\.v1\.Alert'"):
        health_handle.set_serving("faultcast.v1.Alert", False)  # a typo is not silently ignored
