"""Pre-scheduled migration, end to end on the real local Slurm cluster: the spare is readied during the warning and
the job hands over at its snapshot.

The first alert on the job's node (snapshot only) makes the service submit a standby copy of the job
(service/remediation/spares/slurm.py) away from that node; the standby loads the newest periodic checkpoint and
waits on the service. When the alert asks to migrate, the job snapshots and acknowledges, the standby
is told to go on from that snapshot, the node is drained and the old job cancelled: the job finishes
on the spare with parameters bit-identical to an uninterrupted run, one step at most redone. A false
alarm releases the spare (the standby exits, status 75) and the job trains on where it was.
testing/handover_flow.py drives both; bench/migration.py times them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from faultcast.client.snapshots import SnapshotStore
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.slurm import SlurmCommands
from faultcast.service.remediation.spares.prescheduler import SpareState
from faultcast.service.remediation.spares.slurm import SlurmSpares
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.testing.handover_flow import WAIT_S, JobShape, calm, migrate, slurm_actuator, torchrun, warn
from faultcast.testing.slurm_cluster import SlurmCluster, running_cluster
from faultcast.testing.system import require_binary

# Paced so that the standby's start (about 4 s here) fits well within the training left after the
# first alert: 108 steps of 0.2 s.
SHAPE = JobShape(pace_s=0.2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster(("fc-node1", "fc-node2", "fc-node3"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The same job run straight through, with no service and no Slurm."""
    out = tmp_path_factory.mktemp("reference")
    command = torchrun(out, out / "snapshots", SHAPE, "--checkpoint-every", str(SHAPE.checkpoint_every))
    run = subprocess.run(command, timeout=WAIT_S, capture_output=True, text=True, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    final: dict[str, torch.Tensor] = torch.load(out / "final.pt")
    return final


@dataclass
class Running:
    service: Service
    target: str


@pytest.fixture
def faultcast(service_model: Path, tmp_path: Path, cluster: SlurmCluster) -> Iterator[Running]:
    """A service that drains through the cluster's scontrol and readies spares as standby jobs."""
    scontrol = require_binary("scontrol")
    commands = SlurmCommands(Path(scontrol).parent, env={"SLURM_CONF": str(cluster.conf)}, timeout_s=15)
    service = Service.open(
        service_model,
        tmp_path / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
        actuator=slurm_actuator(cluster, scontrol),
        spares=SlurmSpares(commands),
    )
    port = service.start("127.0.0.1:0")
    yield Running(service, f"127.0.0.1:{port}")
    service.stop(0)
    cluster.run("scancel", "--user", "root", check=False)
    for node in cluster.nodes:
        cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def _same(final: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> bool:
    return final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in reference)


def test_the_spare_waits_during_the_warning_and_the_job_hands_over_at_its_snapshot(
    cluster: SlurmCluster, faultcast: Running, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    service = faultcast.service
    warned = warn(cluster, service, faultcast.target, tmp_path, SHAPE)
    job, spare = warned.job, warned.spare
    assert spare is not None
    standby = spare.handle
    assert standby
    assert standby != job.job_id
    state, where = cluster.job(standby)
    assert state == "RUNNING"
    assert where != warned.node
    assert cluster.job(job.job_id) == ("RUNNING", warned.node)  # nothing drained yet
    assert not job.events("done")

    migrate(service, faultcast.target, warned)
    job.wait("the job to finish on the spare", lambda: bool(job.events("done")))
    first, second = job.events("start")
    assert (first["node"], first["restart"]) == (warned.node, 0)
    assert second["node"] == where
    assert second["standby_for"] == job.job_id
    assert 0 < second["warm_from"] < second["step"]  # it had loaded a periodic checkpoint while it waited
    # It fetched the hand-over snapshot from the old job's memory, not from the files.
    assert (second["handover_source"], second["handover_bytes"] > 0) == ("peer", True)
    # The first alert asked for a snapshot only: training went on after its copy to host memory, and
    # it was acknowledged at a later agreement. The migration's was acknowledged at its own step (the
    # job held there, and was ended before it could say so).
    guarding = job.events("snapshot-marked")
    assert guarding
    assert all(second["step"] > m["at_step"] > m["step"] for m in guarding), guarding
    # The standby went on from the snapshot the job took when the alert asked to migrate.
    assert spare.checkpoint_uri == SnapshotStore(job.snapshots).path(second["step"]).resolve().as_uri()
    executed = [e["step"] for e in job.events("step")]
    assert sorted(set(executed)) == list(range(1, SHAPE.steps + 1))
    assert len(executed) == SHAPE.steps  # nothing redone: the standby went on from the last step taken
    assert _same(torch.load(job.out / "final.pt"), reference)

    # The service drained the node and ended the old job rather than requeue it; one remediation.
    done = service.remediator.done
    assert [(what.job_id, what.handover_to, outcome) for what, outcome, _ in done] == [
        (job.job_id, standby, "ok")
    ]
    state, reason = slurm_actuator(cluster, require_binary("scontrol")).node_state(warned.node)
    assert "DRAIN" in state, state
    assert reason.startswith("faultcast alert"), reason
    cluster.wait_for("the old job to be gone", lambda: cluster.job(job.job_id) == ("", ""))
    # The old job's registration went with it; the standby's, under its own id, is the job's now.
    assert service.store.jobs.all() == {standby: [where]}
    assert len(job.events("done")) == 1  # the old job never finished on its own
    assert spare.state == SpareState.HANDED_OVER
    assert spare.step == second["step"]


def test_a_false_alarm_releases_the_spare_and_the_job_trains_on(
    cluster: SlurmCluster, faultcast: Running, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    service = faultcast.service
    warned = warn(cluster, service, faultcast.target, tmp_path, SHAPE)
    job, spare = warned.job, warned.spare
    assert spare is not None
    calm(service, faultcast.target, warned)
    job.wait("the standby to be released", lambda: bool(job.events("standby-released")))
    assert "risk fell" in job.events("standby-released")[0]["reason"]
    cluster.wait_for("the standby job to end", lambda: cluster.job(spare.handle) == ("", ""))
    job.wait("the job to finish where it was", lambda: bool(job.events("done")))
    (start,) = job.events("start")
    assert start["node"] == warned.node
    assert _same(torch.load(job.out / "final.pt"), reference)
    assert spare.state == SpareState.RELEASED
    assert service.remediator.done == []
    state, _ = slurm_actuator(cluster, require_binary("scontrol")).node_state(warned.node)
    assert "DRAIN" not in state
