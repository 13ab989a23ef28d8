from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from faultcast.catalogue import Scope
from faultcast.collector.agent import NodeCollector
from faultcast.collector.spool import Spool
from faultcast.readings import unpack
from faultcast.sim.realtime import SimulatedSource
from faultcast.v1 import telemetry_pb2 as pb


def _sample(node: str = "n1", t: int = 0) -> pb.NodeSample:
    return pb.NodeSample(node=node, time_unix_nano=t)


def test_sequences_increase_and_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    assert [spool.append(_sample(t=i)) for i in range(3)] == [1, 2, 3]
    spool_id = spool.spool_id
    spool.ack(2)
    spool.close()

    reopened = Spool(tmp_path / "s.sqlite")
    assert reopened.spool_id == spool_id
    assert reopened.acked_through == 2
    assert reopened.depth == 1
    assert reopened.append(_sample(t=3)) == 4
    rows = reopened.read_after(reopened.acked_through, 10)
    assert [seq for seq, _ in rows] == [3, 4]
    assert pb.NodeSample.FromString(rows[0][1]).time_unix_nano == 2


def test_sequences_keep_increasing_after_everything_was_acked(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    spool.append(_sample())
    spool.ack(1)
    spool.close()
    assert Spool(tmp_path / "s.sqlite").append(_sample()) == 2


def test_a_new_spool_gets_a_new_identity(tmp_path: Path) -> None:
    assert Spool(tmp_path / "a.sqlite").spool_id != Spool(tmp_path / "b.sqlite").spool_id


def test_ack_trims_and_ignores_old_acks(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for _ in range(5):
        spool.append(_sample())
    assert spool.ack(3) == 3
    assert spool.ack(2) == 0
    assert spool.depth == 2
    assert [seq for seq, _ in spool.read_after(0, 10)] == [4, 5]
    with pytest.raises(ValueError, match="beyond the last"):
        spool.ack(6)


def test_past_the_bound_the_oldest_are_dropped_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_samples=10)
    with caplog.at_level(logging.WARNING):
        for _ in range(25):
            spool.append(_sample())
    assert spool.depth == 10
    assert spool.dropped == 15
    assert [seq for seq, _ in spool.read_after(0, 100)] == list(range(16, 26))
    assert "dropped the 1 oldest" in caplog.text
    spool.close()
    assert Spool(tmp_path / "s.sqlite", max_samples=10).dropped == 15


def test_read_after_respects_the_limit(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite")
    for _ in range(10):
        spool.append(_sample())
    assert [seq for seq, _ in spool.read_after(4, 3)] == [5, 6, 7]


def test_a_bound_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Spool(tmp_path / "s.sqlite", max_samples=0)


# -- lack of space ---------------------------------------------------------------------------------


def _bulky(t: int, values: int = 190) -> pb.NodeSample:
    """About 1.5 kB on the wire, like a small node's sample: two to a page."""
    return pb.NodeSample(node="n1", time_unix_nano=t, host_values=[float(t)] * values)


def _out_of_space_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is out of space" in r.getMessage()]


def _fill(spool: Spool, until_dropped: int, *, values: int = 190, first: int = 0, limit: int = 20_000) -> int:
    """Append bulky samples until `until_dropped` were dropped for space; returns how many were
    appended. Every append must keep its sample (the newest is never the one dropped)."""
    t = first
    while spool.dropped_no_space < until_dropped and t < first + limit:
        sequence = spool.append(_bulky(t, values))
        assert sequence == spool.last_sequence
        t += 1
    assert spool.dropped_no_space >= until_dropped, "never ran out of space"
    return t - first


def _assert_oldest_dropped_newest_kept(spool: Spool, appended: int) -> None:
    """Sequences 1..appended went in; the stored ones must be the newest, with none missing."""
    assert spool.depth + spool.dropped_no_space == appended
    rows = spool.read_after(0, appended + 1)
    assert [seq for seq, _ in rows] == list(range(spool.dropped_no_space + 1, appended + 1))
    assert pb.NodeSample.FromString(rows[-1][1]).time_unix_nano == appended - 1


def test_past_max_bytes_the_oldest_are_dropped_in_batches_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.sqlite"
    spool = Spool(path, max_bytes=64 << 10)
    with caplog.at_level(logging.WARNING, logger="faultcast.collector.spool"):
        appended = _fill(spool, until_dropped=40, values=50)  # some ten samples to a page
    _assert_oldest_dropped_newest_kept(spool, appended)
    assert spool.dropped == 0  # the sample-count bound played no part
    events = _out_of_space_warnings(caplog)
    assert events
    assert len(events) < spool.dropped_no_space / 2  # a warning per append that dropped, not per sample
    assert "max_bytes 65536" in events[0]
    assert not any("disk" in r.getMessage() for r in caplog.records)  # the bound, not a full disk
    dropped = spool.dropped_no_space
    spool.close()
    assert path.stat().st_size <= 64 << 10
    assert Spool(path, max_bytes=64 << 10).dropped_no_space == dropped


def test_the_byte_bound_holds_with_the_sample_bound_dropping_too(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_bytes=64 << 10, max_samples=25)
    appended = _fill(spool, until_dropped=10)
    spool.append(_bulky(appended))  # and whichever bound bites first, the newest stays
    rows = spool.read_after(0, appended + 2)
    assert rows[-1][0] == spool.last_sequence == appended + 1
    assert spool.depth == len(rows)
    assert spool.depth + spool.dropped + spool.dropped_no_space == appended + 1


def test_a_sample_not_even_an_empty_spool_can_hold_is_dropped_counted_and_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.sqlite"
    spool = Spool(path, max_bytes=64 << 10)
    assert spool.append(_sample(t=1)) == 1
    huge = _bulky(2, values=20_000)  # 160 kB
    with caplog.at_level(logging.WARNING, logger="faultcast.collector.spool"):
        assert spool.append(huge) == 0
    assert huge.sequence == 0
    assert spool.dropped_no_space == 2  # the one stored, dropped to make room, and the huge one
    assert spool.depth == 0
    assert "cannot store a" in caplog.text
    assert spool.append(_sample(t=3)) == 2  # no sequence number was used up
    spool.close()
    assert Spool(path, max_bytes=64 << 10).dropped_no_space == 2


def test_a_byte_bound_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes must be at least"):
        Spool(tmp_path / "s.sqlite", max_bytes=4096)


def test_the_collector_exports_the_no_space_drops(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite", max_bytes=64 << 10)
    collector = NodeCollector("n1", [SimulatedSource(gpus=8)], spool=spool)
    for _ in range(200):
        collector.scrape()
        if spool.dropped_no_space:
            break
    dropped = spool.dropped_no_space
    assert dropped > 0
    health = unpack(Scope.COLLECTOR, collector.scrape().collector)
    assert health["spool_dropped_no_space"] == dropped
    assert health["spool_errors"] == 0


class BrokenSpool(Spool):
    """A spool whose disk fails (an I/O error, not lack of space)."""

    def append(self, sample: pb.NodeSample) -> int:
        raise sqlite3.OperationalError("disk I/O error")


def test_a_failing_spool_is_counted_and_the_scrapes_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector = NodeCollector("n1", [SimulatedSource(gpus=1)], spool=BrokenSpool(tmp_path / "s.sqlite"))
    with caplog.at_level(logging.WARNING, logger="faultcast.collector.agent"):
        first = collector.scrape()
        second = collector.scrape()
    assert first.sequence == 0
    assert collector.spool_errors == 2
    assert unpack(Scope.COLLECTOR, second.collector)["spool_errors"] == 1  # counted before the append
    assert collector.latest() is second
    assert "disk I/O error" in caplog.text


# -- a real full filesystem ------------------------------------------------------------------------


def test_on_a_full_disk_the_oldest_are_dropped_and_the_spool_grows_again_when_room_returns(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = small_disk / "other-files"
    other.write_bytes(bytes(1 << 20))  # someone else's files, deleted later
    spool = Spool(small_disk / "s.sqlite", reserve_bytes=256 << 10)
    with caplog.at_level(logging.WARNING, logger="faultcast.collector.spool"):
        appended = _fill(spool, until_dropped=100)
        _assert_oldest_dropped_newest_kept(spool, appended)
        assert 0 < len(_out_of_space_warnings(caplog)) < spool.dropped_no_space / 2
        assert caplog.text.count("(reserve released)") == 1
        assert not spool.reserve_path.exists()  # spent, to let the log be checkpointed

        depth, dropped = spool.depth, spool.dropped_no_space
        other.unlink()
        for t in range(appended, appended + 100):
            assert spool.append(_bulky(t)) == t + 1
    assert spool.dropped_no_space == dropped  # room again: the spool grew rather than drop
    assert spool.depth == depth + 100
    assert "has room again" in caplog.text
    assert spool.reserve_path.stat().st_size == 256 << 10  # taken back for the next time
    spool.close()


def test_on_a_full_disk_without_a_reserve_new_samples_are_dropped_counted_and_append_does_not_raise(
    small_disk: Path,
) -> None:
    # What the reserve is for: with none, the write-ahead log cannot be checkpointed into a file
    # that cannot grow, so not even a DELETE can be written and the newest samples are the ones lost.
    (small_disk / "other-files").write_bytes(bytes(1 << 20))
    spool = Spool(small_disk / "s.sqlite", reserve_bytes=0)
    results: list[int] = []
    while results.count(0) < 20 and len(results) < 5000:
        results.append(spool.append(_bulky(len(results))))
    lost = results.count(0)
    assert lost == 20
    stored = [r for r in results if r]
    assert stored == list(range(1, len(stored) + 1))  # unstored samples use up no sequence number
    assert spool.dropped_no_space >= lost
    assert spool.depth + spool.dropped_no_space == len(results)
    spool.close()
