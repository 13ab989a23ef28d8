"""A damaged state database is refused with one clear line, never taken for a fresh one; alert ids
never go backwards, even when the database is replaced by a new one."""

from __future__ import annotations

import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

from faultcast.service.state.db import StateError, StateWriteError
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.disk import fill
from tests.serve_process import FAULTCAST


def _open_event(node: str = "node-0001", gpu: int = 0) -> apb.Alert:
    return apb.Alert(node=node, gpu=gpu, state=apb.ALERT_STATE_OPEN, risk=0.5)


def _filled(state_dir: Path, events: int = 35) -> StateStore:
    store = StateStore.in_dir(state_dir)
    store.alerts.append([_open_event(gpu=i % 8) for i in range(events)])
    store.jobs.register("job-a", ["node-0001"])
    store.settings.save("remediation_paused_by", "admin")
    return store


def _refusal(state_dir: Path) -> str:
    with pytest.raises(StateError) as refused:
        StateStore.in_dir(state_dir)
    return str(refused.value)


def test_a_zero_byte_database_is_refused_not_started_empty(tmp_path: Path) -> None:
    _filled(tmp_path).close()
    path = tmp_path / "faultcast-service.sqlite"
    for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)
    path.write_bytes(b"")
    message = _refusal(tmp_path)
    assert str(path) in message
    assert "empty" in message
    assert "backup" in message
    assert "\n" not in message  # one line


def test_a_corrupt_page_is_refused_at_start(tmp_path: Path) -> None:
    store = _filled(tmp_path, events=400)  # several pages of alert payloads
    store.close()
    path = tmp_path / "faultcast-service.sqlite"
    with sqlite3.connect(path) as db:  # fold the WAL into the file, so the damage is in what is read
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[3 * page : 3 * page + 12] = b"\xa5" * 12  # scribble over a page's b-tree header
    path.write_bytes(bytes(data))
    message = _refusal(tmp_path)
    assert str(path) in message
    assert "damaged" in message or "cannot be read" in message


def test_a_half_truncated_database_is_refused_with_one_line(tmp_path: Path) -> None:
    _filled(tmp_path, events=400).close()
    path = tmp_path / "faultcast-service.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = _refusal(tmp_path)
    assert str(path) in message
    assert "\n" not in message


def test_a_directory_in_place_of_the_database_is_refused_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "faultcast-service.sqlite").mkdir()
    message = _refusal(tmp_path)
    assert "is a directory" in message


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "faultcast-service.sqlite").write_bytes(b"not a database, but a text file\n" * 200)
    assert "cannot be read" in _refusal(tmp_path)


def test_alert_ids_never_go_backwards_when_the_database_is_replaced(tmp_path: Path) -> None:
    old = _filled(tmp_path / "old", events=35)
    last_old = old.alerts.last_id
    old.close()
    # The operator moved the damaged database away; the service starts on a new one.
    new = StateStore.in_dir(tmp_path / "new")
    (first_new,) = new.alerts.append([_open_event()])
    assert first_new.id > last_old
    # A subscriber that had read the old log up to its end and resumes after it misses nothing new.
    assert [a.id for a in new.alerts.read_after(last_old)] == [first_new.id]
    new.close()
    again = StateStore.in_dir(tmp_path / "new")
    (second,) = again.alerts.append([_open_event()])
    assert second.id > first_new.id
    again.close()


def _copy_database(source: Path, target: Path) -> None:
    """SQLite's online backup, as an operator takes one (and restores it)."""
    with closing(sqlite3.connect(source)) as db, closing(sqlite3.connect(target)) as out:
        db.backup(out)


def test_alert_ids_never_go_backwards_when_a_backup_is_restored(tmp_path: Path) -> None:
    live = tmp_path / "live" / "faultcast-service.sqlite"
    _filled(live.parent, events=3).close()
    _copy_database(live, tmp_path / "backup.sqlite")
    store = StateStore.in_dir(live.parent)
    # Given out, then lost with the restore.
    given_out = [a.id for a in store.alerts.append([_open_event() for _ in range(5)])]
    store.close()
    for name in (live.name, f"{live.name}-wal", f"{live.name}-shm"):
        (live.parent / name).unlink(missing_ok=True)
    _copy_database(tmp_path / "backup.sqlite", live)
    restored = StateStore.in_dir(live.parent)
    (after,) = restored.alerts.append([_open_event()])
    assert after.id > max(given_out)
    restored.close()


def test_a_start_cut_off_after_the_schema_does_not_give_out_ids_from_1(tmp_path: Path) -> None:
    """A kill between creating the tables and seeding the ids left a log whose next id was 1."""
    path = tmp_path / "faultcast-service.sqlite"
    StateStore.in_dir(tmp_path).close()
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM sqlite_sequence")  # as if the seeding never happened
    store = StateStore.in_dir(tmp_path)
    (first,) = store.alerts.append([_open_event()])
    assert first.id > 10**15  # from the clock, not 1
    store.close()


def test_a_write_ahead_log_without_its_database_is_refused(tmp_path: Path) -> None:
    store = _filled(tmp_path)
    path = tmp_path / "faultcast-service.sqlite"
    wal = tmp_path / "faultcast-service.sqlite-wal"
    keep = wal.read_bytes()
    store.close()
    path.unlink()
    wal.write_bytes(keep or b"\0" * 4096)  # the log of writes the lost file had not taken in yet
    assert "write-ahead log" in _refusal(tmp_path)


def test_a_full_disk_at_start_is_named_as_such_not_as_damage(small_disk: Path) -> None:
    state = small_disk / "state"
    _filled(state).close()
    for leftover in ("-wal", "-shm"):
        (state / f"faultcast-service.sqlite{leftover}").unlink(missing_ok=True)
    filler = fill(small_disk)
    message = _refusal(state)
    assert "full" in message
    assert "not found damaged" in message
    assert "backup" not in message
    filler.unlink()
    reopened = StateStore.in_dir(state)  # space is back: the same database, intact
    assert reopened.jobs.all() == {"job-a": ["node-0001"]}
    reopened.close()


def test_a_small_write_that_works_does_not_report_a_recovery_while_alert_writes_fail(
    small_disk: Path,
) -> None:
    changes: list[bool] = []
    store = StateStore.in_dir(small_disk / "state", on_writable=lambda ok, why: changes.append(ok))
    filler = fill(small_disk)
    big = [apb.Alert(node="node-0001", gpu=0, state=apb.ALERT_STATE_OPEN, cleared_reason="x" * 50_000)] * 40
    with pytest.raises(StateWriteError):
        store.alerts.append(big)
    assert changes == [False]
    store.settings.save("remediation_paused_by", None)  # a no-op delete: it "works"
    assert changes == [False]
    assert not store.writable
    filler.unlink()
    store.alerts.append(big)
    assert changes == [False, True]
    store.close()


def test_an_existing_database_keeps_its_data_and_ids_across_a_restart(tmp_path: Path) -> None:
    store = _filled(tmp_path)
    last = store.alerts.last_id
    store.close()
    reopened = StateStore.in_dir(tmp_path)
    assert reopened.alerts.last_id == last
    assert reopened.jobs.all() == {"job-a": ["node-0001"]}
    assert reopened.settings.get("remediation_paused_by") == "admin"
    reopened.close()


@pytest.mark.parametrize("damage", ["empty", "half", "directory"])
def test_serve_on_a_damaged_database_exits_with_one_line_naming_the_file(
    damage: str, stub_model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    path = state / "faultcast-service.sqlite"
    if damage == "directory":
        path.mkdir(parents=True)
    else:
        _filled(state, events=400).close()
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = path.read_bytes()
        path.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    done = subprocess.run(
        [
            FAULTCAST,
            "serve",
            "--insecure",
            "--model",
            str(stub_model),
            "--state-dir",
            str(state),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert str(path) in errors[0]
    assert "restore it from a backup" in errors[0]
