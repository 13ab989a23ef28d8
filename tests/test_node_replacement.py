"""One node replaced, not the whole job: a 3-node elastic job (one torchrun agent per node, CPU,
gloo) with a warm spare waiting in its rendezvous loses a node whole (agent and workers, kill -9,
its host memory gone); the two survivors and the spare form the job again through torchrun's
rendezvous, go on from the newest whole buddy replica (the lost part received from the node that
held it) and end bit-identical to a run never interrupted; and a predicted failure takes the same
path with its part handed over live. On the suite's real Slurm: one job per node (a step across one
allocation would die with the batch script's node, or need --no-kill), the spare one more job, the
lost node's slurmd killed too."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.slurm import SlurmActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.testing.elastic_flow import Run, Shape, kill_tree, parent_of, reference, same, wait_until
from faultcast.testing.slurm_cluster import SlurmCluster, running_cluster
from faultcast.testing.system import require_binary
from faultcast.testing.twin_feed import QUIET, Feed
from faultcast.v1 import alerts_pb2 as apb

SHAPE = Shape(steps=24, every=3, hold_at=10)


@pytest.fixture(scope="module")
def want(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, torch.Tensor]]:
    return reference(tmp_path_factory.mktemp("reference"), SHAPE)


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
    # Each survivor's workers were restarted (once, or again when a first round formed without it).
    assert all(r["attempt"] >= 1 for r in reports if r["node"] != spare), reports
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
        run.submit_with_spare(cluster, nodes, "fc-spare")
        # The node of rank 0: its agent hosted the first round's worker store (what the shared agent
        # store never recovered from).
        victim = run.progress()[nodes[0]]["nodes"][0]
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
        if victim:  # back in service for the next test (ReturnToService=2 once its slurmd registers)
            cluster.wait_for(f"{victim} to be idle again", cluster.all_idle, 60)


def test_on_slurm_a_predicted_failure_hands_the_warned_nodes_part_over_live_and_loses_no_step(
    cluster: SlurmCluster, service_model: Path, tmp_path: Path, want: list[dict[str, torch.Tensor]]
) -> None:
    """The same path for a failure foreseen: fc-b's snapshot-and-migrate alert (a real service fed
    the twin's HBM precursor, remediating through the cluster's real scontrol) makes the job
    replicate at once; fc-b acknowledges that replica and leaves, the service drains fc-b and
    requeues nothing (the job replaces its nodes), and the survivors and the spare go on from it."""
    actuator = SlurmActuator(require_binary("scontrol"), env={"SLURM_CONF": str(cluster.conf)}, timeout_s=15)
    service = Service.open(
        service_model,
        tmp_path / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
        actuator=actuator,
    )
    target = f"127.0.0.1:{service.start('127.0.0.1:0')}"
    run = Run(tmp_path / "run", replace(SHAPE, agree_every=1), target=target)
    nodes, warned = ("fc-a", "fc-b", "fc-c"), "fc-b"
    try:
        run.submit_with_spare(cluster, nodes, "fc-spare")
        logs = run.work / "logs"
        feed = Feed(service, target, warned)
        feed.until(QUIET)
        moving = apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        feed.until_alert(lambda active: any(a.node == warned and a.action == moving for a in active))
        (alert,) = service.book.active()
        wait_until(
            "the warned node's guard to hear the move",
            lambda: run.progress()[warned].get("pending") == apb.RecommendedAction.Name(moving),
            logs=logs,
        )
        run.go.touch()
        wait_until(
            "a step on the spare", lambda: run.progress().get("fc-spare", {}).get("step", 0) > 11, logs=logs
        )
        wait_until(
            "every rank's report",
            lambda: all((run.work / "out" / f"rank-{r}.json").is_file() for r in range(3)),
        )
        reports = run.reports()
        assert sorted(r["node"] for r in reports) == ["fc-a", "fc-c", "fc-spare"]
        assert {r["start"] for r in reports} == {11}  # the replica made for the alert: no step lost
        assert sum(r["bytes_fetched"] for r in reports) > 0
        assert same(run.weights(), want)
        wait_until("every job to end", lambda: all(cluster.job(j)[0] == "" for j in run.jobs.values()))
        # The service drained fc-b through scontrol and requeued nothing: the job replaced the node.
        wait_until(
            "the remediation", lambda: (service.store.remediations.of(alert.opened_id) or ("",))[0] == "ok"
        )
        request = json.loads(service.store.remediations.request_of(alert.opened_id))
        assert (request["node"], request["requeue"], request["job_id"]) == (warned, False, "elastic-job")
        state = cluster.run("sinfo", "-h", "-n", warned, "-o", "%T").stdout.strip()
        assert state.startswith("drain"), state
        acks = service.store.acks.of(alert.opened_id) + service.store.acks.of(alert.id)
        assert [(a.action, a.step, a.checkpoint_uri) for a in acks] == [
            (apb.ACK_ACTION_SNAPSHOT_DONE, 11, "replica:11")
        ]
    finally:
        service.stop(0)
        cluster.run("scancel", *run.jobs.values(), check=False)
        cluster.run("scontrol", "update", f"NodeName={warned}", "State=RESUME", check=False)
