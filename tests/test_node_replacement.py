"""One node replaced, not the whole job: a 3-node elastic job (one torchrun agent per node, CPU,
gloo) with a warm spare waiting in its rendezvous loses a node whole (agent and workers, kill -9,
its host memory gone); the two survivors and the spare form the job again through torchrun's
rendezvous, go on from the newest whole buddy replica (the lost part received from the node that
held it) and end bit-identical to a run never interrupted. Run on this host (each agent a node by
name) and on the suite's real Slurm (one job per node, the lost node's slurmd killed too)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.elastic_flow import Run, Shape, kill_tree, reference, same, wait_until

SHAPE = Shape(steps=24, every=3, hold_at=10)


@pytest.fixture(scope="module")
def want(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    return reference(tmp_path_factory.mktemp("reference"), SHAPE)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    started = Run(tmp_path / "run", SHAPE)
    yield started
    started.stop()


@pytest.mark.parametrize("victim_rank", [0, 1])
def test_a_node_lost_whole_is_replaced_by_the_warm_spare_and_the_job_ends_bit_identical(
    run: Run, want: list[dict[str, torch.Tensor]], victim_rank: int
) -> None:
    for node in ("a", "b", "c"):
        run.start(node)
    logs = run.work / "logs"
    wait_until("the three nodes to hold at step 10", run.holding, logs=logs)
    run.start("spare")
    wait_until("the spare to wait in the rendezvous", lambda: run.spare_waiting("spare"), logs=logs)
    nodes = run.progress()["a"]["nodes"]  # rank -> node
    victim = nodes[victim_rank]
    faulted = time.time()
    kill_tree(run.agents[victim].pid)
    run.agents[victim].wait()
    lost = run.work / "memory" / "elastic-job" / victim
    for path in sorted(lost.rglob("*"), reverse=True):  # its host memory is gone with it
        path.unlink() if path.is_file() else path.rmdir()
    lost.rmdir()
    run.go.touch()

    wait_until("a step on the spare", lambda: run.progress().get("spare", {}).get("step", 0) > 9, logs=logs)
    for node, agent in run.agents.items():
        if node not in (victim, "spare"):
            assert agent.wait(timeout=120) == 0, (logs / f"{node}.log").read_text()[-3000:]
    reports = run.reports()
    # The survivors and the spare, each once more from the replica of step 9: one step lost.
    assert sorted(r["node"] for r in reports) == sorted({"a", "b", "c", "spare"} - {victim})
    assert {r["start"] for r in reports} == {9}
    assert all(r["attempt"] == 1 for r in reports if r["node"] != "spare")
    # The part of the lost node's rank number came from the node holding it; nothing else moved
    # except what the renumbering of ranks asks for (each rank loads the part of its number).
    assert sum(r["fetched_from_peer"] for r in reports) >= 1
    assert sum(r["bytes_fetched"] for r in reports) > 0
    assert same(run.weights(), want)
    first = run.progress()["spare"]
    assert first["time"] > faulted
