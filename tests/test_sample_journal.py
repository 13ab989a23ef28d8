"""The sample journal (service/state/sample_journal.py): samples back as they were written, in order, across
segments; a torn or damaged tail ends its segment's replay with a warning, and nothing after it is
taken for a sample; old segments go once no node needs them; a new run never appends to a segment a
killed one left."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.readings import NodeSnapshot
from faultcast.service.state.sample_journal import SampleJournal
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from tests.disk import fill

FLEET = FleetConfig(nodes=2, days=1.0, seed=3, acceleration=1.0)


def _samples(count: int) -> list[NodeSnapshot]:
    return list(twin_snapshots(TwinSource(FLEET, 1), "node-1", count))


def _same(a: NodeSnapshot, b: NodeSnapshot) -> bool:
    """Equal, NaN equal to NaN (a value not read stays not read)."""

    def values(s: NodeSnapshot) -> list[object]:
        flat: list[object] = [s.node, s.time_unix_nano, s.sequence, s.window_s, s.spool_id]
        for g in s.gpus:
            flat += [g.index, g.uuid, g.model_name, g.lost, *g.values]
            if g.summary is not None:
                flat += [g.summary.scrapes, *g.summary.minimum, *g.summary.maximum, *g.summary.mean]
        for d in s.devices:
            flat += [d.scope, d.device, *d.values]
        return [*flat, *s.host, *s.collector]

    return all(
        (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y
        for x, y in zip(values(a), values(b), strict=True)
    )


def test_samples_come_back_as_written_in_order_across_segments(tmp_path: Path) -> None:
    journal = SampleJournal(tmp_path, segment_bytes=50_000)  # a few samples a segment
    written = _samples(20)
    written = [replace(s, spool_id=2**64 - 5) for s in written]
    segments = [journal.append(s) for s in written]
    journal.close()

    assert len(set(segments)) > 3
    back = list(SampleJournal(tmp_path).entries())
    assert [e.sequence for e in back] == [s.sequence for s in written]
    assert [e.segment for e in back] == segments
    assert {e.spool_id for e in back} == {2**64 - 5}  # the whole 64-bit range
    assert all(_same(e.snapshot, s) for e, s in zip(back, written, strict=True))
    assert next(iter(SampleJournal(tmp_path).entries(since=segments[-1]))).segment == segments[-1]


def test_a_new_run_writes_a_new_segment(tmp_path: Path) -> None:
    first = SampleJournal(tmp_path)
    first.append(_samples(1)[0])
    # Killed: no close. The next run must not append after a tail that may be torn.
    second = SampleJournal(tmp_path)
    assert second.append(_samples(2)[1]) == first.segment + 1


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_a_damaged_tail_ends_its_segments_replay_and_later_segments_still_count(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = SampleJournal(tmp_path)
    samples = _samples(6)
    for s in samples[:3]:
        journal.append(replace(s, spool_id=1))
    first = journal.segment
    journal.rotate()
    for s in samples[3:]:
        journal.append(replace(s, spool_id=1))
    journal.close()
    path = tmp_path / f"{first:012d}.log"
    data = bytearray(path.read_bytes())
    if damage == "torn":
        del data[-100:]  # the last record cut short, as by a power cut
    else:
        data[-100] ^= 0xFF  # one byte changed in the last record
    path.write_bytes(bytes(data))

    reader = SampleJournal(tmp_path)
    back = [e.sequence for e in reader.entries()]

    assert back == [s.sequence for s in samples[:2] + samples[3:]]
    assert reader.damaged == 1
    assert "not replayed" in caplog.text


def test_old_segments_are_forgotten_but_never_the_one_being_written(tmp_path: Path) -> None:
    journal = SampleJournal(tmp_path)
    samples = _samples(4)
    for s in samples:
        journal.append(replace(s, spool_id=1))
        journal.rotate()
    journal.append(samples[0])
    now = journal.segment
    assert journal.forget_before(now - 1) == now - 2
    assert journal.segments() == [now - 1, now]
    assert journal.forget_before(now + 10) == 1  # capped at the segment being written
    assert journal.segments() == [now]


def test_on_a_full_disk_a_write_is_refused_and_the_journal_goes_on_once_there_is_room(
    small_disk: Path,
) -> None:
    journal = SampleJournal(small_disk / "journal")
    first, refused, later = _samples(3)
    journal.append(replace(first, spool_id=1))
    filler = fill(small_disk)
    with pytest.raises(OSError, match=r"No space left|wrote"):  # nothing of it counts as written
        journal.append(replace(refused, spool_id=1))
    filler.unlink()
    journal.append(replace(later, spool_id=1))
    journal.close()
    # What was refused is not there (a part of it may be, torn: its segment's replay ends before it).
    assert [e.sequence for e in SampleJournal(small_disk / "journal").entries()] == [1, 3]
