"""One node replaced, not the whole job: a 3-node elastic job (one torchrun agent per node, CPU,
gloo) with a warm spare waiting in its rendezvous loses a node whole (agent and workers, kill -9,
its host memory gone); the two survivors and the spare form the job again through torchrun's
rendezvous, go on from the newest whole buddy replica (the lost part received from the node that
held it) and end bit-identical to a run never interrupted. Run on this host (each agent a node by
name) and on the suite's real Slurm (one job per node, the lost node's slurmd killed too)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from faultcast.service.config import ServiceConfig
from faultcast.service.server import Service
from faultcast.service.validation import Limits
from faultcast.v1 import alerts_pb2 as apb
from tests.elastic_flow import Run, Shape, kill_tree, parent_of, reference, same, wait_until
from tests.slurm_cluster import SlurmCluster, running_cluster
from tests.twin_feed import QUIET, Feed

SHAPE = Shape(steps=24, every=3, hold_at=10)


@pytest.fixture(scope="module")
def want(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    return reference(tmp_path_factory.mktemp("reference"), SHAPE)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    started = Run(tmp_path / "run", SHAPE)
    yield started
    started.stop()


def test_a_node_lost_whole_is_replaced_by_the_warm_spare_and_the_job_ends_bit_identical(
    run: Run, want: list[dict[str, torch.Tensor]]
) -> None:
    """The node lost is rank 0's: its agent hosted the first round's worker store (the case the
    shared agent store never recovers from; tests on Slurm lose rank 1's node)."""
    for node in ("a", "b", "c"):
        run.start(node)
    logs = run.work / "logs"
    wait_until("the three nodes to hold at step 10", run.holding, logs=logs)
    run.start("spare")
    wait_until("the spare to wait in the rendezvous", lambda: run.spare_waiting("spare"), logs=logs)
    nodes = run.progress()["a"]["nodes"]  # rank -> node
    victim = nodes[0]
    faulted = time.time()
    kill_tree(run.agents[victim].pid)
    run.agents[victim].wait()
    run.lose_memory(victim)
    run.go.touch()
    _check_replaced(run, want, ("a", "b", "c"), "spare", victim, faulted)
    for node, agent in run.agents.items():
        if node != victim:
            assert agent.wait(timeout=120) == 0, (logs / f"{node}.log").read_text()[-3000:]


def _check_replaced(
    run: Run,
    want: list[dict[str, torch.Tensor]],
    nodes: tuple[str, ...],
    spare: str,
    victim: str,
    faulted: float,
) -> None:
    logs = run.work / "logs"
    wait_until("a step on the spare", lambda: run.progress().get(spare, {}).get("step", 0) > 9, logs=logs)
    assert run.progress()[spare]["time"] > faulted
    wait_until(
        "every rank's report", lambda: all((run.work / "out" / f"rank-{r}.json").is_file() for r in range(3))
    )
    reports = run.reports()
    # The survivors and the spare, each once more from the replica of step 9: one step lost.
    assert sorted(r["node"] for r in reports) == sorted({*nodes, spare} - {victim})
    assert {r["start"] for r in reports} == {9}
    assert all(r["attempt"] == 1 for r in reports if r["node"] != spare), reports
    # The part of the lost node's rank number came from the node holding it (and the parts the
    # renumbering of ranks moved: each rank loads the part of its number).
    assert sum(r["fetched_from_peer"] for r in reports) >= 1
    assert sum(r["bytes_fetched"] for r in reports) > 0
    assert same(run.weights(), want)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster(("fc-a", "fc-b", "fc-c", "fc-spare"))


def test_on_slurm_a_node_killed_with_its_slurmd_is_replaced_by_the_warm_spare_bit_identical(
    cluster: SlurmCluster, tmp_path: Path, want: list[dict[str, torch.Tensor]]
) -> None:
    """One Slurm job per node (a step across one allocation would die with the batch script's node,
    or need --no-kill); the spare is one more job, on the spare node, under the same rendezvous id."""
    run = Run(tmp_path / "run", SHAPE)
    nodes = ("fc-a", "fc-b", "fc-c")
    victim = ""
    try:
        for node in nodes:
            run.submit(cluster, node)
        logs = run.work / "logs"
        wait_until("the three nodes to hold at step 10", run.holding, logs=logs)
        run.submit(cluster, "fc-spare")
        wait_until("the spare to wait in the rendezvous", lambda: run.spare_waiting("fc-spare"), logs=logs)
        victim = run.progress()[nodes[0]]["nodes"][1]
        agent = run.agent_of(victim)
        assert agent is not None, f"no torchrun agent of job {run.jobs[victim]} on {victim}"
        step = parent_of(agent)  # slurmstepd: the job's processes on the node, all of them
        faulted = time.time()
        kill_tree(step if b"slurmstepd" in Path(f"/proc/{step}/cmdline").read_bytes() else agent)
        cluster.kill_node(victim)
        run.lose_memory(victim)
        run.go.touch()
        _check_replaced(run, want, nodes, "fc-spare", victim, faulted)
        # The survivors' and the spare's jobs end (the lost node's daemon is dead: not cluster.wait_for).
        ending = [run.jobs[n] for n in (*nodes, "fc-spare") if n != victim]
        wait_until("the other jobs to end", lambda: all(cluster.job(j)[0] == "" for j in ending))
    finally:
        if victim:
            cluster.restart_node(victim)
        cluster.run("scancel", *run.jobs.values(), check=False)


def test_a_predicted_failure_hands_the_warned_nodes_part_over_live_and_loses_no_step(
    service_model: Path, tmp_path: Path, want: list[dict[str, torch.Tensor]]
) -> None:
    """The same path for a failure foreseen: node b's snapshot-and-migrate alert (a real service fed
    the twin's HBM precursor) makes the job replicate at once, b acknowledges that replica and
    leaves, and the survivors and the spare go on from it."""
    service = Service.open(
        service_model,
        tmp_path / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
    )
    target = f"127.0.0.1:{service.start('127.0.0.1:0')}"
    run = Run(tmp_path / "run", replace(SHAPE, agree_every=1), target=target)
    try:
        for node in ("a", "b", "c"):
            run.start(node)
        logs = run.work / "logs"
        wait_until("the three nodes to hold at step 10", run.holding, logs=logs)
        run.start("spare")
        wait_until("the spare to wait in the rendezvous", lambda: run.spare_waiting("spare"), logs=logs)
        feed = Feed(service, target, "b")
        feed.until(QUIET)
        moving = apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        feed.until_alert(lambda active: any(a.node == "b" and a.action == moving for a in active))
        (alert,) = service.book.active()
        wait_until(
            "b's guard to hear the move",
            lambda: run.progress()["b"].get("pending") == apb.RecommendedAction.Name(moving),
            logs=logs,
        )
        run.go.touch()
        wait_until(
            "a step on the spare", lambda: run.progress().get("spare", {}).get("step", 0) > 11, logs=logs
        )
        for node in ("a", "c", "spare"):
            assert run.agents[node].wait(timeout=120) == 0, (logs / f"{node}.log").read_text()[-3000:]
        assert run.agents["b"].wait(timeout=30) == -signal.SIGKILL  # its worker ended its agent: b left
        reports = run.reports()
        assert sorted(r["node"] for r in reports) == ["a", "c", "spare"]
        assert {r["start"] for r in reports} == {11}  # the replica made for the alert: no step lost
        assert sum(r["bytes_fetched"] for r in reports) > 0
        assert same(run.weights(), want)
        # The service drains b and requeues nothing: the job replaced the node itself.
        wait_until("the remediation", lambda: service.store.remediations.of(alert.opened_id) is not None)
        request = json.loads(service.store.remediations.request_of(alert.opened_id))
        assert (request["node"], request["requeue"], request["job_id"]) == ("b", False, "elastic-job")
        acks = service.store.acks.of(alert.opened_id) + service.store.acks.of(alert.id)
        assert [(a.action, a.step, a.checkpoint_uri) for a in acks] == [
            (apb.ACK_ACTION_SNAPSHOT_DONE, 11, "replica:11")
        ]
    finally:
        run.stop()
        service.stop(0)
