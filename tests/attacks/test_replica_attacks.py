"""Buddy replicas (faultcast.client.replicas) when their host memory or a peer works against them:
a replica root another user made first, temporary files of replicas killed on their way, a full
tmpfs, a buddy lying about the size of its part. Replicas degrade (a warning, a count in their stats,
the step before stays the newest whole one), they never stop the job or end training. In process,
in a world of one rank (gloo), but the lying buddy, which is a 2-rank torchrun job."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from faultcast.client.replicas import BuddyReplicas
from faultcast.client.train_state import TrainState
from tests.disk import fill

KEY = b"replica-test-key-of-32-bytes...."
LIAR_JOB = Path(__file__).parent.parent / "fixtures" / "replica_liar_job.py"
WAIT_S = 240.0
NOBODY = 65534


@pytest.fixture
def world_of_one(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=(tmp_path / "store").as_uri())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _replicas(root: Path) -> BuddyReplicas:
    state = TrainState(model=torch.nn.Linear(4, 2))
    return BuddyReplicas(state, KEY, every=1, job_id="job", root=root, node="n0")


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize("made_by", ["another user", "a symbolic link"])
def test_a_replica_root_made_first_by_someone_else_is_passed_over_and_a_restart_finds_the_replicas(
    tmp_path: Path, made_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "shm" / "faultcast-0"
    if made_by == "another user":
        root.mkdir(parents=True, mode=0o777)
        root.chmod(0o777)  # others may write it; and, where the test may, it is theirs
        if os.geteuid() == 0:
            os.chown(root, NOBODY, NOBODY)
    else:
        (tmp_path / "theirs").mkdir(mode=0o700)
        root.parent.mkdir()
        root.symlink_to(tmp_path / "theirs")
    replicas = _replicas(root)  # the job starts
    replicas.step_end(1)
    replicas.close()
    assert not root.resolve().is_symlink()
    assert not list(root.resolve().iterdir())
    assert replicas.folder.parent.parent.parent == root.parent
    assert replicas.stats.made == 1
    for folder in (replicas.folder.parent, replicas.folder.parent.parent):
        status = folder.lstat()
        assert folder.is_dir()
        assert not folder.is_symlink()
        assert (status.st_uid, status.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert _warnings(caplog, f"the folder {root} is not used") == 1
    restarted = _replicas(root)
    assert restarted.folder == replicas.folder  # the same folder beside the root: named from the key
    assert restarted.restore() == 1
    restarted.close()


@pytest.mark.usefixtures("world_of_one")
def test_temporary_files_of_replicas_killed_on_their_way_are_removed_at_the_start(tmp_path: Path) -> None:
    first = _replicas(tmp_path)
    first.step_end(1)
    first.close()
    folder = first.folder
    killed = [
        folder / "own" / "rank-0" / ".step-2.pt.partial",
        folder / "holds" / "rank-5" / ".step-2.pt.partial",
    ]
    others = [folder / "own" / "rank-0" / "notes.txt", folder / "holds" / "rank-3" / ".step-2.pt.partial"]
    for path in killed + others:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 4096)
    restarted = _replicas(tmp_path)  # in a world of one, no rank writes holds/rank-5 nor holds/rank-3
    restarted.close()
    assert _files(folder) == ["own/rank-0/notes.txt", "own/rank-0/step-1.pt"]
    assert restarted.stats.stale_removed == 3
    from faultcast.client.replicas import _sweep

    # Where another rank of the node writes holds/rank-3, its temporary file may be a live one.
    others[1].write_bytes(b"\0")
    killed[0].write_bytes(b"\0")
    mine, node = [Path("own/rank-0")], [Path("own/rank-0"), Path("holds/rank-3")]
    assert _sweep(folder, mine, node) == 1  # a rank of the node that writes its folder is left alone
    assert others[1].exists()
    assert not killed[0].exists()


@pytest.mark.usefixtures("world_of_one")
def test_a_full_tmpfs_fails_replicas_counted_and_warned_once_and_training_goes_on(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    replicas = _replicas(small_disk / "faultcast")
    replicas.step_end(1)
    replicas.wait()
    filler = fill(small_disk)
    for step in (2, 3, 4):
        replicas.step_end(step)  # before the fix: the second of these raised, ending training
    replicas.wait()
    assert (replicas.stats.made, replicas.stats.failed) == (1, 3)
    assert _warnings(caplog, "was not written") == 1
    assert _files(replicas.folder) == ["own/rank-0/step-1.pt"]  # the newest whole one, no temporary file
    filler.unlink()
    replicas.step_end(5)
    replicas.close()
    assert replicas.stats.made == 2
    assert _files(replicas.folder) == ["own/rank-0/step-1.pt", "own/rank-0/step-5.pt"]


def test_room_for_a_part_on_a_full_tmpfs_is_refused_before_receiving(small_disk: Path) -> None:
    from faultcast.client.replicas import _Incoming

    fill(small_disk)
    with pytest.raises(
        OSError, match="No space left"
    ) as refused:  # before: a sparse file, and a SIGBUS when the bytes came
        _Incoming(small_disk / "holds" / "rank-1", 3, 2**20)
    assert refused.value.errno == errno.ENOSPC
    assert not list((small_disk / "holds" / "rank-1").iterdir())


@pytest.mark.slow
def test_a_buddy_lying_about_its_part_s_size_is_refused_and_training_goes_on(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(LIAR_JOB), "--out", str(tmp_path / "out"), "--root", str(tmp_path / "memory"), "--steps", "5",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-4000:]
    honest, liar = (json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in range(2))
    assert honest["trained"] == liar["trained"] == 5
    assert (honest["refused"], honest["failed"], honest["made"]) == (3, 0, 5)
    assert (liar["failed"], liar["made"]) == (2, 3)  # 8 GiB and -1 not taken; the short part was sent
    assert sum("taken)" in w for w in honest["warnings"]) == 1  # 8 GiB and -1: one warning
    assert sum("fewer bytes" in w for w in honest["warnings"]) == 1
    held = tmp_path / "memory" / "job" / "n0" / "holds" / "rank-1"
    own = tmp_path / "memory" / "job" / "n1" / "own" / "rank-1"
    assert sorted(p.name for p in held.iterdir()) == ["step-4.pt", "step-5.pt"]  # no temporary file
    for name in ("step-4.pt", "step-5.pt"):
        assert (held / name).read_bytes() == (own / name).read_bytes()
