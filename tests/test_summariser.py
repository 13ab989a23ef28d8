"""The collector ships one sample per epoch-aligned window: the window's last scrape, each GPU with the
step summary of its gauges over the window's scrapes (collector/summariser.py, NodeCollector's
`ship_step_s`), and a real service takes it whole."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from faultcast import wire
from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.collector.agent import NodeCollector
from faultcast.collector.shipper import Backoff, Shipper
from faultcast.collector.spool import Spool
from faultcast.collector.summariser import StepSummariser
from faultcast.readings import GpuReading, NodeSnapshot, Reading, pack
from faultcast.service.rpc.telemetry import TelemetryServicer, create_server
from faultcast.step_summary import StepSummary, combine
from faultcast.v1 import telemetry_pb2 as pb
from tests.test_shipping import Received

S = 10**9
T0 = 1_767_571_200 * S  # a whole minute: 2026-01-05 00:00:00 UTC
GPU = index_of(Scope.GPU)
GAUGES = np.array([m.kind.value == "gauge" for m in metrics_for(Scope.GPU)])


def _gpu(index: int, k: int, *, uuid: str = "", lost: bool = False) -> GpuReading:
    """GPU `index` at scrape k: temperature and power move with k, energy (a counter) grows."""
    if lost:
        return GpuReading(
            index, uuid or f"GPU-{index}", "H100", pack(Scope.GPU, {"gpu_lost": 1.0}), lost=True
        )
    values = {
        "gpu_temp": 40.0 + (k * 7 + index) % 13,
        "power_usage": 300.0 + 10 * index + (50.0 if k % 20 == 5 else 0.0),  # a spike now and then
        "sm_clock": 1980.0 - (300.0 if k == 17 else 0.0),
        "total_energy": 1000.0 * k + index,
        "ecc_sbe_volatile": float(k // 10),
    }
    return GpuReading(index, uuid or f"GPU-{index}", "H100", pack(Scope.GPU, values))


class Scripted:
    """A source that replays readings made by `make(k)` at event time `times[k]` (a virtual clock)."""

    name = "scripted"

    def __init__(self, times: list[int], make: Callable[[int], tuple[GpuReading, ...]]) -> None:
        self.times, self.make, self.k = times, make, 0

    def read(self) -> Reading:
        k, self.k = self.k, self.k + 1
        return Reading(gpus=self.make(k), time_unix_nano=self.times[k])

    def close(self) -> None:
        pass


def _spooled(spool: Spool) -> list[NodeSnapshot]:
    return [wire.from_proto(pb.NodeSample.FromString(b)) for _, b in spool.read_after(0, 10_000)]


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    s = Spool(tmp_path / "spool.sqlite")
    yield s
    s.close()


def _collect(spool: Spool, times: list[int], make: Callable[[int], tuple[GpuReading, ...]]) -> NodeCollector:
    collector = NodeCollector("n1", [Scripted(times, make)], spool=spool, ship_step_s=60.0)
    for _ in times:
        collector.scrape()
    return collector


def _expected(k_range: range, index: int) -> StepSummary:
    """The summary written out by hand: min, max and mean of each gauge over the scrapes (a metric
    this test never sets is NaN in every scrape, so in the summary too)."""
    rows = np.array([_gpu(index, k).values for k in k_range])
    lo = np.where(np.isnan(rows), np.inf, rows).min(axis=0)
    hi = np.where(np.isnan(rows), -np.inf, rows).max(axis=0)
    stats = [np.where(GAUGES & np.isfinite(x), x, math.nan) for x in (lo, hi, rows.mean(axis=0))]
    return StepSummary(len(k_range), *(tuple(x.tolist()) for x in stats))


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return bool(np.allclose(np.asarray(a), np.asarray(b), equal_nan=True, rtol=1e-12, atol=0))


def test_sixty_one_second_scrapes_ship_as_one_sample_with_the_window_summarised(spool: Spool) -> None:
    # 60 scrapes fill the minute [T0, T0 + 60 s); the 61st lands in the next minute and closes it.
    times = [T0 + k * S for k in range(61)]
    collector = _collect(spool, times, lambda k: (_gpu(0, k), _gpu(1, k)))
    [sample] = _spooled(spool)
    assert sample.sequence == 1
    assert sample.window_s == 60.0
    assert sample.time_unix_nano == T0 + 59 * S  # the window's last scrape
    for gpu in sample.gpus:
        last = _gpu(gpu.index, 59)
        assert _same(gpu.values, last.values)  # values and counters at the window's end
        assert gpu.get("total_energy") == 59_000.0 + gpu.index
        summary = gpu.summary
        assert summary is not None
        expected = _expected(range(60), gpu.index)
        assert summary.scrapes == 60
        assert _same(summary.minimum, expected.minimum)
        assert _same(summary.maximum, expected.maximum)
        assert _same(summary.mean, expected.mean)
        assert summary.maximum[GPU["power_usage"]] == 350.0 + 10 * gpu.index  # the spikes are kept
        assert summary.minimum[GPU["sm_clock"]] == 1680.0  # the clock dip at scrape 17
        assert math.isnan(summary.mean[GPU["total_energy"]])  # counters are not summarised
    # The exporter still sees every scrape; the spool one sample per window.
    assert collector.scrapes == 61
    latest = collector.latest()
    assert latest is not None
    assert latest.time_unix_nano == T0 + 60 * S
    assert latest.gpus[0].summary is None
    assert collector.samples_spooled == 1


def test_windows_are_epoch_aligned_in_event_time_and_one_sample_is_spooled_per_window(spool: Spool) -> None:
    # 150 one-second scrapes from 30 s into a minute: windows [0, 60), [60, 120), [120, 180) of it.
    times = [T0 + (30 + k) * S for k in range(150)]
    collector = _collect(spool, times, lambda k: (_gpu(0, k),))
    assert [s.time_unix_nano for s in _spooled(spool)] == [T0 + 59 * S, T0 + 119 * S]
    collector.close()  # the window still open ([120 s, 180 s): 60 scrapes so far) is flushed
    samples = _spooled(spool)
    assert [s.sequence for s in samples] == [1, 2, 3]
    assert [s.time_unix_nano for s in samples] == [T0 + 59 * S, T0 + 119 * S, T0 + 179 * S]
    assert [s.gpus[0].summary.scrapes for s in samples if s.gpus[0].summary] == [30, 60, 60]
    assert all(s.window_s == 60.0 for s in samples)
    collector.close()
    assert len(_spooled(spool)) == 3  # nothing was left to flush


def test_a_twin_at_speed_decides_windows_by_its_virtual_clock(spool: Spool) -> None:
    # Each scrape is a minute of virtual time (the demo's twin at 240x): one sample per scrape.
    times = [T0 + k * 60 * S for k in range(5)]
    collector = _collect(spool, times, lambda k: (_gpu(0, k),))
    collector.close()
    samples = _spooled(spool)
    assert [s.time_unix_nano for s in samples] == times
    assert [s.gpus[0].summary.scrapes for s in samples if s.gpus[0].summary] == [1] * 5


def test_a_gpu_swapped_mid_window_is_summarised_from_the_swap() -> None:
    summariser = StepSummariser(60.0)
    for k in range(60):
        uuid = "GPU-old" if k < 40 else "GPU-new"
        closed = summariser.add(_snapshot(T0 + k * S, (_gpu(0, k, uuid=uuid), _gpu(1, k))))
        assert closed is None
    sample = summariser.flush()
    assert sample is not None
    swapped, other = sample.gpus
    assert swapped.uuid == "GPU-new"
    assert swapped.summary is not None
    assert other.summary is not None
    after_swap = combine([StepSummary.of(_gpu(0, k).values) for k in range(40, 60)])
    assert swapped.summary.scrapes == 20
    assert _same(swapped.summary.minimum, after_swap.minimum)
    assert _same(swapped.summary.mean, after_swap.mean)
    assert other.summary.scrapes == 60
    assert summariser.flush() is None


def test_a_gpu_lost_mid_window_ships_lost_with_the_scrapes_that_had_values() -> None:
    summariser = StepSummariser(60.0)
    for k in range(60):
        summariser.add(_snapshot(T0 + k * S, (_gpu(0, k, lost=k >= 45),)))
    sample = summariser.flush()
    assert sample is not None
    [gpu] = sample.gpus
    assert gpu.lost
    assert gpu.get("gpu_lost") == 1.0  # the last scrape's values
    assert math.isnan(gpu.get("gpu_temp"))
    assert gpu.summary is not None
    assert gpu.summary.scrapes == 45
    assert _same(gpu.summary.maximum, _expected(range(45), 0).maximum)


def test_a_reading_that_carries_its_own_summary_counts_as_its_scrapes() -> None:
    # A source that already summarised ten scrapes per reading (the twin's live source at a 10 s step).
    def summarised(k: int) -> GpuReading:
        parts = [StepSummary.of(_gpu(0, 10 * k + j).values) for j in range(10)]
        gpu = _gpu(0, 10 * k + 9)
        return GpuReading(gpu.index, gpu.uuid, gpu.model_name, gpu.values, summary=combine(parts))

    summariser = StepSummariser(60.0)
    for k in range(6):
        summariser.add(_snapshot(T0 + (10 * k + 9) * S, (summarised(k),)))
    sample = summariser.flush()
    assert sample is not None
    summary = sample.gpus[0].summary
    assert summary is not None
    assert summary.scrapes == 60
    expected = _expected(range(60), 0)
    assert _same(summary.minimum, expected.minimum)
    assert _same(summary.maximum, expected.maximum)
    assert _same(summary.mean, expected.mean)
    assert summariser.scrapes == 6
    assert summariser.samples == 1


def test_ship_step_zero_spools_every_scrape(spool: Spool) -> None:
    times = [T0 + k * S for k in range(5)]
    collector = NodeCollector("n1", [Scripted(times, lambda k: (_gpu(0, k),))], spool=spool)
    assert [collector.scrape().sequence for _ in times] == [1, 2, 3, 4, 5]
    assert all(s.window_s == 0 and s.gpus[0].summary is None for s in _spooled(spool))
    with pytest.raises(ValueError, match="positive"):
        StepSummariser(0.0)


def test_the_collector_ships_one_summarised_sample_per_minute_to_a_real_service(spool: Spool) -> None:
    received = Received()
    server, port = create_server(TelemetryServicer(received))
    times = [T0 + k * S for k in range(125)]
    collector = NodeCollector("n1", [Scripted(times, lambda k: (_gpu(0, k), _gpu(1, k)))], spool=spool,
                              ship_step_s=60.0)  # fmt: skip
    shipper = Shipper(f"127.0.0.1:{port}", spool, "n1", backoff=Backoff(initial=0.02, maximum=0.2), seed=0)
    shipper.start()
    try:
        for _ in times:
            collector.scrape()
        collector.flush()
        received.wait_for(3)
        assert spool.wait(lambda: spool.acked_through >= 3, timeout=30.0)
    finally:
        shipper.close()
        server.stop(grace=None)
    assert received.sequences == [1, 2, 3]
    assert [s.window_s for s in received.snapshots] == [60.0] * 3
    assert [[g.summary.scrapes if g.summary else 0 for g in s.gpus] for s in received.snapshots] == [
        [60, 60],
        [60, 60],
        [5, 5],
    ]
    first = received.snapshots[0].gpus[1].summary
    assert first is not None
    assert _same(first.mean, _expected(range(60), 1).mean)


def _snapshot(t: int, gpus: tuple[GpuReading, ...]) -> NodeSnapshot:
    return NodeSnapshot.merge("n1", t, [Reading(gpus=gpus)], {})
