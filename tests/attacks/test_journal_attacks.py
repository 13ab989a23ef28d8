"""Attacks on the sample journal's size (issue 41): one collector identity sending samples of 877 KiB
(110,000-character model names), or many samples inside one model step, grew the journal without
bound, and it was not pruned after other nodes' saves. Oversize fields are refused at validation
with their reason; a node past its journal bound, and every node once the journal is past half of
its bound, is saved, so that the segments holding its samples go; nothing taken is lost."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from pathlib import Path

from faultcast.demo.feed import push, twin_snapshots
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import MAX_GPU_LABEL, Limits
from faultcast.service.server import Service
from faultcast.service.state.store import StateStore
from faultcast.sim.live import TwinSource
from tests.attacks.victim import FLEET, serving

SAMPLE_BYTES = 19_000  # about what the journal holds of one twin sample (8 GPUs with step summaries)


def _samples(node: int, count: int) -> list[NodeSnapshot]:
    """`count` samples of one node, all inside one model step (no step completes: no periodic save)."""
    name = FLEET.node_name(node)
    first = next(iter(twin_snapshots(TwinSource(FLEET, node), name, 1)))
    start = first.time_unix_nano - first.time_unix_nano % int(FLEET.cadence_s * 1e9)
    return [
        replace(first, time_unix_nano=start + i * 1_000_000, sequence=i + 1, spool_id=3) for i in range(count)
    ]


def test_an_oversize_model_name_is_refused_with_its_reason_and_the_stream_goes_on(
    stub_model: Path, tmp_path: Path
) -> None:
    first, second, third = _samples(0, 3)
    gpus = (replace(second.gpus[0], model_name="H" * 110_000), *second.gpus[1:])
    name = FLEET.node_name(0)
    with serving(stub_model, tmp_path / "state", tmp_path) as (service, channel):
        acks = push(channel, name, [first, replace(second, gpus=gpus), third])
        held = service.journal.bytes
        assert service.telemetry.rejects["oversize_field"] == 1
    assert [r.reason for a in acks for r in a.rejections] == [
        f"sample from {name}: GPU 0's model name is 110000 long (limit {MAX_GPU_LABEL})"
    ]
    assert max(a.acked_through for a in acks) == 3  # the samples after it are taken
    assert held < 3 * SAMPLE_BYTES  # the refused one was never journalled


def _service(model: Path, state: Path, **bounds: int) -> Service:
    config = ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), **bounds)  # type: ignore[arg-type]
    return Service(load(model), StateStore.in_dir(state), config, model_dir=model)


def _restarted(model: Path, state: Path) -> dict[tuple[str, int], int]:
    """What a service started after a kill -9 takes back: the last sequence per (node, spool)."""
    service = _service(model, state)
    service.recover()
    cursors = service.scorer.cursors()
    service.store.close()
    return cursors


def test_one_node_flooding_inside_a_step_is_saved_and_its_segments_go(
    stub_model: Path, tmp_path: Path
) -> None:
    # 40 samples inside one model step: no step completes, so no periodic save came; every one was
    # kept in the journal until a clean stop.
    state = tmp_path / "state"
    service = _service(stub_model, state, journal_node_bytes=5 * SAMPLE_BYTES)
    flood = _samples(0, 40)
    most = 0
    for sample in flood:
        service._ingest(sample)
        service.score_now()  # the scoring thread's turn
        most = max(most, service.journal.bytes)
    service.store.close()  # killed: no stop, no last save

    assert most < 12 * SAMPLE_BYTES  # the node's bound and a segment begun since
    assert _restarted(stub_model, state)[(flood[0].node, 3)] == 40  # its saved state and the journal: all


def test_a_node_that_sent_once_does_not_pin_the_journal_under_anothers_flood(
    stub_model: Path, tmp_path: Path
) -> None:
    # The quiet node's first sample pinned the journal's first segment; the flood filled segment
    # after segment behind it, none of which could go until the quiet node's next save.
    state = tmp_path / "state"
    service = _service(stub_model, state, journal_bytes=20 * SAMPLE_BYTES)
    service.journal.segment_bytes = 3 * SAMPLE_BYTES
    quiet, flood = _samples(1, 1)[0], _samples(0, 60)
    service._ingest(quiet)
    most = 0
    for sample in flood:
        service._ingest(sample)
        service.score_now()
        most = max(most, service.journal.bytes)
    service.store.close()

    assert most <= 20 * SAMPLE_BYTES  # never refused: saved before the bound
    assert not service._journal_failing
    cursors = _restarted(stub_model, state)
    assert cursors[(quiet.node, 3)] == 1
    assert cursors[(flood[0].node, 3)] == 60


def test_a_segment_that_cannot_be_deleted_breaks_neither_scoring_nor_a_clean_stop(
    stub_model: Path, tmp_path: Path
) -> None:
    # A directory in a segment's name failed every scoring tick ("the samples of this tick are
    # lost"), and a clean stop then exited 1 with a traceback.
    state = tmp_path / "state"
    (state / "journal" / f"{1:012d}.log").mkdir(parents=True)
    service = _service(stub_model, state, checkpoint_steps=1)
    for sample in _samples(0, 3):
        service._ingest(replace(sample, time_unix_nano=sample.time_unix_nano + sample.sequence * 60 * 10**9))
        service.score_now()  # a step completed: its node saved, the journal before it forgotten
    service.stop()
    assert service.journal.undeletable == {1}
    assert service.journal.segments() == [1, service.journal.segment]


def test_a_journal_ending_in_zeros_starts_and_replays_what_is_before_them(
    stub_model: Path, tmp_path: Path
) -> None:
    # A power cut leaves the last segment's size updated and its data not: every start exited 1
    # with a struct.error from the journal's reader.
    state = tmp_path / "state"
    service = _service(stub_model, state)
    for sample in _samples(0, 5):
        service._ingest(sample)
    service.store.close()  # killed
    with (state / "journal" / f"{service.journal.segment:012d}.log").open("ab") as segment:
        segment.write(bytes(4096))

    assert _restarted(stub_model, state)[(FLEET.node_name(0), 3)] == 5


def test_a_planted_segment_name_near_the_last_loses_no_sample_across_a_kill(
    stub_model: Path, tmp_path: Path
) -> None:
    # After a planted 999999999998.log the service's saves rotated the journal into 13-digit names,
    # which no start lists: the samples after the last save were lost to a kill -9.
    state = tmp_path / "state"
    (state / "journal").mkdir(parents=True)
    (state / "journal" / "999999999998.log").write_bytes(b"")
    service = _service(stub_model, state, journal_node_bytes=5 * SAMPLE_BYTES)
    flood = _samples(0, 40)
    for sample in flood:
        service._ingest(sample)
        service.score_now()  # saves past the node's bound: each begins a new segment
    service.store.close()  # killed

    assert all(len(p.stem) == 12 for p in (state / "journal").iterdir())
    assert _restarted(stub_model, state)[(flood[0].node, 3)] == 40


def test_a_huge_sparse_segment_starts_in_the_memory_of_its_records(stub_model: Path, tmp_path: Path) -> None:
    # A planted sparse 3 GiB segment was read whole at every start: a MemoryError where less was free.
    state = tmp_path / "state"
    service = _service(stub_model, state)
    for sample in _samples(0, 5):
        service._ingest(sample)
    service.store.close()  # killed
    with (state / "journal" / f"{service.journal.segment:012d}.log").open("r+b") as segment:
        segment.truncate(1 << 30)  # sparse: no disk used

    tracemalloc.start()
    try:
        assert _restarted(stub_model, state)[(FLEET.node_name(0), 3)] == 5
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20  # the whole start, model and scorer included; the segment is 1 GiB
