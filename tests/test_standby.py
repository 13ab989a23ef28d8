"""The standby's own rules (faultcast.client.standby): when a run is a standby, how a run that took
the job over is remembered, what a handed-over copy hears, and the exit status of a copy that ends
on faultcast's word. The whole hand-over runs on Slurm in tests/test_handover_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultcast.client import migration, standby
from faultcast.client.snapshots import SnapshotStore


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


def test_the_spares_claim_comes_from_its_environment() -> None:
    assert standby.standby_claim({"FAULTCAST_STANDBY_CLAIM": " c1a1m "}) == "c1a1m"
    assert standby.standby_claim({}) == ""
