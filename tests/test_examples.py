"""The examples run as a user would run them, small: the plain loop dies mid-run and its rerun ends
with exactly the weights of a run that never stopped; the DDP example runs under torchrun and a rerun
continues from its snapshot; the Lightning example resumes at the step of its newest checkpoint."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT_S = 300


def run(command: list[str], *, expect_rc: int = 0) -> dict[str, Any]:
    """Run an example; returns the JSON summary it prints last (empty when it died before that)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == expect_rc, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    summary: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return summary


def same_weights(a: Path, b: Path) -> bool:
    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_the_plain_loop_resumes_after_a_crash_as_if_it_never_stopped(tmp_path: Path) -> None:
    script = [
        sys.executable,
        str(EXAMPLES / "plain_loop.py"),
        "--target",
        "",
        "--steps",
        "40",
        "--checkpoint-every",
        "10",
    ]
    whole = run([*script, "--snapshots", str(tmp_path / "whole"), "--final", str(tmp_path / "whole.pt")])
    assert whole == {"resumed_from": 0, "steps": 40, "snapshots": [], "checkpoints": [10, 20, 30, 40]}

    # Killed after step 25 (mid-epoch: 16 batches make one), with whole checkpoints at 10 and 20.
    snapshots = tmp_path / "crashed"
    assert run([*script, "--snapshots", str(snapshots), "--stop-after", "25"], expect_rc=3) == {}
    # The two whole snapshots, and the job's signing key (client/job_key.py).
    assert sorted(p.name for p in snapshots.iterdir()) == ["JOB_KEY", "step-000000010", "step-000000020"]

    rerun = run([*script, "--snapshots", str(snapshots), "--final", str(tmp_path / "rerun.pt")])
    assert rerun == {"resumed_from": 20, "steps": 40, "snapshots": [], "checkpoints": [30, 40]}
    # Model, optimizer, scheduler, data position and the dropout RNG all came back.
    assert same_weights(tmp_path / "whole.pt", tmp_path / "rerun.pt")


def test_the_ddp_example_runs_under_torchrun_and_continues_from_its_snapshot(tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    script = [*torchrun, str(EXAMPLES / "ddp_torchrun.py"), "--target", "", "--snapshots", str(snapshots)]
    first = run([*script, "--steps", "20", "--checkpoint-every", "10"])
    assert first == {"resumed_from": 0, "steps": 20, "snapshots": [], "checkpoints": [10, 20]}
    # One shard per rank in each whole snapshot.
    assert sorted(p.name for p in (snapshots / "step-000000020").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert (snapshots / "step-000000020" / "COMPLETE.json").is_file()

    second = run(
        [*script, "--steps", "30", "--checkpoint-every", "10", "--final", str(tmp_path / "final.pt")]
    )
    assert second == {"resumed_from": 20, "steps": 30, "snapshots": [], "checkpoints": [30]}
    assert (tmp_path / "final.pt").is_file()


def test_the_lightning_example_resumes_at_the_step_of_its_newest_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from faultcast.client.lightning import latest_checkpoint

    # In this process: a second interpreter would spend most of the test importing Lightning again.
    spec = importlib.util.spec_from_file_location(
        "lightning_callback_example", EXAMPLES / "lightning_callback.py"
    )
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    snapshots = str(tmp_path / "snapshots")
    first = example.main(
        ["--snapshots", snapshots, "--steps", "20", "--checkpoint-every", "10", "--target", ""]
    )
    assert first == {"resumed_from": 0, "steps": 20, "snapshots": [], "checkpoints": [10, 20]}
    assert latest_checkpoint(snapshots) == str(Path(snapshots, "step-000000020", "lightning.ckpt"))

    second = example.main(
        ["--snapshots", snapshots, "--steps", "30", "--checkpoint-every", "10", "--target", ""]
    )
    assert second == {"resumed_from": 20, "steps": 30, "snapshots": [], "checkpoints": [30]}
    assert latest_checkpoint(snapshots) == str(Path(snapshots, "step-000000030", "lightning.ckpt"))
