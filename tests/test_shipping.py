"""The collector's push to a real gRPC telemetry server on a real port: outages lose nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from faultcast import wire
from faultcast.catalogue import SCHEMA_HASH, Scope, metrics_for
from faultcast.collector.agent import NodeCollector
from faultcast.collector.shipper import Backoff, Shipper
from faultcast.collector.spool import Spool
from faultcast.readings import NodeSnapshot
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.rpc.telemetry import TelemetryServicer, create_server
from faultcast.sim.realtime import SimulatedSource
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc

FAST = Backoff(initial=0.02, maximum=0.2)


class Received:
    """A sink that lets a test wait for what it expects (no sleeps)."""

    def __init__(self) -> None:
        self.snapshots: list[NodeSnapshot] = []
        self._cond = threading.Condition()

    def __call__(self, snapshot: NodeSnapshot) -> None:
        with self._cond:
            self.snapshots.append(snapshot)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.snapshots) >= count, timeout)
        assert ok, f"received {len(self.snapshots)} of {count} samples"

    @property
    def sequences(self) -> list[int]:
        return [s.sequence for s in self.snapshots]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[NodeCollector]:
    spool = Spool(tmp_path / "spool.sqlite", max_samples=1000)
    source = SimulatedSource(gpus=2, seed=1, start_unix_nano=1_700_000_000 * 10**9)
    yield NodeCollector("node-a", [source], spool=spool)
    spool.close()


def _wait_acked(spool: Spool, through: int) -> None:
    assert spool.wait(lambda: spool.acked_through >= through, timeout=30.0), spool.acked_through


def test_a_ten_minute_outage_at_1s_loses_no_sample(collector: NodeCollector) -> None:
    assert collector.spool is not None
    received = Received()
    servicer = TelemetryServicer(received)
    server, port = create_server(servicer)
    shipper = Shipper(f"127.0.0.1:{port}", collector.spool, "node-a", backoff=FAST, seed=0)
    shipper.start()
    try:
        for _ in range(5):
            collector.scrape()
        _wait_acked(collector.spool, 5)
        server.stop(grace=None).wait()

        for _ in range(600):  # ten minutes of samples at a 1 s interval, taken while the service is away
            collector.scrape()
        assert collector.spool.depth == 600

        server, _ = create_server(servicer, f"127.0.0.1:{port}")
        received.wait_for(605)
        _wait_acked(collector.spool, 605)
    finally:
        shipper.close()
        server.stop(grace=None)
    assert received.sequences == list(range(1, 606))
    times = [s.time_unix_nano for s in received.snapshots]
    assert times == sorted(times)
    assert collector.spool.depth == 0
    assert shipper.stats.connects >= 2
    assert servicer.rejects == {}


def test_past_the_spool_bound_the_oldest_are_dropped_and_the_rest_arrive_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite", max_samples=100)
    collector = NodeCollector("node-a", [SimulatedSource(gpus=1, seed=2)], spool=spool)
    for _ in range(150):  # the service is not there at all yet
        collector.scrape()
    assert spool.dropped == 50
    received = Received()
    server, port = create_server(TelemetryServicer(received))
    shipper = Shipper(f"127.0.0.1:{port}", spool, "node-a", backoff=FAST)
    shipper.start()
    try:
        received.wait_for(100)
        _wait_acked(spool, 150)
    finally:
        shipper.close()
        server.stop(grace=None)
    assert received.sequences == list(range(51, 151))


def test_a_resent_sample_is_stored_once(collector: NodeCollector) -> None:
    assert collector.spool is not None
    received = Received()
    server, port = create_server(TelemetryServicer(received))
    for _ in range(3):
        collector.scrape()
    payloads = [pb.NodeSample.FromString(p) for _, p in collector.spool.read_after(0, 10)]
    hello = wire.hello("node-a", collector.spool.spool_id)
    stream = [hello, *(pb.PushRequest(sample=s) for s in payloads + payloads[1:])]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        acks = list(pb_grpc.TelemetryStub(channel).Push(iter(stream)))
    server.stop(grace=None)
    assert received.sequences == [1, 2, 3]
    assert acks[-1].acked_through == 3


def _push(port: int, requests: list[pb.PushRequest]) -> list[pb.PushAck]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return list(pb_grpc.TelemetryStub(channel).Push(iter(requests)))


def test_bad_samples_are_rejected_counted_and_acked_while_good_ones_are_kept(
    collector: NodeCollector,
) -> None:
    assert collector.spool is not None
    received = Received()
    servicer = TelemetryServicer(received)
    server, port = create_server(servicer)
    try:
        for _ in range(4):
            collector.scrape()
        samples = [pb.NodeSample.FromString(p) for _, p in collector.spool.read_after(0, 10)]
        del samples[1].gpus[0].values[:5]  # malformed
        samples[2].node = "node-b"  # someone else's sample on this stream
        acks = _push(port, [wire.hello("node-a", 42), *(pb.PushRequest(sample=s) for s in samples)])
    finally:
        server.stop(grace=None)
    assert received.sequences == [1, 4]
    assert servicer.rejects == {"malformed": 1, "wrong_node": 1}
    assert acks[-1].acked_through == 4
    reasons = [r.reason for a in acks for r in a.rejections]
    assert "gpu 0" in reasons[0]
    assert "node-b" in reasons[1]


def test_a_stream_without_hello_or_with_another_schema_gets_a_clear_status(collector: NodeCollector) -> None:
    server, port = create_server(TelemetryServicer(Received()))
    try:
        snapshot = collector.scrape()
        with pytest.raises(grpc.RpcError) as no_hello:
            _push(port, [pb.PushRequest(sample=wire.to_proto(snapshot))])
        other = wire.hello("node-a", 1)
        other.hello.schema.schema_hash ^= 1
        with pytest.raises(grpc.RpcError) as mismatch:
            _push(port, [other])
    finally:
        server.stop(grace=None)
    assert no_hello.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "PushHello" in str(no_hello.value.details())
    assert mismatch.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "schema" in str(mismatch.value.details())


def test_two_streams_of_one_collector_never_store_a_sample_twice(collector: NodeCollector) -> None:
    # During a reconnect the old stream may still be draining while the new one resends.
    assert collector.spool is not None
    received = Received()
    servicer = TelemetryServicer(received)
    server, port = create_server(servicer)
    for _ in range(200):
        collector.scrape()
    samples = [pb.NodeSample.FromString(p) for _, p in collector.spool.read_after(0, 500)]
    hello = wire.hello("node-a", collector.spool.spool_id)
    stream = [hello, *(pb.PushRequest(sample=s) for s in samples)]
    results: list[list[pb.PushAck]] = []
    threads = [threading.Thread(target=lambda: results.append(_push(port, stream))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    server.stop(grace=None)
    assert sorted(received.sequences) == list(range(1, 201))
    assert servicer.duplicates == 200
    assert all(acks[-1].acked_through == 200 for acks in results)


def test_a_sample_without_a_sequence_is_rejected_with_the_reason(collector: NodeCollector) -> None:
    received = Received()
    servicer = TelemetryServicer(received)
    server, port = create_server(servicer)
    try:
        sample = wire.to_proto(collector.scrape())
        sample.sequence = 0
        acks = _push(port, [wire.hello("node-a", 7), pb.PushRequest(sample=sample)])
    finally:
        server.stop(grace=None)
    assert received.sequences == []
    assert servicer.rejects == {"no_sequence": 1}
    assert "sequence 0" in acks[0].rejections[0].reason


def _scopes_swapped() -> pb.PushRequest:
    """A hello with this catalogue's hash whose GPU scope lists two metrics the other way round."""
    hello = wire.hello("node-a", 1)
    names = hello.hello.schema.scopes[0].metrics
    names[0], names[1] = names[1], names[0]
    return hello


def _scope_missing() -> pb.PushRequest:
    hello = wire.hello("node-a", 1)
    del hello.hello.schema.scopes[-1]
    return hello


def _scope_twice() -> pb.PushRequest:
    hello = wire.hello("node-a", 1)
    hello.hello.schema.scopes.append(hello.hello.schema.scopes[0])
    return hello


@pytest.mark.parametrize(
    ("hello", "says"),
    [(_scopes_swapped, "SCOPE_GPU has"), (_scope_missing, "is missing"), (_scope_twice, "sent twice")],
)
def test_a_hello_with_the_right_hash_and_other_scopes_is_refused_at_the_hello(
    collector: NodeCollector, hello: Callable[[], pb.PushRequest], says: str
) -> None:
    received = Received()
    metrics = ServiceMetrics()
    servicer = TelemetryServicer(received, metrics=metrics)
    server, port = create_server(servicer)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            _push(port, [hello(), pb.PushRequest(sample=wire.to_proto(collector.scrape()))])
    finally:
        server.stop(grace=None)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert says in str(refused.value.details())
    assert received.sequences == []
    assert servicer.rejects == {"schema_mismatch": 1}  # once, at the hello: no sample was looked at
    assert (
        metrics.registry.get_sample_value("faultcast_ingest_rejects_total", {"reason": "schema_mismatch"})
        == 1
    )


def test_a_hello_without_scopes_is_taken_on_its_hash(collector: NodeCollector) -> None:
    received = Received()
    server, port = create_server(TelemetryServicer(received))
    hello = wire.hello("node-a", 1)
    hello.hello.schema.ClearField("scopes")
    try:
        acks = _push(port, [hello, pb.PushRequest(sample=wire.to_proto(collector.scrape()))])
    finally:
        server.stop(grace=None)
    assert acks[-1].acked_through == 1
    assert received.sequences == [1]


def test_ingest_lag_is_never_negative_and_a_clock_ahead_shows_on_its_own(collector: NodeCollector) -> None:
    metrics = ServiceMetrics()
    sample = wire.to_proto(collector.scrape())
    event_s = sample.time_unix_nano / 1e9
    now = [event_s - 120.0]  # the node's clock runs two minutes ahead of the service's
    servicer = TelemetryServicer(Received(), metrics=metrics, clock=lambda: now[0])
    server, port = create_server(servicer)

    def gauges() -> tuple[float | None, float | None]:
        labels = {"node": "node-a"}
        return (
            metrics.registry.get_sample_value("faultcast_ingest_lag_seconds", labels),
            metrics.registry.get_sample_value("faultcast_ingest_clock_ahead_seconds", labels),
        )

    try:
        _push(port, [wire.hello("node-a", 1), pb.PushRequest(sample=sample)])
        ahead = gauges()
        now[0] = event_s + 7.0 + 120.0  # the next sample arrives 7 s after its event time
        later = wire.to_proto(collector.scrape())
        later.time_unix_nano = int((event_s + 120.0) * 1e9)
        _push(port, [wire.hello("node-a", 1), pb.PushRequest(sample=later)])
        behind = gauges()
    finally:
        server.stop(grace=None)
    assert ahead[0] == 0.0
    assert ahead[1] == pytest.approx(120.0)
    assert behind[0] == pytest.approx(7.0)
    assert behind[1] == 0.0


def test_get_schema_describes_every_metric_in_wire_order() -> None:
    server, port = create_server(TelemetryServicer(Received()))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            published = pb_grpc.TelemetryStub(channel).GetSchema(pb.GetSchemaRequest())
    finally:
        server.stop(grace=None)
    assert published.schema_hash == SCHEMA_HASH
    for scope in published.scopes:
        catalogue = metrics_for(Scope(pb.Scope.Name(scope.scope).removeprefix("SCOPE_").lower()))
        assert list(scope.metrics) == [m.name for m in catalogue]
        assert [(d.name, d.unit, d.help) for d in scope.descriptions] == [
            (m.name, m.unit, m.help) for m in catalogue
        ]
        assert all(d.kind != pb.METRIC_KIND_UNSPECIFIED for d in scope.descriptions)
    assert len(published.scopes) == len(Scope)
