from __future__ import annotations

import logging
from pathlib import Path

import pytest

from faultcast.collector.spool import Spool
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
