"""The sample journal (service/state/sample_journal.py): samples back as they were written, in order, across
segments; a torn or damaged tail ends its segment's replay with a warning, and nothing after it is
taken for a sample; old segments go once no node needs them; a new run never appends to a segment a
killed one left."""

from __future__ import annotations

import math
import struct
import tracemalloc
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.readings import NodeSnapshot
from faultcast.service.state.sample_journal import JournalFull, SampleJournal
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


def _written(directory: Path, count: int) -> tuple[SampleJournal, list[NodeSnapshot]]:
    """A journal with `count` samples in one segment, closed as a killed run leaves it."""
    journal = SampleJournal(directory)
    samples = [replace(s, spool_id=1) for s in _samples(count)]
    for s in samples:
        journal.append(s)
    journal.close()
    return journal, samples


@pytest.mark.parametrize(
    "tail",
    [
        bytes(4096),  # a power cut: the size updated, the data not
        bytes(8),  # one zero header: a length-0 record whose CRC-32 (0) matches
        struct.pack("!II", 1, zlib.crc32(b"x")) + b"x",  # whole, checksummed, too short for a node name
        struct.pack("!II", 3, zlib.crc32(b"\x00\x09a")) + b"\x00\x09a",  # a name running past the record
    ],
    ids=["zeros", "zero-header", "one-byte-record", "short-name"],
)
def test_a_record_that_cannot_be_read_whole_ends_its_segment_and_the_rest_replays(
    tmp_path: Path, tail: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # Each of these stopped every start with a struct.error from the entry reader.
    journal, samples = _written(tmp_path, 3)
    path = tmp_path / f"{journal.segment:012d}.log"
    good = path.stat().st_size
    with path.open("ab") as segment:
        segment.write(tail)

    reader = SampleJournal(tmp_path)
    assert [e.sequence for e in reader.entries()] == [s.sequence for s in samples]
    assert reader.damaged == 1
    (line,) = [r.getMessage() for r in caplog.records if "not replayed" in r.getMessage()]
    assert path.name in line
    assert f"at byte {good} of {good + len(tail)}" in line


def test_a_planted_last_segment_name_has_the_segments_numbered_again_in_order(tmp_path: Path) -> None:
    # After 999999999999.log the next segment's name had 13 digits: never listed, never replayed.
    _, samples = _written(tmp_path, 2)
    (tmp_path / "999999999999.log").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a segment")

    second = SampleJournal(tmp_path)
    assert second.segments() == [1, 2]  # the journal's own first, the planted one after it
    later = [replace(s, spool_id=1) for s in _samples(4)[2:]]
    for s in later:
        assert second.append(s) == 3
    second.close()  # as a kill -9 leaves it: nothing saved, all in the journal

    third = SampleJournal(tmp_path)
    assert [e.sequence for e in third.entries()] == [s.sequence for s in samples + later]
    assert third.segment == 4


def test_a_segment_that_cannot_be_deleted_is_logged_once_and_the_journal_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / f"{1:012d}.log").mkdir()  # a directory in a segment's name
    journal = SampleJournal(tmp_path)
    assert journal.segment == 2
    samples = [replace(s, spool_id=1) for s in _samples(2)]
    journal.append(samples[0])
    journal.rotate()
    journal.append(samples[1])

    assert journal.forget_before(journal.segment) == 1  # segment 2 went, the directory stayed
    assert journal.forget_before(journal.segment) == 0
    assert journal.undeletable == {1}
    assert sum("cannot be deleted" in r.getMessage() for r in caplog.records) == 1
    journal.close()
    assert [e.sequence for e in SampleJournal(tmp_path).entries()] == [samples[1].sequence]


def test_a_write_past_the_journals_bound_is_refused_and_taken_again_once_there_is_room(
    tmp_path: Path,
) -> None:
    first, refused, later = [replace(s, spool_id=1) for s in _samples(3)]
    journal = SampleJournal(tmp_path)
    journal.append(first)
    journal.rotate()
    journal.max_bytes = journal.bytes  # full
    with pytest.raises(JournalFull):  # refused before anything is written
        journal.append(refused)
    assert journal.bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    journal.forget_before(journal.segment)  # the state covering the first sample was saved
    assert journal.bytes == 0
    journal.append(later)
    journal.close()
    assert [e.sequence for e in SampleJournal(tmp_path).entries()] == [later.sequence]
    assert SampleJournal(tmp_path).bytes == sum(p.stat().st_size for p in tmp_path.iterdir())


@pytest.mark.parametrize("planted", [999_999_999_998, 10**11])
def test_a_planted_name_below_the_last_still_leaves_every_segment_written_listed(
    tmp_path: Path, planted: int
) -> None:
    # Only the last name itself was numbered again: after 999999999998.log the journal went on to
    # write 1000000000000.log, never listed, and a restart replayed 1 of the 3 samples written.
    (tmp_path / f"{planted:012d}.log").write_bytes(b"")
    journal = SampleJournal(tmp_path)
    samples = [replace(s, spool_id=1) for s in _samples(3)]
    for s in samples:
        journal.append(s)
        journal.rotate()
    journal.close()

    assert all(len(p.stem) == 12 for p in tmp_path.iterdir())
    assert [e.sequence for e in SampleJournal(tmp_path).entries()] == [s.sequence for s in samples]


def test_at_the_last_name_the_journal_stays_in_that_segment_and_names_none_past_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A run that reaches the last name (no start saw it coming) rotated to a 13-digit name.
    journal = SampleJournal(tmp_path, segment_bytes=1)  # every append past the first would roll over
    journal.segment = 999_999_999_999
    samples = [replace(s, spool_id=1) for s in _samples(3)]
    for s in samples:
        assert journal.append(s) == 999_999_999_999
        assert journal.rotate() == 999_999_999_999
    journal.close()

    assert [p.name for p in tmp_path.iterdir()] == ["999999999999.log"]
    assert sum("last segment name" in r.getMessage() for r in caplog.records) == 1
    restarted = SampleJournal(tmp_path)  # numbered from 1 again: room for the next
    assert [e.sequence for e in restarted.entries()] == [s.sequence for s in samples]
    assert restarted.segment == 2


def test_segments_an_earlier_version_named_past_12_digits_are_kept_and_replayed_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What the version before wrote after a planted 999999999998.log: 13-digit names, never listed,
    # their samples never replayed and the files kept for ever.
    samples = [replace(s, spool_id=1) for s in _samples(3)]
    for s, name in zip(samples, ["999999999999", "1000000000000", "1000000000001"], strict=True):
        journal = SampleJournal(tmp_path / "one")
        journal.append(s)
        journal.close()
        (tmp_path / "one" / f"{journal.segment:012d}.log").rename(tmp_path / f"{name}.log")
    (tmp_path / "one").rmdir()
    (tmp_path / "0000000000009.log").write_bytes(b"")  # no version names a segment so: not one

    reader = SampleJournal(tmp_path)
    assert [e.sequence for e in reader.entries()] == [s.sequence for s in samples]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "0000000000009.log",
        "000000000001.log",
        "000000000002.log",
        "000000000003.log",
    ]
    (line,) = [r.getMessage() for r in caplog.records if "numbered from 1 again" in r.getMessage()]
    assert "2 segment(s) named past 12 digits" in line


def _peak_while_replaying(directory: Path) -> tuple[list[int], int]:
    """The sequences a fresh journal on `directory` replays, and the most memory Python held for it."""
    reader = SampleJournal(directory)
    tracemalloc.start()
    try:
        sequences = [e.sequence for e in reader.entries()]
        return sequences, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_huge_sparse_segment_replays_in_the_memory_of_a_record(tmp_path: Path) -> None:
    # Each segment was read whole: a planted sparse 3 GiB segment made every start fail with a
    # MemoryError on a host with 2 GiB free. Now the zeros after the samples end the segment at once.
    journal, samples = _written(tmp_path, 2)
    with (tmp_path / f"{journal.segment:012d}.log").open("r+b") as segment:
        segment.truncate(1 << 30)  # sparse: no disk used

    sequences, peak = _peak_while_replaying(tmp_path)
    assert sequences == [s.sequence for s in samples]
    assert peak < 1 << 20  # a record is about 19 KB; the segment 1 GiB


def test_a_length_the_segment_cannot_hold_is_not_allocated(tmp_path: Path) -> None:
    journal, samples = _written(tmp_path, 1)
    with (tmp_path / f"{journal.segment:012d}.log").open("ab") as segment:
        segment.write(struct.pack("!II", 60 << 20, 0) + bytes(100))  # claims 60 MiB, holds 100 bytes

    sequences, peak = _peak_while_replaying(tmp_path)
    assert sequences == [samples[0].sequence]
    assert peak < 1 << 20
