"""What a collector written from proto/README.md may send, pushed through the telemetry servicer of a
real service: empty `host_values` and `collector_values` mean nothing read (a
third-party collector that reads no host metrics still pushes its GPUs); a `window_s` no collector
can have closed is a malformed sample with a reason, never a failure of the service's scoring."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from faultcast import wire
from faultcast.catalogue import Scope, metrics_for
from faultcast.demo.feed import twin_snapshots
from faultcast.service.server import Service
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc
from tests.attacks.victim import FLEET, serving


@pytest.fixture(scope="module")
def served(
    stub_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, grpc.Channel]]:
    scratch = tmp_path_factory.mktemp("sample-contract")
    with serving(stub_model, scratch / "state", scratch) as running:
        yield running


def _samples(node: int, count: int) -> list[pb.NodeSample]:
    """`count` twin samples of one node, numbered from 1, as the service's own wire encodes them."""
    name = FLEET.node_name(node)
    return [wire.to_proto(s) for s in twin_snapshots(TwinSource(FLEET, node, []), name, count)]


def _push(channel: grpc.Channel, samples: list[pb.NodeSample]) -> list[pb.PushAck]:
    def requests() -> Iterator[pb.PushRequest]:
        yield wire.hello(samples[0].node, 1)
        for sample in samples:
            yield pb.PushRequest(sample=sample)

    return list(pb_grpc.TelemetryStub(channel).Push(requests()))


def test_samples_without_host_or_collector_values_are_taken_and_scored(
    served: tuple[Service, grpc.Channel],
) -> None:
    service, channel = served
    samples = _samples(0, 5)
    for sample in samples:
        del sample.host_values[:]
        del sample.collector_values[:]
    rejected_before = sum(service.telemetry.rejects.values())
    acks = _push(channel, samples)
    assert [list(a.rejections) for a in acks] == [[] for _ in samples]
    assert acks[-1].acked_through == len(samples)
    assert sum(service.telemetry.rejects.values()) == rejected_before
    decoded = wire.from_proto(samples[0])
    assert len(decoded.host) == len(metrics_for(Scope.HOST))
    assert all(map(math.isnan, decoded.host))
    assert len(decoded.collector) == len(metrics_for(Scope.COLLECTOR))
    assert all(map(math.isnan, decoded.collector))


def _short_host(sample: pb.NodeSample) -> None:
    del sample.host_values[1:]


def _short_collector(sample: pb.NodeSample) -> None:
    del sample.collector_values[2:]


def _no_gpu_values(sample: pb.NodeSample) -> None:
    del sample.gpus[0].values[:]


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [(_short_host, "host values"), (_short_collector, "collector values"), (_no_gpu_values, "gpu 0")],
)
def test_values_present_but_short_are_still_malformed(
    corrupt: Callable[[pb.NodeSample], None], named: str
) -> None:
    (sample,) = _samples(0, 1)
    corrupt(sample)
    with pytest.raises(wire.WireError, match=named):
        wire.from_proto(sample)


IMPOSSIBLE_WINDOWS = (1e-300, 1e-9, math.inf, -math.inf, math.nan, -60.0, 1e9)


def test_an_impossible_window_is_a_malformed_sample_and_the_stream_goes_on(
    served: tuple[Service, grpc.Channel],
) -> None:
    service, channel = served
    samples = _samples(1, len(IMPOSSIBLE_WINDOWS) + 1)
    for sample, window in zip(samples, IMPOSSIBLE_WINDOWS, strict=False):
        sample.window_s = window
    malformed_before = service.telemetry.rejects["malformed"]
    acks = _push(channel, samples)
    reasons = {r.sequence: r.reason for a in acks for r in a.rejections}
    assert sorted(reasons) == list(range(1, len(IMPOSSIBLE_WINDOWS) + 1))
    for sequence, window in enumerate(IMPOSSIBLE_WINDOWS, 1):
        assert reasons[sequence].startswith(f"window_s {window!r}"), reasons[sequence]
    assert service.telemetry.rejects["malformed"] - malformed_before == len(IMPOSSIBLE_WINDOWS)
    assert service.telemetry.rejects["scoring_error"] == 0
    assert acks[-1].acked_through == len(samples)  # the last sample, a single scrape, was taken


@pytest.mark.parametrize("window_s", [0.0, wire.MIN_WINDOW_S, 60.0, wire.MAX_WINDOW_S])
def test_windows_a_collector_can_close_are_taken(window_s: float) -> None:
    (sample,) = _samples(0, 1)
    sample.window_s = window_s
    assert wire.from_proto(sample).window_s == window_s
