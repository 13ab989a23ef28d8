"""State kept in peers' memory (faultcast.client.replicas): buddies on other nodes (and racks), a
3-rank job under torchrun (CPU, gloo; each rank a node of its own) that loses a node and its buddy
(no whole replica: the files decide), and Protection going on from the newer of the replicas and the
files. A node lost and replaced by a spare, going on from its buddy's replica bit-identical, is
tests/test_node_replacement.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from faultcast.client.replicas import buddies

JOB = Path(__file__).parent / "fixtures" / "replica_job.py"
WAIT_S = 240.0


def test_a_buddy_is_on_the_next_node_and_in_another_rack_when_there_is_one() -> None:
    assert buddies(["a", "a", "b", "b", "c", "c"]) == [2, 3, 4, 5, 0, 1]
    assert buddies(["a", "a"]) == [-1, -1]  # one node: nobody to hold a copy
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
    assert buddies(["a", "b", "c", "d"], racks) == [2, 2, 0, 0]  # never the same rack
    assert buddies(["a", "b", "b"]) == [1, 0, 0]  # uneven nodes: the local index wraps


def _run(out: Path, root: Path, *options: str) -> list[dict[str, Any]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
        str(JOB), "--out", str(out), "--root", str(root), *options,
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]


def _weights(out: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in range(3)]


def test_a_node_and_its_buddy_lost_leave_no_whole_replica(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    first = _run(tmp_path / "first", memory, "--steps", "6")
    lost = {"n1", f"n{first[1]['buddy']}"}  # a node and the node holding its copy
    for node in lost:
        shutil.rmtree(memory / "job" / node)
    resumed = _run(tmp_path / "resumed", memory, "--steps", "6", "--restore")
    assert [r["restored_step"] for r in resumed] == [None, None, None]
    assert [r["start"] for r in resumed] == [0, 0, 0]  # the caller then reads its files


def test_protection_goes_on_from_the_newer_of_the_replicas_and_the_files(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    _run(reference, tmp_path / "reference-memory", "--steps", "12")
    for checkpoint_every, resumed_at in ((0, 9), (5, 10)):  # the replica of step 9; the checkpoint of 10
        memory, snapshots = (
            tmp_path / f"memory-{checkpoint_every}",
            tmp_path / f"snapshots-{checkpoint_every}",
        )
        options = ("--protection", str(snapshots), "--checkpoint-every", str(checkpoint_every))
        _run(tmp_path / f"first-{checkpoint_every}", memory, "--steps", "12", "--stop", "10", *options)
        shutil.rmtree(memory / "job" / "n2")
        out = tmp_path / f"resumed-{checkpoint_every}"
        resumed = _run(out, memory, "--steps", "12", *options)
        assert [r["start"] for r in resumed] == [resumed_at] * 3
        for got, want in zip(_weights(out), _weights(reference), strict=True):
            assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_replica_folder_others_may_touch_is_refused(tmp_path: Path) -> None:
    from faultcast.client.replicas import _private

    assert _private(tmp_path / "root" / "job").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="mode 0700"):
        _private(shared)
    (tmp_path / "link").symlink_to(tmp_path / "root" / "job")
    with pytest.raises(ValueError, match="mode 0700"):
        _private(tmp_path / "link")
