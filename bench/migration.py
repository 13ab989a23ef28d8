"""What a predictive migration costs the suite's job, measured on the real local Slurm cluster, with
and without pre-scheduling.

Both paths run the same 2-rank torchrun job (testing/jobs/guarded_job.py, CPU, gloo) under a real
service and real Slurm daemons (testing/slurm_cluster.py), warned by the twin's HBM precursor
(testing/handover_flow.py): the first alert asks for a snapshot only, the next asks to migrate.

- requeue (today): the job snapshots, the node is drained, Slurm requeues the job, it starts again
  elsewhere and loads the snapshot;
- prescheduled: the first alert has a standby submitted away from the node; it loads the newest
  periodic checkpoint and waits; at the migration's snapshot it is told to go on, the node is drained
  and the old job cancelled.

Figures per path: training blocked (from the last step on the doomed node to the first step after the
move, less one ordinary step), alert to the first step after the move, the snapshot's blocking time,
the standby's wait and load, bytes moved. Writes them as the costs file `faultcast goodput --costs`
reads (schema faultcast.migration_costs/1).

    .venv/bin/python bench/migration.py --runs 2 --json out/migration/costs.json

Needs root and the Debian Slurm packages, as the suite's Slurm tests do; trains the demo model unless
FAULTCAST_TEST_SERVICE_MODEL names one.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ holds the Slurm cluster and the flow the end-to-end test uses

from faultcast.client.snapshots import MARKER, SnapshotStore  # noqa: E402
from faultcast.service.config import ServiceConfig  # noqa: E402
from faultcast.service.remediation.slurm import SlurmCommands  # noqa: E402
from faultcast.service.remediation.spares.slurm import SlurmSpares  # noqa: E402
from faultcast.service.rpc.validation import Limits  # noqa: E402
from faultcast.service.server import Service  # noqa: E402
from faultcast.testing.handover_flow import JobShape, migrate, slurm_actuator, warn  # noqa: E402
from faultcast.testing.slurm_cluster import SlurmCluster  # noqa: E402

SHAPE = JobShape(keep=50)  # --state-mb adds frozen state to it


@dataclass
class Run:
    path: str
    blocked_s: float
    alert_to_first_step_s: float
    snapshot_blocking_s: float
    snapshot_write_s: (
        float  # the alert snapshot's write, after its blocking copy (the migration waits for it)
    )
    react_s: float
    bytes_moved: int
    state_bytes: int
    checkpoint_blocking_s: float
    restart_s: float = float("nan")  # requeue: the job's end on the doomed node to its first step after
    spare_ready_s: float = float("nan")  # prescheduled: alert to the standby waiting
    load_s: float = float("nan")  # prescheduled: the standby's load of the hand-over snapshot
    load_source: str = ""  # prescheduled: "peer" (the old job's memory) or "files"


def _service(model: Path, state: Path, cluster: SlurmCluster, scontrol: str, prescheduled: bool) -> Service:
    spares = None
    if prescheduled:
        spares = SlurmSpares(SlurmCommands(Path(scontrol).parent, env={"SLURM_CONF": str(cluster.conf)}))
    return Service.open(
        model,
        state,
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
        actuator=slurm_actuator(cluster, scontrol),
        spares=spares,
    )


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def one_run(cluster: SlurmCluster, model: Path, scontrol: str, prescheduled: bool, shape: JobShape) -> Run:
    with tempfile.TemporaryDirectory(prefix="fc-migration-") as tmp:
        directory = Path(tmp)
        service = _service(model, directory / "state", cluster, scontrol, prescheduled)
        port = service.start("127.0.0.1:0")
        target = f"127.0.0.1:{port}"
        try:
            warned = warn(cluster, service, target, directory, shape, spare=prescheduled)
            migrate(service, target, warned)
            migrated_unix = time.time()
            job = warned.job
            job.wait("the job to finish", lambda: bool(job.events("done")), timeout_s=600)
            return _measure(warned, migrated_unix, prescheduled, shape)
        finally:
            service.stop(0)
            cluster.run("scancel", "--user", "root", check=False)
            for node in cluster.nodes:
                cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def _measure(warned: Any, migrated_unix: float, prescheduled: bool, shape: JobShape) -> Run:
    job = warned.job
    starts = job.events("start")
    moved = starts[-1]
    old_steps = [e for e in job.events("step") if e["unix"] < moved["unix"]]
    new_steps = [e for e in job.events("step") if e["unix"] > moved["unix"]]
    last_old = next(e for e in reversed(old_steps) if e["step"] == moved["step"])
    snapshots = _alert_snapshot_steps(job.snapshots)
    gaps = {
        a["step"]: b["unix"] - a["unix"]
        for a, b in itertools.pairwise(old_steps)
        if b["step"] == a["step"] + 1
    }
    # An ordinary step: the paced sleep (after step_end) and the step's compute; a step the replacement
    # takes first follows its load, no sleep before it, so the move blocked its gap less the compute.
    ordinary = statistics.median(
        g for s, g in gaps.items() if s % shape.checkpoint_every and s not in snapshots
    )
    compute = max(0.0, ordinary - shape.pace_s)
    at_checkpoint = [
        g - ordinary for s, g in gaps.items() if s % shape.checkpoint_every == 0 and s not in snapshots
    ]
    snapshot = SnapshotStore(job.snapshots).path(moved["step"])
    marker = json.loads((snapshot / MARKER).read_text())
    first_new = new_steps[0]["unix"]
    # The snapshot blocks training for its copy to host memory; the write follows (in the background
    # for a snapshot-only alert; before the acknowledgement of a migration's).
    staged = marker.get("staged_unix", marker["saved_unix"])
    blocking = staged - marker["started_unix"]
    state_bytes = _size(snapshot)
    run = Run(
        path="prescheduled" if prescheduled else "requeue",
        blocked_s=first_new - last_old["unix"] - compute,
        alert_to_first_step_s=first_new - warned.alert_unix,
        snapshot_blocking_s=blocking,
        snapshot_write_s=marker["saved_unix"] - staged,
        react_s=max(0.0, marker["started_unix"] - migrated_unix),
        bytes_moved=state_bytes,
        state_bytes=state_bytes,
        checkpoint_blocking_s=max(0.0, statistics.median(at_checkpoint)) if at_checkpoint else float("nan"),
    )
    if prescheduled:
        spare = warned.spare
        run.spare_ready_s = spare.ready_at - spare.asked_at
        run.load_s = moved["handover_load_s"]
        run.load_source = moved["handover_source"]
    else:
        run.restart_s = first_new - marker["saved_unix"]
    return run


def _alert_snapshot_steps(root: Path) -> set[int]:
    """Steps of the snapshots taken for alerts (their gaps are not ordinary steps)."""
    return {s.step for s in SnapshotStore(root).complete() if s.reason.startswith("alert")}


def _median(runs: list[Run], field: str) -> float:
    return float(statistics.median(float(getattr(r, field)) for r in runs))


def costs_file(runs: list[Run], command: str, shape: JobShape = SHAPE) -> dict[str, Any]:
    """The measured costs in the schema `faultcast goodput --costs` reads (medians over the runs)."""
    paths: dict[str, dict[str, float]] = {}
    for name, extra in (("requeue", ("restart_s",)), ("prescheduled", ("spare_ready_s", "load_s"))):
        chosen = [r for r in runs if r.path == name]
        if not chosen:
            continue
        keys = (
            "snapshot_blocking_s",
            "snapshot_write_s",
            "blocked_s",
            "alert_to_first_step_s",
            "bytes_moved",
            *extra,
        )
        paths[name] = {k: _median(chosen, k) for k in keys}
    state_bytes = int(statistics.median(r.state_bytes for r in runs))
    blocking = _median(runs, "snapshot_blocking_s")
    writing = _median(runs, "snapshot_write_s")
    loads = [r.load_s for r in runs if r.path == "prescheduled"]
    return {
        "schema": "faultcast.migration_costs/1",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "job": {
            "ranks": 2,
            "state_bytes": state_bytes,
            "parameters": 16 * 32 + 32 + 32 + 1 + shape.ballast_mb * (1 << 20) // 4,
        },
        "paths": paths,
        "react_s": _median(runs, "react_s"),
        "checkpoint_blocking_s": _median(runs, "checkpoint_blocking_s"),
        "bandwidth_bytes_per_s": {
            "snapshot_copy": state_bytes / blocking if blocking > 0 else 0.0,
            "snapshot_write": state_bytes / writing if writing > 0 else 0.0,
            "load": state_bytes / statistics.median(loads) if loads and statistics.median(loads) > 0 else 0.0,
        },
        "runs": [vars(r) for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2, help="runs of each path")
    parser.add_argument("--json", type=Path, default=Path("out/migration/costs.json"))
    parser.add_argument("--paths", default="requeue,prescheduled")
    parser.add_argument("--state-mb", type=int, default=0, help="frozen state added to the job's")
    args = parser.parse_args()
    shape = dataclasses.replace(SHAPE, ballast_mb=args.state_mb)
    from faultcast.testing.system import require_binary

    scontrol = require_binary("scontrol")
    model = _model()
    runs: list[Run] = []
    with SlurmCluster(("fc-node1", "fc-node2", "fc-node3")) as cluster:
        for i in range(args.runs):
            for name in args.paths.split(","):
                run = one_run(cluster, model, scontrol, prescheduled=name == "prescheduled", shape=shape)
                runs.append(run)
                print(
                    f"run {i + 1} {name}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in vars(run).items() if isinstance(v, float))
                    + (f", load from {run.load_source}" if run.load_source else "")
                )
    costs = costs_file(runs, "python bench/migration.py " + " ".join(sys.argv[1:]), shape)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(costs, indent=2) + "\n")
    print(f"\nmedians over {args.runs} runs each ({args.json}):")
    for name, figures in costs["paths"].items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


def _model() -> Path:
    import os

    named = os.environ.get("FAULTCAST_TEST_SERVICE_MODEL")
    if named:
        return Path(named)
    from faultcast.demo.model import train_demo_model

    path = Path("out/migration/demo-model")
    if not (path / "manifest.json").exists():
        train_demo_model(path)
    return path


if __name__ == "__main__":
    main()
