"""Step summaries and windows on the wire (core/wire.py): they survive the round trip; a malformed one
is refused, and a real service rejects that sample as "malformed", counts it and goes on with the
stream; what the service blanks in a GPU's values it blanks in the summary too."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from faultcast import wire
from faultcast.catalogue import Scope, index_of
from faultcast.readings import GpuReading, NodeSnapshot, Reading, pack
from faultcast.service.rpc.telemetry import TelemetryServicer, create_server
from faultcast.service.rpc.validation import Limits
from faultcast.step_summary import StepSummary, combine
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc
from tests.test_shipping import Received

GPU = index_of(Scope.GPU)
T0 = 1_767_571_200 * 10**9


def _values(k: int) -> tuple[float, ...]:
    return pack(
        Scope.GPU,
        {
            "gpu_temp": 50.0 + k % 7,
            "power_usage": 400.0 - 3 * k,
            "sm_clock": 1900.0 + k,
            "total_energy": 1e6 + k,
        },
    )


def _summarised(index: int, scrapes: int = 60) -> GpuReading:
    summary = combine([StepSummary.of(_values(k + index)) for k in range(scrapes)])
    return GpuReading(index, f"GPU-{index}", "H100", _values(scrapes - 1 + index), summary=summary)


def _snapshot(sequence: int = 1, *, gpus: tuple[GpuReading, ...] | None = None) -> NodeSnapshot:
    gpus = (
        gpus
        if gpus is not None
        else (_summarised(0), _summarised(1, 45), GpuReading(2, "GPU-2", "H100", _values(3)))
    )
    snapshot = NodeSnapshot.merge("n1", T0 + 59 * 10**9, [Reading(gpus=gpus)], {})
    return dataclasses.replace(snapshot, sequence=sequence, window_s=60.0)


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def _through_bytes(snapshot: NodeSnapshot) -> NodeSnapshot:
    return wire.from_proto(pb.NodeSample.FromString(wire.to_proto(snapshot).SerializeToString()))


def test_summaries_and_the_window_survive_the_wire() -> None:
    original = _snapshot()
    decoded = _through_bytes(original)
    assert decoded.window_s == 60.0
    for got, sent in zip(decoded.gpus, original.gpus, strict=True):
        assert _same(got.values, sent.values)
        if sent.summary is None:
            assert got.summary is None
            continue
        assert got.summary is not None
        assert got.summary.scrapes == sent.summary.scrapes
        for field in ("minimum", "maximum", "mean"):
            assert _same(getattr(got.summary, field), getattr(sent.summary, field))
    assert [g.summary.scrapes if g.summary else 0 for g in decoded.gpus] == [60, 45, 0]
    assert decoded.gpus[0].summary is not None
    assert decoded.gpus[0].summary.maximum[GPU["power_usage"]] == 400.0  # the first scrape's
    assert decoded.gpus[0].summary.minimum[GPU["power_usage"]] == 400.0 - 3 * 59
    # A plain scrape carries no summary and no window: its GpuSample has no summary fields at all.
    plain = wire.to_proto(dataclasses.replace(original, window_s=0.0, gpus=original.gpus[2:]))
    assert plain.window_s == 0.0
    assert plain.gpus[0].summary_scrapes == 0
    assert len(plain.gpus[0].summary_min) == 0


def _corrupt_short(g: pb.GpuSample) -> None:
    del g.summary_mean[-1]


def _corrupt_order(g: pb.GpuSample) -> None:
    g.summary_min[GPU["gpu_temp"]] = g.summary_max[GPU["gpu_temp"]] + 1.0


def _corrupt_mean(g: pb.GpuSample) -> None:
    g.summary_mean[GPU["sm_clock"]] = g.summary_max[GPU["sm_clock"]] + 100.0


def _corrupt_scrapes(g: pb.GpuSample) -> None:
    g.summary_scrapes = 0  # arrays without a count


CORRUPTIONS: dict[str, tuple[Callable[[pb.GpuSample], None], str]] = {
    "short array": (_corrupt_short, "summary arrays have"),
    "min above max": (_corrupt_order, "summary of gpu_temp"),
    "mean outside": (_corrupt_mean, "summary of sm_clock"),
    "no scrapes": (_corrupt_scrapes, "without summary_scrapes"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_malformed_summary_is_refused_with_the_reason(corruption: str) -> None:
    corrupt, says = CORRUPTIONS[corruption]
    sample = wire.to_proto(_snapshot())
    corrupt(sample.gpus[1])
    with pytest.raises(wire.WireError, match=f"gpu 1.*{says}"):
        wire.from_proto(sample)


@pytest.mark.parametrize("window_s", [-60.0, math.nan])
def test_a_window_that_is_not_a_length_of_time_is_refused(window_s: float) -> None:
    sample = wire.to_proto(_snapshot())
    sample.window_s = window_s
    with pytest.raises(wire.WireError, match="window_s"):
        wire.from_proto(sample)


def _push(port: int, samples: list[pb.NodeSample]) -> list[pb.PushAck]:
    requests = [wire.hello("n1", 7), *(pb.PushRequest(sample=s) for s in samples)]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return list(pb_grpc.TelemetryStub(channel).Push(iter(requests)))


def test_a_real_service_rejects_and_counts_malformed_summaries_and_the_stream_goes_on() -> None:
    received = Received()
    servicer = TelemetryServicer(received, limits=Limits(max_future_s=0, max_age_s=0))
    server, port = create_server(servicer)
    samples = [wire.to_proto(_snapshot(seq)) for seq in range(1, 7)]
    _corrupt_order(samples[1].gpus[0])
    _corrupt_short(samples[3].gpus[1])
    samples[4].window_s = -1.0
    try:
        acks = _push(port, samples)
    finally:
        server.stop(grace=None)
    assert received.sequences == [1, 3, 6]  # the good ones, in order, after the bad ones
    assert servicer.rejects["malformed"] == 3
    assert [
        (r.sequence, "summary" in r.reason or "window_s" in r.reason) for a in acks for r in a.rejections
    ] == [
        (2, True),
        (4, True),
        (5, True),
    ]
    assert acks[-1].acked_through == 6  # rejected samples are acked: resending cannot fix them
    kept = received.snapshots[0].gpus[0].summary
    assert kept is not None
    assert kept.scrapes == 60


def test_what_the_service_blanks_in_the_values_it_blanks_in_the_summary() -> None:
    received = Received()
    servicer = TelemetryServicer(received, limits=Limits(max_future_s=0, max_age_s=0))
    server, port = create_server(servicer)
    sample = wire.to_proto(_snapshot())
    temp, power, clock = GPU["gpu_temp"], GPU["power_usage"], GPU["sm_clock"]
    sample.gpus[0].values[temp] = math.inf  # a bad value: blanked, and its summary with it
    sample.gpus[1].summary_max[power] = 1e30  # a bad summary entry: blanked (min, max and mean)
    try:
        _push(port, [sample])
    finally:
        server.stop(grace=None)
    [snapshot] = received.snapshots
    first, second = snapshot.gpus[0], snapshot.gpus[1]
    assert first.summary is not None
    assert second.summary is not None
    assert math.isnan(first.values[temp])
    assert all(
        math.isnan(x[temp]) for x in (first.summary.minimum, first.summary.maximum, first.summary.mean)
    )
    assert first.summary.maximum[power] == 400.0  # the rest of the summary is kept
    assert second.values[power] == 400.0 - 3 * 45  # the value itself was fine
    assert all(
        math.isnan(x[power]) for x in (second.summary.minimum, second.summary.maximum, second.summary.mean)
    )
    assert second.summary.maximum[clock] == 1900.0 + 45
    assert servicer.blanked == {"non_finite_value": 1, "implausible_value": 1}
