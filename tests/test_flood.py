"""A flood does not sink the service: a collector pushing as fast as it can is paced to its share
with what it sends in flight bounded (HTTP/2 flow control does the holding), extra streams and
calls are refused with RESOURCE_EXHAUSTED, a scoring backlog holds every stream back, and
meanwhile other collectors and trainers are served. Callers are told apart by bearer tokens
over TLS, as in production."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from faultcast import wire
from faultcast.demo.feed import push, twin_snapshots
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.rpc.auth import AccessPolicy, TokenBook, digest
from faultcast.service.rpc.limits import CallerLimits, TokenBucket
from faultcast.service.rpc.telemetry import AsyncTelemetryServicer, TelemetryServicer
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.tls import ServerTLS, channel_credentials
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc
from tests.aio_server import aio_telemetry_server
from tests.pki import Authority

FLEET = FleetConfig(nodes=3, days=1.0, seed=11, acceleration=1.0)
LIMITS = CallerLimits(
    push_samples_per_s=40.0,
    push_burst=20,
    streams_per_node=2,
    max_backlog=10_000,
    calls_per_s=2.0,
    call_burst=10,
    subscribers_per_caller=2,
)
TOKENS = {
    "node-r": "rogue-collector",
    "node-g": "good-collector",
    "job-r": "rogue-trainer",
    "job-g": "good-trainer",
}
WAIT_S = 30.0


@dataclass
class Flooded:
    service: Service
    port: int
    ca: Path

    def channel(self, who: str) -> grpc.Channel:
        credentials = channel_credentials(self.ca, token=TOKENS[who])
        return grpc.secure_channel(f"localhost:{self.port}", credentials)

    def throttled(self, what: str) -> float:
        value = self.service.metrics.registry.get_sample_value("faultcast_throttled_total", {"what": what})
        return value or 0.0


@pytest.fixture(scope="module")
def flooded(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flooded]:
    directory = tmp_path_factory.mktemp("flood")
    pki = Authority(directory, "flood")
    server = pki.server()
    tokens = directory / "tokens"
    tokens.write_text(
        "".join(
            f"sha256:{digest(token)} {'trainer' if who.startswith('job') else 'collector'} {who}\n"
            for who, token in TOKENS.items()
        )
    )
    model_dir = directory / "model"
    shutil.copytree(stub_model, model_dir)
    metrics = ServiceMetrics()
    service = Service.open(
        model_dir,
        directory / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), caller_limits=LIMITS),
        metrics=metrics,
        policy=AccessPolicy(tokens=TokenBook(tokens), metrics=metrics),
    )
    port = service.start("127.0.0.1:0", tls=ServerTLS(server.cert, server.key))
    yield Flooded(service, port, pki.ca.cert)
    service.stop(0)


def _endless(
    node: str, template: list[NodeSnapshot], offered: list[int], stop: threading.Event
) -> Iterator[tpb.PushRequest]:
    """A collector gone wild: samples as fast as gRPC will take them, counted as they leave."""
    yield wire.hello(node, 99)
    for sequence in itertools.count(1):
        if stop.is_set():
            return
        snapshot = template[sequence % len(template)]
        offered[0] = sequence
        yield tpb.PushRequest(sample=wire.to_proto(replace(snapshot, sequence=sequence)))


def test_a_flooding_collector_is_paced_and_bounded_while_another_is_served(flooded: Flooded) -> None:
    template = list(twin_snapshots(TwinSource(FLEET, 0, []), "node-r", 50))
    offered, stop = [0], threading.Event()
    rogue_channel = flooded.channel("node-r")
    rogue = tpb_grpc.TelemetryStub(rogue_channel).Push(_endless("node-r", template, offered, stop))
    first_ack = threading.Event()

    def drain() -> None:
        try:
            for _ in rogue:
                first_ack.set()
        except grpc.RpcError:
            pass  # cancelled at the end

    started = time.monotonic()
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    assert first_ack.wait(WAIT_S)  # the flood's stream is open and counted
    with flooded.channel("node-r") as second, flooded.channel("node-r") as third:
        extra = list(twin_snapshots(TwinSource(FLEET, 0, []), "node-r", 1))
        # The flood holds one stream; a second may open (a reconnect), a third may not.
        held = tpb_grpc.TelemetryStub(second).Push(_endless("node-r", template, [0], stop))
        next(iter(held))
        with pytest.raises(grpc.RpcError) as refused:
            push(third, "node-r", extra, spool_id=98)
        held.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Meanwhile a well-behaved collector is served in full.
    with flooded.channel("node-g") as good:
        acks = push(good, "node-g", twin_snapshots(TwinSource(FLEET, 1, []), "node-g", 30))
    assert acks[-1].acked_through == 30
    stop.set()
    rogue.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
    reader.join(WAIT_S)
    elapsed = time.monotonic() - started
    rogue_channel.close()
    taken = flooded.service.telemetry.cursors()[("node-r", 99)]
    # Paced: never more than the burst plus the rate over the time it had.
    assert taken <= LIMITS.push_burst + LIMITS.push_samples_per_s * elapsed + 1
    assert flooded.throttled("push_rate") > 0
    assert flooded.throttled("streams") >= 1
    # Bounded: what it pushed and the service has not read waits in flow-control windows (a few
    # MiB at most), not in the service's memory; it does not grow with the flood's length.
    in_flight = offered[0] - taken
    assert in_flight < 5_000, f"{in_flight} samples in flight: flow control is not holding the sender back"


def test_a_caller_past_its_call_rate_is_refused_and_others_are_not(flooded: Flooded) -> None:
    with flooded.channel("job-r") as rogue_channel, flooded.channel("job-g") as good_channel:
        rogue = apb_grpc.AlertsStub(rogue_channel)
        rogue.RegisterJob(apb.RegisterJobRequest(job_id="job-r", nodes=["node-r"]))
        codes = []
        for _ in range(LIMITS.call_burst * 3):
            try:
                rogue.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id="job-r"))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        good = apb_grpc.AlertsStub(good_channel)
        good.RegisterJob(apb.RegisterJobRequest(job_id="job-g", nodes=["node-g"]))
        answer = good.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id="job-g"))
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert codes.count(grpc.StatusCode.OK) < len(codes)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert list(answer.alerts) == []  # served: the good trainer's own share is untouched
    assert flooded.throttled("calls") >= codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_subscriptions_past_the_cap_per_caller_are_refused(flooded: Flooded) -> None:
    with flooded.channel("job-g") as channel:
        stub = apb_grpc.AlertsStub(channel)
        stub.RegisterJob(apb.RegisterJobRequest(job_id="job-g", nodes=["node-g"]))
        open_streams = [
            stub.Subscribe(apb.SubscribeRequest(job_id="job-g")) for _ in range(LIMITS.subscribers_per_caller)
        ]
        for stream in open_streams:  # each is open once its headers arrive
            stream.initial_metadata()
        extra = stub.Subscribe(apb.SubscribeRequest(job_id="job-g"), timeout=WAIT_S)
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(extra))
        for stream in open_streams:
            stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- the scoring backlog holds every stream back ---------------------------------------------


def test_past_the_backlog_bound_streams_wait_and_go_on_once_the_scorer_catches_up() -> None:
    taken: list[NodeSnapshot] = []
    backlog = [LIMITS.max_backlog + 1]
    waits = threading.Semaphore(0)

    def on_throttle(what: str) -> None:
        if what == "push_backlog":
            waits.release()

    servicer = AsyncTelemetryServicer(
        TelemetryServicer(taken.append), limits=LIMITS, backlog=lambda: backlog[0], on_throttle=on_throttle
    )
    samples = list(twin_snapshots(TwinSource(FLEET, 2, []), "node-b", 3))
    result: list[list[tpb.PushAck]] = []
    with aio_telemetry_server(servicer) as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        pusher = threading.Thread(target=lambda: result.append(push(channel, "node-b", samples)))
        pusher.start()
        assert waits.acquire(timeout=WAIT_S)  # the stream is waiting on the backlog ...
        assert waits.acquire(timeout=WAIT_S)  # ... and keeps waiting while it lasts
        assert taken == []  # nothing was read past the bound
        backlog[0] = 0  # the scorer caught up
        pusher.join(WAIT_S)
    assert [s.sequence for s in taken] == [1, 2, 3]
    assert result[0][-1].acked_through == 3


def test_a_token_bucket_paces_to_its_rate_after_the_burst() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, burst=3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)  # the fourth waits for one token's time
    assert bucket.reserve() == pytest.approx(0.2)  # the fifth behind it
    now[0] = 10.0  # long idle: full again, never more than the burst
    assert [bucket.reserve() for _ in range(4)][-1] == pytest.approx(0.1)
    limited = TokenBucket(rate=1.0, burst=1, clock=lambda: 0.0)
    assert limited.try_take()
    assert not limited.try_take()
