"""The pre-scheduled migration driven on the real local Slurm cluster, shared by its end-to-end test
(tests/test_handover_e2e.py) and its benchmark (bench/migration.py).

A 2-rank torchrun job (testing/jobs/guarded_job.py) is submitted with sbatch to a `SlurmCluster`
and guarded by a real service whose actuator is Slurm's and whose spares are Slurm standby jobs. The
twin's HBM precursor is pushed for the job's node one model step at a time: the first alert asks for a
snapshot only (the model's time head says the failure is more than 20 minutes out), which is when the
spare is asked for; once the standby waits, the samples go on until the alert asks to migrate; the job
snapshots, the standby takes over from that snapshot, the node is drained and the old job cancelled.
Or, for a false alarm, healthy samples follow until the alert clears and the spare is released.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.remediation.slurm import SlurmActuator
from faultcast.service.remediation.spares.prescheduler import Spare, SpareState
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.testing.slurm_cluster import SlurmCluster
from faultcast.v1 import alerts_pb2 as apb

JOB = Path(__file__).parent / "jobs" / "guarded_job.py"
FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
TWIN_NODE, GPU, FAIL_S = 2, 3, 10 * 3600.0
LEAD_S = 40 * 60.0  # the twin's precursor starts this long before the failure
QUIET_STEPS = int((FAIL_S - LEAD_S) / FLEET.cadence_s)  # samples pushed at once: before the precursor
WAIT_S = 180.0


@dataclass(frozen=True)
class JobShape:
    """The guarded job's options: `hold_at` holds its first run until an alert; `pace_s` spaces its
    steps, so the spare's start fits in the training that is left."""

    steps: int = 120
    agree_every: int = 5
    hold_at: int = 12
    pace_s: float = 0.3
    checkpoint_every: int = 10
    keep: int = 2  # whole snapshots kept (the benchmark keeps them all, to read their markers)
    ballast_mb: int = 0  # frozen state added to the job's (the benchmark's larger runs)


def torchrun(out: Path, snapshots: Path, shape: JobShape, *options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(JOB),
        "--out",
        str(out),
        "--snapshots",
        str(snapshots),
        "--steps",
        str(shape.steps),
        "--agree-every",
        str(shape.agree_every),
        *(["--ballast-mb", str(shape.ballast_mb)] if shape.ballast_mb else []),
        *options,
    ]


@dataclass
class Job:
    cluster: SlurmCluster
    job_id: str
    out: Path
    snapshots: Path

    @property
    def log(self) -> Path:
        return self.cluster.root / f"job-{self.job_id}.out"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.out / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        parsed = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in parsed if kind is None or e["event"] == kind]

    def wait(self, what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                log = self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no job output)"
                raise AssertionError(f"job {self.job_id}: timed out waiting for {what}\n{log}")
            time.sleep(0.1)  # polling the job's event file and the scheduler, which the job updates


def submit(cluster: SlurmCluster, directory: Path, target: str, shape: JobShape) -> Job:
    """The guarded job, requeueable, its first run holding at `shape.hold_at` for an alert."""
    out, snapshots = directory / "out", directory / "snapshots"
    out.mkdir(parents=True)
    options = ["--target", target, "--hold-at", str(shape.hold_at), "--pace-s", str(shape.pace_s)]
    options += ["--checkpoint-every", str(shape.checkpoint_every), "--migration-wait-s", "120"]
    options += ["--keep", str(shape.keep), "--stand-by"]
    command = shlex.join(torchrun(out, snapshots, shape, *options))
    job_id = cluster.sbatch(
        "--requeue",
        "--nodes=1",
        "--ntasks=1",
        "--open-mode=append",
        "--job-name=fc-handover",
        "--wrap",
        f"exec {command}",
    )
    return Job(cluster, job_id, out, snapshots)


@dataclass
class Warned:
    """Where the flow stands once the spare waits: the job, its node, the alert and when it opened."""

    job: Job
    node: str
    alert: apb.Alert
    source: TwinSource
    pushed: int  # twin samples pushed so far (the next sequence number is pushed + 1)
    alert_unix: float  # wall clock when the first alert was stored
    spare: Spare | None  # None without pre-scheduling


def _until(
    service: Service,
    target: str,
    node: str,
    source: TwinSource,
    first: int,
    done: Callable[[], bool],
    limit: int,
) -> int:
    """Push the twin one model step at a time, scoring each, until `done()`; returns samples pushed."""
    with grpc.insecure_channel(target) as channel:
        for pushed in range(limit):
            if done():
                return pushed
            push(channel, node, twin_snapshots(source, node, 1, first_sequence=first + pushed))
            service.score_now()
    raise AssertionError(f"nothing changed in {limit} samples")


def _open_alert(service: Service, node: str) -> apb.Alert | None:
    alerts = [a for a in service.store.alerts.open_now() if a.node == node]
    return alerts[-1] if alerts else None


def warn(
    cluster: SlurmCluster,
    service: Service,
    target: str,
    directory: Path,
    shape: JobShape,
    *,
    spare: bool = True,
) -> Warned:
    """Submit the job, raise the first alert on its node, and (with `spare`) wait for its spare to be
    ready."""
    job = submit(cluster, directory, target, shape)
    job.wait("the job to hold at its step", lambda: bool(job.events("holding")))
    node = job.events("holding")[0]["node"]
    assert service.store.jobs.all() == {job.job_id: [node]}
    source = TwinSource(FLEET, TWIN_NODE, [Scenario("hbm_wear", TWIN_NODE, GPU, FAIL_S, LEAD_S)])
    with grpc.insecure_channel(target) as channel:
        push(channel, node, twin_snapshots(source, node, QUIET_STEPS))
    service.score_now()
    pushed = QUIET_STEPS
    pushed += _until(
        service, target, node, source, pushed + 1, lambda: _open_alert(service, node) is not None, 60
    )
    alert_unix = time.time()
    alert = _open_alert(service, node)
    assert alert is not None
    if alert.action != apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY:
        raise AssertionError(
            f"the first alert already says {apb.RecommendedAction.Name(alert.action)}: the model left no "
            "lead between the first warning and the migration, the spare cannot be ready in time"
        )
    if not spare:
        return Warned(job, node, alert, source, pushed, alert_unix, None)
    prescheduler = service.prescheduler
    assert prescheduler is not None
    job.wait(
        "the standby to wait for the hand-over",
        lambda: (
            (s := prescheduler.spare_of(job.job_id)) is not None
            and s.state == SpareState.READY
            and s.waiting > 0
        ),
    )
    ready = prescheduler.spare_of(job.job_id)
    assert ready is not None
    return Warned(job, node, alert, source, pushed, alert_unix, ready)


def migrate(service: Service, target: str, warned: Warned) -> None:
    """Go on with the precursor until the alert asks to migrate; the job then hands over."""

    def migrating() -> bool:
        alert = _open_alert(service, warned.node)
        return alert is not None and alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE

    warned.pushed += _until(service, target, warned.node, warned.source, warned.pushed + 1, migrating, 30)


CALM_STEPS = 90  # healthy samples pushed at once: the alert clears well within them (14 here)


def calm(service: Service, target: str, warned: Warned) -> None:
    """The failure never comes: the same twin node without its scenario, from the same point in
    time, taken in one burst and scored at once. The model escalates the alert at the first healthy
    step (its time to failure looks nearer) and clears it a dozen steps later: scored as the samples
    came, the job could act on the escalation before the clear was stored (a race this test is not
    about, lost more often on a loaded machine); scored together, the two are stored milliseconds
    apart, and an acknowledgement after the clear moves nothing."""
    healthy = TwinSource(FLEET, TWIN_NODE, [])
    for _ in range(warned.pushed):
        healthy.read()
    samples = twin_snapshots(healthy, warned.node, CALM_STEPS, first_sequence=warned.pushed + 1)
    with service._scoring, grpc.insecure_channel(target) as channel:  # the scoring thread waits
        push(channel, warned.node, samples)
    service.score_now()
    warned.pushed += CALM_STEPS
    assert service.store.alerts.cleared_event(warned.alert.opened_id) is not None, (
        "the false alarm never cleared"
    )


def slurm_actuator(cluster: SlurmCluster, scontrol: str) -> SlurmActuator:
    return SlurmActuator(scontrol, env={"SLURM_CONF": str(cluster.conf)}, timeout_s=15)
