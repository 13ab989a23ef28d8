"""The standby's own rules (faultcast.client.standby): when a run is a standby, how a run that took
the job over is remembered, what a handed-over copy hears, the exit status of a copy that ends on
faultcast's word, and which snapshot a hand-over may name (a whole one in the job's own store, symbolic
links resolved). The whole hand-over runs on Slurm in tests/test_handover_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from faultcast.client import migration, standby
from faultcast.client.snapshots import MARKER, Snapshot, SnapshotStore


@pytest.mark.parametrize(
    ("env", "expected", "again"),
    [
        ({"FAULTCAST_STANDBY_FOR": "41"}, "41", False),
        ({"FAULTCAST_STANDBY_FOR": "41", "SLURM_RESTART_COUNT": "0"}, "41", False),
        ({"FAULTCAST_STANDBY_FOR": "41", "SLURM_RESTART_COUNT": "1"}, "41", True),  # Slurm started it again
        ({"FAULTCAST_STANDBY_FOR": " "}, None, False),
        ({}, None, False),
    ],
)
def test_a_run_knows_whether_it_stands_by_and_whether_it_was_started_again(
    env: dict[str, str], expected: str | None, again: bool
) -> None:
    assert standby.standby_for(env) == expected
    assert standby.restarted(env) is again


def test_the_standbys_alert_comes_from_its_environment() -> None:
    assert standby.standby_alert({"FAULTCAST_STANDBY_ALERT": "1796"}) == 1796
    assert standby.standby_alert({"FAULTCAST_STANDBY_ALERT": "x"}) == 0
    assert standby.standby_alert({}) == 0


def test_a_run_that_took_over_is_remembered_for_its_own_id_only(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert not standby.took_over(store, "77")
    standby.mark_taken_over(store, "77", "41", 35)
    assert standby.took_over(store, "77")
    assert not standby.took_over(store, "78")  # a later standby of the same job still stands by
    (tmp_path / standby.TAKEN_OVER).write_text("{not json")
    assert not standby.took_over(store, "77")


def test_only_a_hand_over_reply_stops_the_old_copy() -> None:
    assert migration.handed_over("slurm: drain n1 and hand job 41 over to standby 77")
    assert migration.handed_over(
        "slurm: drain n1 and hand job 41 over to standby 77 (alert 9 is being remediated)"
    )
    assert not migration.handed_over("slurm: drain n1 and requeue job 41")
    assert not migration.handed_over("noted; alert 9 recommends SNAPSHOT_ONLY: n1 stays in service")
    assert not migration.handed_over("acknowledgement failed: DEADLINE_EXCEEDED")


def test_a_copy_that_ends_on_faultcasts_word_exits_75_so_a_script_goes_no_further() -> None:
    with pytest.raises(SystemExit) as released:
        raise standby.StandbyReleased("a false alarm")
    assert released.value.code == standby.EXIT_STOOD_DOWN == 75
    assert "a false alarm" in str(released.value)
    with pytest.raises(SystemExit) as handed:
        raise standby.HandedOver(35)
    assert handed.value.code == 75


# -- the hand-over's snapshot: a whole one in the job's own store, nowhere else ----------------------


def _whole(store: SnapshotStore, step: int) -> Snapshot:
    """A whole snapshot of `step` in `store`, as rank 0 of a 1-rank job writes it."""
    store.save({"model": {"w": torch.full((2,), float(step))}}, step, 0, None, wait=True)
    snapshot = store.finish(step, 0, "alert", 1)
    assert snapshot is not None
    return snapshot


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_the_hand_over_snapshot_is_found_in_the_store_by_uri_or_path_through_a_linked_root(
    tmp_path: Path,
) -> None:
    real = SnapshotStore(tmp_path / "real")
    taken = _whole(real, 35)
    (tmp_path / "link").symlink_to(tmp_path / "real")  # e.g. /ckpt/job -> /lustre/...
    store = SnapshotStore(tmp_path / "link")
    assert standby.snapshot_at(store, taken.uri, 35).step == 35
    assert standby.snapshot_at(store, str(store.path(35)), 35).step == 35
    assert standby.snapshot_at(store, store.path(35).absolute().as_uri(), 35).step == 35


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_whole_snapshot_outside_the_store_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "job")
    _whole(store, 10)
    foreign = _whole(SnapshotStore(tmp_path / "attacker"), 35)
    with pytest.raises(standby.RefusedSnapshotError, match="outside this job's snapshot store") as refused:
        standby.snapshot_at(store, foreign.uri, 35)
    assert str(tmp_path / "attacker" / "step-000000035") in str(refused.value)
    escaping = f"{store.root.resolve()}/../attacker/step-000000035"  # lexically in, resolved out
    with pytest.raises(standby.RefusedSnapshotError, match="outside this job's snapshot store"):
        standby.snapshot_at(store, escaping, 35)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_step_directory_linking_out_of_the_store_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "job")
    _whole(store, 10)
    foreign = _whole(SnapshotStore(tmp_path / "attacker"), 35)
    store.path(35).symlink_to(foreign.path, target_is_directory=True)
    with pytest.raises(standby.RefusedSnapshotError, match="through a symbolic link") as refused:
        standby.snapshot_at(store, store.path(35).as_uri(), 35)
    assert "outside this job's snapshot store" in str(refused.value)


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("s3://bucket/job/step-000000035", "neither a file:// URI nor a path"),
        ("file://evil.example/job/step-000000035", "on another host"),
        ("job/step-000000035", "not an absolute path"),
        ("", "not an absolute path"),
    ],
)
def test_a_hand_over_uri_that_names_no_local_path_is_refused(tmp_path: Path, uri: str, says: str) -> None:
    with pytest.raises(standby.RefusedSnapshotError, match=says):
        standby.snapshot_at(SnapshotStore(tmp_path), uri, 35)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_snapshot_in_the_store_that_is_not_whole_or_of_another_step_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    taken = _whole(store, 35)
    with pytest.raises(standby.RefusedSnapshotError, match="not a whole snapshot of that step"):
        standby.snapshot_at(store, taken.uri, 36)
    (taken.path / MARKER).unlink()
    with pytest.raises(standby.RefusedSnapshotError, match="not a whole snapshot of that step"):
        standby.snapshot_at(store, taken.uri, 35)


def test_the_spares_claim_comes_from_its_environment() -> None:
    assert standby.standby_claim({"FAULTCAST_STANDBY_CLAIM": " c1a1m "}) == "c1a1m"
    assert standby.standby_claim({}) == ""
