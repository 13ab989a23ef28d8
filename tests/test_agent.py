from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from faultcast.catalogue import Scope
from faultcast.collector.agent import NodeCollector
from faultcast.collector.nvml.source import NvmlSource
from faultcast.collector.spool import Spool
from faultcast.readings import Reading, unpack
from faultcast.sim.realtime import SimulatedSource
from faultcast.testing.fake_nvml import FakeNvml


class BrokenSource:
    name = "broken"

    def __init__(self) -> None:
        self.closed = False

    def read(self) -> Reading:
        raise OSError("the device node vanished")

    def close(self) -> None:
        self.closed = True


def test_a_failing_source_is_counted_and_the_others_still_report() -> None:
    broken = BrokenSource()
    # A real source without a virtual clock: the collector stamps the scrape with its wall clock.
    collector = NodeCollector("n1", [broken, NvmlSource(FakeNvml(gpus=3))], wall_clock_ns=lambda: 123)
    snapshot = collector.scrape()
    assert len(snapshot.gpus) == 3
    assert snapshot.time_unix_nano == 123
    assert collector.source_errors == 1
    assert snapshot.notes == ("broken: the device node vanished",)
    health = unpack(Scope.COLLECTOR, snapshot.collector)
    assert health["gpus_present"] == 3
    assert health["source_errors"] == 1
    collector.close()
    assert broken.closed


def test_a_virtual_clock_source_sets_event_time() -> None:
    source = SimulatedSource(gpus=1, cadence_s=60.0, start_unix_nano=10**18)
    collector = NodeCollector("n1", [source], wall_clock_ns=lambda: 5)
    times = [collector.scrape().time_unix_nano for _ in range(3)]
    assert times == [10**18 + k * 60 * 10**9 for k in (0, 1, 2)]


def test_scrapes_are_spooled_with_their_sequence(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    collector = NodeCollector("n1", [SimulatedSource(gpus=1)], spool=spool)
    assert [collector.scrape().sequence for _ in range(3)] == [1, 2, 3]
    assert spool.depth == 3
    latest = collector.latest()
    assert latest is not None
    assert latest.sequence == 3


def test_run_stops_after_its_duration_on_a_controlled_clock() -> None:
    now = [0.0]
    waits: list[float] = []

    class Clock(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            assert timeout is not None
            waits.append(timeout)
            now[0] += timeout
            return False

    collector = NodeCollector("n1", [SimulatedSource(gpus=1)])
    collector.run(2.0, stop=Clock(), duration=10.0, monotonic=lambda: now[0])
    assert collector.scrapes == 6  # at t = 0, 2, 4, 6, 8, 10
    assert waits == [2.0] * 5


def test_the_same_seed_gives_the_same_readings() -> None:
    start = 1_767_571_200 * 10**9
    a, b = SimulatedSource(seed=4, start_unix_nano=start), SimulatedSource(seed=4, start_unix_nano=start)
    for _ in range(3):
        ra, rb = a.read(), b.read()
        assert [g.uuid for g in ra.gpus] == [g.uuid for g in rb.gpus]
        np.testing.assert_array_equal([g.values for g in ra.gpus], [g.values for g in rb.gpus])
    other = SimulatedSource(seed=5, start_unix_nano=start).read()
    assert [g.uuid for g in other.gpus] != [
        g.uuid for g in SimulatedSource(seed=4, start_unix_nano=start).read().gpus
    ]
