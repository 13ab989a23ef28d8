"""Snapshots and exact resume, for real: torch.distributed.checkpoint writes every snapshot, and the
2-rank jobs run under torchrun on CPU with gloo.

- SnapshotStore: only a directory with a whole marker is a snapshot; damaged markers are skipped and
  logged; pruning keeps the newest whole ones; a new save clears what a killed one left at its step.
- One process (no torch.distributed): Protection and TrainState resume a model, AdamW, StepLR, the
  sampler's position and Python's, NumPy's and torch's generators so that the result is bit-identical;
  the sampler alone resumes mid-epoch and refuses a position outside the epoch.
- Two ranks (testing/jobs/guarded_job.py): a job killed mid-run resumes from its newest whole
  checkpoint, or from the one before when the newest is half-written, and ends bit-identical to a run
  that was never interrupted.
- Agreement (tests/fixtures/agreement_job.py): one rank's vote reaches every rank at that step only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.utils.data import DataLoader, TensorDataset

from faultcast.client.protection import Protection
from faultcast.client.sampler import ResumableDistributedSampler
from faultcast.client.snapshots import MARKER, SnapshotStore
from faultcast.client.train_state import TrainState
from tests.torch_parts import global_rng_kept

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
GUARDED_JOB = ROOT / "testing" / "jobs" / "guarded_job.py"  # absolute: FIXTURES / it is itself
LAUNCH_TIMEOUT_S = 120.0
# guarded_job.py's default length, and the checkpoint cadence and crash step these tests give it.
JOB_STEPS, CHECKPOINT_EVERY, CRASH_AT = 120, 10, 57
# The periodic checkpoint of step 50 is written in the background and marked whole at the first
# step_end after the write finished. The job's bare steps take a few milliseconds, less than that write
# on a loaded 2-core machine (unpaced, a crash at 57 found it unmarked in 2 of 3 tries), so the crashed
# run stands in for real compute with a short pause per step; pacing changes no number in the job.
CRASH_PACE_S = 0.02
# Snapshots written and read in one process: torch.distributed.checkpoint says so, as it should.
pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

# -- SnapshotStore --------------------------------------------------------------------------------


def _state(value: float) -> dict[str, Any]:
    return {"model": {"w": torch.full((4, 3), value), "b": torch.arange(3.0) + value}}


def _write(store: SnapshotStore, step: int) -> Path:
    """A whole snapshot of `step` (its tensors hold `step`), written as rank 0 of a 1-rank job."""
    assert store.save(_state(float(step)), step, 0, None, wait=True) is None
    snapshot = store.finish(step, 0, "periodic", 1)
    assert snapshot is not None
    return snapshot.path


def _read(path: Path) -> float:
    """The value a snapshot written by `_write` holds, loaded back through torch.distributed.checkpoint."""
    target = _state(-1.0)
    dcp_load(target, checkpoint_id=path)
    value = float(target["model"]["w"][0, 0])
    assert torch.equal(target["model"]["w"], torch.full((4, 3), value))
    assert torch.equal(target["model"]["b"], torch.arange(3.0) + value)
    return value


def _steps(store: SnapshotStore) -> list[int]:
    return [snapshot.step for snapshot in store.complete()]


def _copy_without_marker(store: SnapshotStore, source: int, step: int) -> Path:
    """A real snapshot's files under another step, without the marker: a save killed before rank 0
    marked it whole."""
    path = store.path(step)
    shutil.copytree(store.path(source), path)
    (path / MARKER).unlink()
    return path


def test_a_directory_without_its_marker_is_never_the_latest_snapshot(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, keep=10)
    assert store.latest() is None
    _write(store, 10)
    _write(store, 20)
    # Newer than the whole ones, each killed at another point of its save.
    _copy_without_marker(store, 20, 30)  # every file written, the marker not yet
    partial = store.path(40)
    partial.mkdir()
    data = sorted(store.path(20).glob("*.distcp"))[0].read_bytes()
    (partial / "__0_0.distcp").write_bytes(data[: len(data) // 2])  # killed mid-write, no .metadata
    store.path(50).mkdir()  # prepared, nothing written yet
    assert {p.name for p in tmp_path.iterdir()} >= {f"step-{s:09d}" for s in (10, 20, 30, 40, 50)}

    assert _steps(store) == [10, 20]
    latest = store.latest()
    assert latest is not None
    assert (latest.step, latest.reason, latest.world_size) == (20, "periodic", 1)
    assert latest.path == store.path(20)
    assert _read(latest.path) == 20.0


@pytest.mark.parametrize(
    ("marker", "logged"),
    [
        pytest.param(
            {"step": 20, "reason": "periodic", "world_size": 1}, "does not match its marker", id="other-step"
        ),
        pytest.param("{not json", "unreadable marker", id="not-json"),
        pytest.param({"step": 30}, "unreadable marker", id="fields-missing"),
        pytest.param(
            {"step": "thirty", "reason": "periodic", "world_size": 1}, "unreadable marker", id="bad-step"
        ),
    ],
)
def test_a_damaged_marker_is_skipped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, marker: dict[str, Any] | str, logged: str
) -> None:
    store = SnapshotStore(tmp_path, keep=10)
    _write(store, 10)
    _write(store, 20)
    damaged = _copy_without_marker(store, 20, 30)
    (damaged / MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))

    with caplog.at_level(logging.WARNING, logger="faultcast.client.snapshots"):
        latest = store.latest()
    assert latest is not None
    assert latest.step == 20
    assert _steps(store) == [10, 20]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(damaged) in message and logged in message for message in warnings), warnings


def test_a_step_directory_leading_out_of_the_store_is_never_a_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path / "job")
    _write(store, 10)
    elsewhere = _write(SnapshotStore(tmp_path / "elsewhere"), 20)
    store.path(20).symlink_to(elsewhere, target_is_directory=True)  # newer, whole, and not the job's
    assert _steps(store) == [10]
    assert "leads out of the store" in caplog.text
    (tmp_path / "link").symlink_to(tmp_path / "job")  # a linked store root is still the store
    assert _steps(SnapshotStore(tmp_path / "link")) == [10]


def test_latest_is_the_highest_whole_step_whatever_the_order_of_writing(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, keep=10)
    for step in (30, 100, 9, 45):  # out of order: latest() goes by step, not by when it was written
        _write(store, step)
    assert _steps(store) == [9, 30, 45, 100]
    latest = store.latest()
    assert latest is not None
    assert latest.step == 100
    assert _read(latest.path) == 100.0


def test_prune_keeps_the_newest_whole_snapshots_and_drops_older_partial_ones(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, keep=2)
    _write(store, 10)
    _write(store, 20)
    _copy_without_marker(store, 10, 5)  # partial, older than every whole one
    _copy_without_marker(store, 10, 15)  # partial, between whole ones
    _copy_without_marker(store, 20, 35)  # partial and newer than the next whole one: may be under way
    (tmp_path / "notes").mkdir()  # not a snapshot: left alone
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "step-000000005",
        "step-000000010",
        "step-000000015",
        "step-000000020",
        "step-000000035",
        "notes",
    }

    _write(store, 30)

    assert {p.name for p in tmp_path.iterdir()} == {
        "step-000000020",
        "step-000000030",
        "step-000000035",
        "notes",
    }
    assert _steps(store) == [20, 30]
    assert [_read(store.path(s)) for s in (20, 30)] == [20.0, 30.0]


def test_a_save_clears_what_a_killed_save_of_the_same_step_left(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, keep=10)
    _write(store, 10)
    stale = _copy_without_marker(store, 10, 20)  # the step-10 data, left under step 20
    (stale / "__9_0.distcp").write_bytes(b"from a killed attempt")
    (stale / (MARKER + ".tmp")).write_text("{")

    assert store.prepare(20, 0, None) == stale
    assert stale.is_dir()
    assert list(stale.iterdir()) == []

    (stale / "__9_0.distcp").write_bytes(b"from another killed attempt")
    _write(store, 20)
    assert sorted(p.name for p in stale.iterdir() if not p.name.endswith(".distcp")) == [".metadata", MARKER]
    assert not (stale / "__9_0.distcp").exists()
    assert _steps(store) == [10, 20]
    assert _read(stale) == 20.0


def test_only_rank_0_marks_a_snapshot_whole(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    store.save(_state(7.0), 7, 0, None, wait=True)
    assert store.finish(7, 1, "periodic", 2) is None
    assert not (store.path(7) / MARKER).exists()
    assert store.latest() is None
    snapshot = store.finish(7, 0, "periodic", 2)
    assert snapshot is not None
    assert store.latest() == snapshot
    assert json.loads((store.path(7) / MARKER).read_text())["world_size"] == 2


# -- one process: Protection and TrainState ---------------------------------------------------------

SAMPLES, BATCH, TOTAL_STEPS, EVERY, KILLED_AFTER = 48, 8, 30, 10, 25  # 6 batches an epoch, 5 epochs


@pytest.fixture
def _global_rng() -> Iterator[None]:
    with global_rng_kept():
        yield


@dataclass
class _Job:
    """A small training job whose every step draws from Python's, NumPy's and torch's generators
    (noise, dropout, a random loss weight) and reads a shuffled sampler mid-epoch."""

    model: torch.nn.Sequential
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.StepLR
    sampler: ResumableDistributedSampler
    loader: DataLoader[tuple[torch.Tensor, ...]]

    @classmethod
    def build(cls, seed: int) -> _Job:
        """Seeds every generator with `seed`, so two jobs built alike run alike until they resume."""
        torch.manual_seed(seed)
        random.seed(100 + seed)
        np.random.seed(200 + seed)
        data = torch.Generator().manual_seed(1)
        x = torch.randn(SAMPLES, 6, generator=data)
        y = (x[:, :3].sum(dim=1, keepdim=True) > 0).float()
        dataset = TensorDataset(x, y)
        sampler = ResumableDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
        # Its own generator: the loader would otherwise draw from torch's at each epoch's iterator.
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
        return cls(model, optimizer, scheduler, sampler, loader)

    def state(self) -> TrainState:
        return TrainState(
            model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, data=self.sampler
        )

    def train(self, start: int, stop: int, protection: Protection | None = None) -> int:
        step, epoch = start, self.sampler.epoch
        while step < stop:
            self.sampler.set_epoch(epoch)
            for inputs, targets in self.loader:
                noisy = inputs + 0.05 * torch.randn_like(inputs)
                scale = float(np.random.uniform(0.5, 1.5)) * (1.0 + random.random())
                loss = (
                    torch.nn.functional.binary_cross_entropy_with_logits(self.model(noisy), targets) * scale
                )
                self.optimizer.zero_grad()
                torch.autograd.backward(loss)
                self.optimizer.step()
                self.scheduler.step()
                step += 1
                if protection is not None:
                    protection.step_end(step)
                if step == stop:
                    break
            else:
                epoch += 1
        return step

    def parameters(self) -> dict[str, torch.Tensor]:
        return {name: value.detach().clone() for name, value in self.model.state_dict().items()}


@pytest.mark.usefixtures("_global_rng")
def test_one_process_resumes_bit_identical_after_a_crash(tmp_path: Path) -> None:
    reference = _Job.build(0)
    initial = reference.parameters()
    assert reference.train(0, TOTAL_STEPS) == TOTAL_STEPS
    expected = reference.parameters()
    assert any(not torch.equal(initial[k], expected[k]) for k in initial), "training changed nothing"

    crashed = _Job.build(0)
    protection = Protection(tmp_path, crashed.state(), checkpoint_every=EVERY, agree_every=5)
    assert protection.resume() == 0
    assert crashed.train(0, KILLED_AFTER, protection) == KILLED_AFTER
    assert protection.stats.checkpoints == [10, 20]
    assert _steps(protection.store) == [10, 20]
    del crashed, protection  # the crash: nothing closed, nothing flushed

    # Fresh objects, initialised and seeded otherwise: only the snapshot can make them right.
    resumed = _Job.build(1)
    protection = Protection(tmp_path, resumed.state(), checkpoint_every=EVERY, agree_every=5)
    start = protection.resume()
    assert start == 20
    assert protection.stats.resumed_from == 20
    assert resumed.sampler.state_dict() == {"epoch": 3, "offset": 2 * BATCH}  # step 20: epoch 3, batch 2
    assert resumed.train(start, TOTAL_STEPS, protection) == TOTAL_STEPS
    protection.close()

    final = resumed.parameters()
    assert final.keys() == expected.keys()
    for name in expected:
        assert torch.equal(final[name], expected[name]), name
    assert resumed.scheduler.get_last_lr() == reference.scheduler.get_last_lr()
    assert protection.stats.checkpoints == [30]
    assert _steps(protection.store) == [20, 30]


# -- the sampler alone ------------------------------------------------------------------------------


def _sampler(size: int = 10) -> ResumableDistributedSampler:
    return ResumableDistributedSampler(range(size), num_replicas=1, rank=0, shuffle=True, seed=7)


def _order(epoch: int, size: int = 10) -> list[int]:
    sampler = _sampler(size)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_the_sampler_resumes_mid_epoch_at_the_next_index() -> None:
    order = _order(2)
    assert sorted(order) == list(range(10))
    assert order != _order(3)

    sampler = _sampler()
    sampler.set_epoch(2)
    loader: DataLoader[tuple[torch.Tensor, ...]] = DataLoader(
        TensorDataset(100 + torch.arange(10)), batch_size=2, sampler=sampler
    )
    batches = iter(loader)
    first = [int(v) for _ in range(2) for v in next(batches)[0]]
    assert first == [100 + i for i in order[:4]]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "offset": 4}  # what the loop consumed, no more

    fresh = _sampler()
    fresh.load_state_dict(state)
    assert fresh.epoch == 2
    fresh.set_epoch(2)  # the loop sets the epoch it resumes in: the pending offset stays
    assert list(fresh) == order[4:]
    assert fresh.state_dict() == {"epoch": 2, "offset": 10}
    fresh.set_epoch(3)
    assert list(fresh) == _order(3)  # the next epoch whole

    moved_on = _sampler()
    moved_on.load_state_dict(state)
    moved_on.set_epoch(5)  # another epoch forgets the pending offset
    assert list(moved_on) == _order(5)


def test_the_sampler_resumes_at_the_end_of_an_epoch_with_nothing_left() -> None:
    sampler = _sampler()
    sampler.load_state_dict({"epoch": 1, "offset": 10})
    assert list(sampler) == []
    sampler.set_epoch(2)
    assert list(sampler) == _order(2)


@pytest.mark.parametrize("offset", [-1, 11, 100])
def test_the_sampler_refuses_an_offset_outside_the_epoch(offset: int) -> None:
    sampler = _sampler()
    with pytest.raises(ValueError, match=rf"sampler offset {offset} outside this epoch's 10 samples"):
        sampler.load_state_dict({"epoch": 1, "offset": offset})
    assert sampler.state_dict() == {"epoch": 0, "offset": 0}  # a refused state leaves it untouched


def test_the_sampler_state_after_moving_to_a_new_epoch_starts_that_epoch() -> None:
    sampler = _sampler()
    sampler.set_epoch(0)
    assert len(list(sampler)) == 10
    sampler.set_epoch(1)
    state = sampler.state_dict()  # e.g. a checkpoint taken at the start of each epoch

    resumed = _sampler()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert list(resumed) == _order(1)  # today: [], the whole of epoch 1 skipped


# -- two ranks under torchrun -----------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


class _Launch:
    """One torchrun launch (2 ranks) of a fixture script, running in the background."""

    def __init__(self, script: str, log: Path, *args: str | Path) -> None:
        self.script, self.log = script, log
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        with log.open("w") as handle:
            self.process = subprocess.Popen(
                [*command, str(FIXTURES / script), *map(str, args)],
                cwd=ROOT,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )

    def wait(self) -> int:
        """The exit status; a launch still running after LAUNCH_TIMEOUT_S is killed and fails the test."""
        try:
            return self.process.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.script} still running after {LAUNCH_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def kill(self) -> None:
        """Ends torchrun and the workers it started, by their ids."""
        if self.process.poll() is not None:
            return
        for pid in [*_descendants(self.process.pid), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


@dataclass
class _GuardedRun:
    out: Path
    snapshots: Path
    launch: _Launch

    def finished(self, status: int = 0) -> _GuardedRun:
        code = self.launch.wait()
        assert code == status, f"{self.launch.script} exited {code}, not {status}:\n{self.launch.tail()}"
        return self

    def events(self) -> list[dict[str, Any]]:
        lines = (self.out / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def final(self) -> dict[str, torch.Tensor]:
        loaded: dict[str, torch.Tensor] = torch.load(self.out / "final.pt", weights_only=True)
        return loaded


def _start_guarded(base: Path, snapshots: Path | None = None, *extra: str) -> _GuardedRun:
    """guarded_job.py with periodic checkpoints; `snapshots` defaults to a fresh folder."""
    out = base / "out"
    out.mkdir(parents=True)
    if snapshots is None:
        snapshots = base / "snapshots"
        snapshots.mkdir()
    args: list[str | Path] = [
        "--out",
        out,
        "--snapshots",
        snapshots,
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        *extra,
    ]
    return _GuardedRun(out, snapshots, _Launch(str(GUARDED_JOB), base / "torchrun.log", *args))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_GuardedRun]:
    """The job run start to end, with the same periodic checkpoints. Started, not awaited: it runs
    while the crashed run and its reruns are prepared; `finished()` awaits it."""
    run = _start_guarded(tmp_path_factory.mktemp("uninterrupted"))
    yield run
    run.launch.kill()


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> _GuardedRun:
    """The job killed (os._exit, nothing cleaned up) right after step 57."""
    base = tmp_path_factory.mktemp("crashed")
    run = _start_guarded(base, None, "--crash-at", str(CRASH_AT), "--pace-s", str(CRASH_PACE_S))
    code = run.launch.wait()
    assert code != 0, f"the crashed run exited 0:\n{run.launch.tail()}"
    events = run.events()
    assert events[0]["event"] == "start"
    assert events[0]["step"] == 0
    assert (events[-1]["event"], events[-1]["step"]) == ("crash", CRASH_AT)
    assert not (run.out / "final.pt").exists()
    found = _steps(SnapshotStore(run.snapshots))
    assert found == [40, 50], (
        f"whole snapshots after the crash: {found}; the step-50 write outlasted 7 steps?"
    )
    return run


@pytest.fixture(scope="module")
def reruns(
    tmp_path_factory: pytest.TempPathFactory, crashed: _GuardedRun
) -> Iterator[dict[str, _GuardedRun]]:
    """The crashed job rerun on copies of its snapshot folder, both at once: as the crash left it, and
    with the newest snapshot's marker gone (killed before rank 0 marked it whole)."""
    runs: dict[str, _GuardedRun] = {}
    for name in ("as-left", "half-written"):
        base = tmp_path_factory.mktemp(name)
        snapshots = base / "snapshots"
        shutil.copytree(crashed.snapshots, snapshots)
        if name == "half-written":
            (SnapshotStore(snapshots).path(50) / MARKER).unlink()
        runs[name] = _start_guarded(base, snapshots)
    for run in runs.values():
        run.launch.wait()
    yield runs
    for run in runs.values():
        run.launch.kill()


def _assert_resumed(run: _GuardedRun, start: int) -> None:
    events = run.events()
    assert events[0]["event"] == "start"
    assert events[0]["step"] == start
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(start + 1, JOB_STEPS + 1))
    assert events[-1]["event"] == "done"
    assert (events[-1]["step"], events[-1]["resumed_from"]) == (JOB_STEPS, start)
    assert _steps(SnapshotStore(run.snapshots)) == [JOB_STEPS - CHECKPOINT_EVERY, JOB_STEPS]


def _assert_bit_identical(run: _GuardedRun, reference: _GuardedRun) -> None:
    got, expected = run.final(), reference.final()
    assert got.keys() == expected.keys()
    assert len(expected) == 4  # two Linear layers' weights and biases
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_a_crashed_job_resumes_from_its_newest_checkpoint_bit_identical(
    uninterrupted: _GuardedRun, reruns: dict[str, _GuardedRun]
) -> None:
    run = reruns["as-left"].finished()
    _assert_resumed(run, 50)
    _assert_bit_identical(run, uninterrupted.finished())


def test_a_half_written_newest_snapshot_is_passed_over_for_the_one_before(
    uninterrupted: _GuardedRun, reruns: dict[str, _GuardedRun]
) -> None:
    run = reruns["half-written"].finished()
    _assert_resumed(run, 40)
    _assert_bit_identical(run, uninterrupted.finished())


def test_the_uninterrupted_job_never_resumes(uninterrupted: _GuardedRun) -> None:
    events = uninterrupted.finished().events()
    assert (events[0]["event"], events[0]["step"]) == ("start", 0)
    assert (events[-1]["event"], events[-1]["step"], events[-1]["resumed_from"]) == ("done", JOB_STEPS, None)
    assert _steps(SnapshotStore(uninterrupted.snapshots)) == [110, 120]


def test_one_ranks_vote_reaches_every_rank_at_that_step_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    launch = _Launch(
        "agreement_job.py",
        tmp_path / "torchrun.log",
        "--out",
        out,
        "--steps",
        "8",
        "--snapshot-at",
        "3",
        "--migrate-at",
        "6",
    )
    code = launch.wait()
    assert code == 0, f"agreement_job.py exited {code}:\n{launch.tail()}"

    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"], report["calls"]) == (rank, 2, 8)
        assert [v["step"] for v in report["votes"]] == list(range(1, 9))
        assert [v["step"] for v in report["votes"] if v["snapshot"]] == [3]  # rank 1's vote
        assert [v["step"] for v in report["votes"] if v["migrate"]] == [6]  # rank 0's vote
    assert reports[0]["votes"] == reports[1]["votes"]
