"""The Slurm actuator against a real slurmctld, three real slurmds and a real munged on this host."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultcast.service.remediation.actuators import Remediation
from faultcast.service.remediation.slurm import SlurmActuator, SlurmCommands, SlurmError, parse_node_line
from faultcast.service.remediation.spares.prescheduler import SpareRequest
from faultcast.service.remediation.spares.slurm import SlurmSpares
from faultcast.testing.slurm_cluster import SlurmCluster, running_cluster
from faultcast.testing.system import require_binary


def _remediation(
    node: str, *, alert_id: int = 7, job_id: str = "", requeue: bool = False, handover_to: str = ""
) -> Remediation:
    return Remediation(
        alert_id=alert_id,
        node=node,
        gpu=3,
        mode="hbm_wear",
        risk=0.91,
        job_id=job_id,
        requeue=requeue,
        handover_to=handover_to,
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster(("fc-node1", "fc-node2", "fc-node3"))


@pytest.fixture
def actuator(cluster: SlurmCluster) -> Iterator[SlurmActuator]:
    """An actuator on the test cluster; the nodes it drained are resumed afterwards."""
    yield SlurmActuator(require_binary("scontrol"), env={"SLURM_CONF": str(cluster.conf)}, timeout_s=15)
    for node in cluster.nodes:
        cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def test_drain_sets_the_state_and_names_the_alert(cluster: SlurmCluster, actuator: SlurmActuator) -> None:
    remediation = _remediation("fc-node3", alert_id=4711)

    outcome = actuator.remediate(remediation)

    assert outcome.ok, outcome.detail
    state, reason = actuator.node_state("fc-node3")
    assert "DRAIN" in state, (state, cluster.log_tails())
    assert reason == remediation.reason
    assert reason.startswith("faultcast alert 4711:")
    assert "fc-node3" in cluster.run("sinfo", "-h", "-R", "-o", "%N %E").stdout


def test_requeued_job_restarts_on_another_node(cluster: SlurmCluster, actuator: SlurmActuator) -> None:
    # Nodes carry increasing Weight, so on an idle cluster the job lands on fc-node1; nothing pins it there.
    job_id = cluster.sbatch("--requeue", "--nodes=1", "--job-name=fc-requeue", "--wrap", "sleep 300")
    cluster.wait_for(f"job {job_id} running", lambda: cluster.job(job_id)[0] == "RUNNING")
    first_node = cluster.job(job_id)[1]
    assert first_node == "fc-node1"

    outcome = actuator.remediate(_remediation(first_node, job_id=job_id, requeue=True))

    assert outcome.ok, outcome.detail
    assert f"requeued job {job_id}" in outcome.detail
    # A requeued job waits out cred_expire (5 s here) before it may start again.
    cluster.wait_for(
        f"job {job_id} running again off {first_node}",
        lambda: cluster.job(job_id)[0] == "RUNNING" and cluster.job(job_id)[1] not in ("", first_node),
        timeout_s=30,
    )
    assert cluster.job(job_id)[1] in cluster.nodes
    assert "DRAIN" in actuator.node_state(first_node)[0]
    job = cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert re.search(r"\bRestarts=1\b", job), job


def test_unknown_node_is_an_outcome_not_an_exception(actuator: SlurmActuator) -> None:
    outcome = actuator.remediate(_remediation("fc-node99", requeue=True, job_id="12345"))

    assert not outcome.ok
    assert "drain of node fc-node99 failed" in outcome.detail
    assert "Invalid node name" in outcome.detail  # scontrol's own message
    with pytest.raises(SlurmError, match="fc-node99"):
        actuator.node_state("fc-node99")


def test_non_slurm_job_id_drains_but_reports_the_requeue(
    cluster: SlurmCluster, actuator: SlurmActuator
) -> None:
    outcome = actuator.remediate(_remediation("fc-node2", job_id="k8s/train-42", requeue=True))

    assert not outcome.ok
    assert "drained node fc-node2" in outcome.detail
    assert "not a Slurm job id" in outcome.detail
    assert "DRAIN" in actuator.node_state("fc-node2")[0]


def test_missing_scontrol_is_an_outcome(tmp_path: Path) -> None:
    actuator = SlurmActuator(str(tmp_path / "no-such-scontrol"))

    outcome = actuator.remediate(_remediation("fc-node1", job_id="1", requeue=True))

    assert not outcome.ok
    assert "cannot run" in outcome.detail
    assert "no-such-scontrol" in outcome.detail


def test_scontrol_timeout_is_an_outcome(tmp_path: Path) -> None:
    # Without a readable slurm.conf scontrol retries for a minute: the actuator's timeout cuts it short.
    scontrol = require_binary("scontrol")
    actuator = SlurmActuator(scontrol, env={"SLURM_CONF": str(tmp_path / "missing.conf")}, timeout_s=1)

    outcome = actuator.remediate(_remediation("fc-node1"))

    assert not outcome.ok
    assert "timed out after 1 s" in outcome.detail


@pytest.mark.parametrize("node", ["fc-node[1-3]", "fc-node1,fc-node2", "-h", "", "fc-node1 State=RESUME"])
def test_only_one_plain_node_name_is_drained(tmp_path: Path, node: str) -> None:
    # The name is refused before scontrol runs: the binary here does not even exist.
    outcome = SlurmActuator(str(tmp_path / "no-such-scontrol")).remediate(_remediation(node))

    assert not outcome.ok
    assert "not a single Slurm node name" in outcome.detail


def test_parse_node_line_without_a_reason_or_stamp() -> None:
    assert parse_node_line("NodeName=n1 CPUTot=1 State=IDLE ThreadsPerCore=1 Weight=1") == ("IDLE", "")
    line = "NodeName=n1 State=DOWN+DRAIN Weight=1 Reason=Not responding Comment=x"
    assert parse_node_line(line) == ("DOWN+DRAIN", "Not responding")


# -- spares (service/remediation/spares/slurm.py) and the hand-over's end of the old job ---------------------


def _running(cluster: SlurmCluster, *options: str) -> tuple[str, str]:
    """Submit a job and wait until it runs: (its id, its node)."""
    job_id = cluster.sbatch(*options)
    cluster.wait_for(f"job {job_id} running", lambda: cluster.job(job_id)[0] == "RUNNING")
    return job_id, cluster.job(job_id)[1]


def _spares(cluster: SlurmCluster, **settings: str) -> SlurmSpares:
    # A variable of the service's own environment: the standby must not see it.
    env = {"SLURM_CONF": str(cluster.conf), "FAULTCAST_SERVICE_ONLY": "leaked"}
    commands = SlurmCommands(Path(require_binary("scontrol")).parent, env=env)
    return SlurmSpares(commands, **settings)


def _request(job_id: str, node: str) -> SpareRequest:
    return SpareRequest(alert_id=9, job_id=job_id, node=node, gpu=3, mode="hbm_wear", risk=0.4, claim=CLAIM)


CLAIM = "claim-of-the-spare-9"


def test_a_standby_runs_the_jobs_own_script_away_from_the_doomed_node_and_release_cancels_it(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The script records what each run of it sees; the standby must see which job it stands by for.
    marks = cluster.root / "standby-marks"
    marks.mkdir(exist_ok=True)
    script = (
        f'echo "$FAULTCAST_STANDBY_FOR ${{FAULTCAST_SERVICE_ONLY:-absent}} ${{FAULTCAST_STANDBY_CLAIM:-none}}" '
        f"> {marks}/$SLURM_JOB_ID; "
        "exec sleep 300"
    )
    job_id = cluster.sbatch("--requeue", "--nodes=1", "--job-name=fc-warned", "--wrap", script)
    try:
        cluster.wait_for(f"job {job_id} running", lambda: cluster.job(job_id)[0] == "RUNNING")
        doomed = cluster.job(job_id)[1]

        prepared = _spares(cluster).prepare(_request(job_id, doomed))

        assert prepared.ok, prepared.detail
        standby = prepared.handle
        assert standby != job_id
        cluster.wait_for(f"standby {standby} running", lambda: cluster.job(standby)[0] == "RUNNING")
        assert cluster.job(standby)[1] not in ("", doomed)
        cluster.wait_for(
            "the standby's mark", lambda: (marks / standby).exists() and (marks / standby).stat().st_size > 0
        )
        # It knows which job it stands by for, and has its owner's environment, not the service's.
        # and the spare's claim, which the job itself never had and Slurm does not show.
        assert (marks / standby).read_text().split() == [job_id, "absent", CLAIM]
        assert (marks / job_id).read_text().split() == ["absent", "none"]  # the job itself is no standby
        assert prepared.standby_job == standby  # the only job id it may wait for the hand-over as
        shown = cluster.run("scontrol", "show", "job", "-o", standby).stdout
        assert CLAIM not in shown
        assert "JobName=fc-warned-standby" in shown
        assert f"ExcNodeList={doomed}" in shown
        assert "Requeue=1" in shown  # the job's own flag (a standby started again stands down)
        assert "UserId=root(0)" in shown  # the job's owner (root here, as the suite runs)

        released = _spares(cluster).release(_request(job_id, doomed), standby, "a false alarm")

        assert released.ok, released.detail
        cluster.wait_for(f"standby {standby} gone", lambda: cluster.job(standby) == ("", ""))
        assert cluster.job(job_id)[0] == "RUNNING"  # the job itself goes on
    finally:
        cluster.run("scancel", job_id, check=False)


def test_a_spare_for_a_job_slurm_does_not_know_is_refused_with_the_reason(cluster: SlurmCluster) -> None:
    prepared = _spares(cluster).prepare(_request("999999", "fc-node1"))
    assert not prepared.ok
    assert "cannot read job 999999" in prepared.detail
    refused = _spares(cluster, partition="no-such-partition")
    job_id = cluster.sbatch("--nodes=1", "--wrap", "exec sleep 300")
    try:
        cluster.wait_for(f"job {job_id} running", lambda: cluster.job(job_id)[0] == "RUNNING")
        prepared = refused.prepare(_request(job_id, cluster.job(job_id)[1]))
        assert not prepared.ok
        assert "refused" in prepared.detail
    finally:
        cluster.run("scancel", job_id, check=False)
    with pytest.raises(ValueError, match="not a Slurm name"):
        _spares(cluster, partition="spare --uid=0")


def test_a_handed_over_job_is_cancelled_not_requeued(cluster: SlurmCluster, actuator: SlurmActuator) -> None:
    job_id, node = _running(cluster, "--requeue", "--nodes=1", "--job-name=fc-handed", "--wrap", "sleep 300")
    standby, _ = _running(
        cluster, "--nodes=1", f"--exclude={node}", "--job-name=fc-standby", "--wrap", "sleep 300"
    )
    try:
        outcome = actuator.remediate(_remediation(node, alert_id=12, job_id=job_id, handover_to=standby))

        assert outcome.ok, outcome.detail
        assert f"cancelled job {job_id}, handed over to standby job {standby}" in outcome.detail
        assert "DRAIN" in actuator.node_state(node)[0]
        cluster.wait_for(f"job {job_id} gone", lambda: cluster.job(job_id) == ("", ""))
        assert cluster.job(standby)[0] == "RUNNING"
    finally:
        cluster.run("scancel", standby, check=False)


def test_a_job_whose_standby_is_gone_is_requeued_rather_than_lost(
    cluster: SlurmCluster, actuator: SlurmActuator
) -> None:
    job_id, node = _running(cluster, "--requeue", "--nodes=1", "--job-name=fc-orphan", "--wrap", "sleep 300")
    try:
        outcome = actuator.remediate(_remediation(node, alert_id=13, job_id=job_id, handover_to="999998"))

        assert outcome.ok, outcome.detail
        assert "standby job 999998 is not running" in outcome.detail
        assert f"requeued job {job_id}" in outcome.detail
        cluster.wait_for(
            f"job {job_id} requeued",
            lambda: cluster.job(job_id)[0] in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING"),
        )
    finally:
        cluster.run("scancel", job_id, check=False)


def test_a_failure_requeues_every_job_and_one_that_cannot_be_is_said_not_retried(
    cluster: SlurmCluster, actuator: SlurmActuator
) -> None:
    job_id = cluster.sbatch("--requeue", "--nodes=1", "--job-name=fc-many", "--wrap", "sleep 300")
    cluster.wait_for(f"job {job_id} running", lambda: cluster.job(job_id)[0] == "RUNNING")
    node = cluster.job(job_id)[1]
    failed = Remediation(
        alert_id=8,
        node=node,
        gpu=3,
        mode="detachment",
        risk=0.0,
        job_id=job_id,
        requeue=True,
        evidence="xid 79",
        also_requeue=("999999",),  # registered on the node, long gone from Slurm
    )

    outcome = actuator.remediate(failed)

    assert outcome.ok, outcome.detail  # the alert's own job requeued: not retried for the other's sake
    assert f"requeued job {job_id}" in outcome.detail
    assert "requeue of job 999999 failed" in outcome.detail
    state, reason = actuator.node_state(node)
    assert "DRAIN" in state
    assert reason.startswith("faultcast failure 8: xid 79 detachment gpu 3")
    cluster.run("scancel", job_id, check=False)
