"""One node replaced on the suite's real Slurm: fault to first step on the spare, steps lost, bytes moved.

    .venv/bin/python bench/node_replacement.py --model DIR                 # 3 trials x 2 sizes x 2 paths
    .venv/bin/python bench/node_replacement.py --trials 1 --state-mib 1    # smoke run

A private Slurm cluster on this host (testing/slurm_cluster.py: munged, slurmctld, one slurmd per node:
fc-a, fc-b, fc-c and the spare fc-spare) runs the elastic job of testing/jobs/elastic_job.py as one
job per node (a torchrun agent, one rank, CPU, gloo; buddy replicas every 3 steps in /dev/shm), the
spare's agent a fourth job waiting in the rendezvous; the rendezvous store is hosted here. Each
trial's job holds after step 10 (the replica of step 9 whole), then:

- lost: node fc-b's processes (slurmstepd, agent, worker, and with --model its collector, a
  `faultcast collect --source simulated` streaming to a real service) and its slurmd are SIGKILLed
  and its replica folder removed; the clock starts at the kill. Fault to FAILED: when a guard
  subscribed for fc-b hears the FAILED event (the collector's stream broke and did not come back).
- predicted: a real service (the model of --model) is fed the twin's HBM precursor for fc-b until its
  alert asks to snapshot and migrate and fc-b's guard has it; the clock starts when the job goes on
  (agreements every step): it replicates step 11 at once, fc-b acknowledges and leaves.

The clock stops at the spare's first step (its progress file). Each run ends bit-identical to a run
never interrupted or the trial fails. --state-mib adds state per rank (the 256 MiB variant).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ holds the Slurm cluster and the elastic flow the tests use

import torch  # noqa: E402

from bench.failure_detection import FAULTCAST, Heard  # noqa: E402
from faultcast.client.guard import Guard  # noqa: E402
from faultcast.service.config import ServiceConfig  # noqa: E402
from faultcast.service.rpc.validation import Limits  # noqa: E402
from faultcast.service.server import Service  # noqa: E402
from faultcast.testing.elastic_flow import Run, Shape, kill_tree, parent_of, reference, same, wait_until  # noqa: E402
from faultcast.testing.slurm_cluster import SlurmCluster  # noqa: E402
from faultcast.testing.twin_feed import QUIET, Feed  # noqa: E402
from faultcast.v1 import alerts_pb2 as apb  # noqa: E402

NODES = ("fc-a", "fc-b", "fc-c")
SPARE = "fc-spare"
VICTIM = "fc-b"


@dataclass
class Trial:
    path: str
    state_mib: float
    fault_to_failed_s: float | None  # lost path: the victim's collector's stream broke -> FAILED at a guard
    fault_to_first_step_s: float
    fault_to_restored_s: float  # the spare's worker has the part loaded (before its first step)
    spare_worker_started_s: float  # the spare's worker process began (after the rendezvous)
    step_at_fault: int
    resumed_from: int
    steps_lost: int
    parts_fetched: int
    bytes_fetched: int
    bit_identical: bool  # to a reference run from the replica's step (the yardstick)
    uninterrupted_identical: bool  # and to a run never interrupted


def _trial(
    cluster: SlurmCluster,
    work: Path,
    shape: Shape,
    path: str,
    model: Path | None,
    want: References,
) -> Trial:
    service = None
    target = None
    heard, guard = Heard(), None
    if model is not None:
        service = Service.open(
            model, work / "state", ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0)
        )
        target = f"127.0.0.1:{service.start('127.0.0.1:0')}"
    run = Run(work / "run", shape, target=target if path == "predicted" else None)
    killed = False
    try:
        beside = {}
        if path == "lost" and target is not None:  # the victim's collector, in its job: it dies with the node
            beside[VICTIM] = shlex.join([
                FAULTCAST, "collect", "--source", "simulated", "--node", VICTIM, "--gpus", "1",
                "--service", target, "--insecure", "--no-prometheus", "--spool", str(work / f"{VICTIM}.sqlite"),
            ])  # fmt: skip
        run.submit_with_spare(cluster, NODES, SPARE, beside)
        logs = run.work / "logs"
        if path == "lost":
            if service is not None and target is not None:  # the FAILED event a trainer would hear
                wait_until(
                    "the victim's collector to stream",
                    lambda: service.failure_watch.streams_open(VICTIM) == 1,
                )
                guard = Guard(target, "bench-listener", [VICTIM], register=False, on_failure=heard).start()
                assert guard.wait_caught_up(60.0)
            agent = run.agent_of(VICTIM)
            assert agent is not None
            step = parent_of(agent)
            faulted, faulted_monotonic = time.time(), time.monotonic()
            kill_tree(step if b"slurmstepd" in Path(f"/proc/{step}/cmdline").read_bytes() else agent)
            cluster.kill_node(VICTIM)
            killed = True
            run.lose_memory(VICTIM)
            at_fault = shape.hold_at
        else:
            assert service is not None
            assert target is not None
            feed = Feed(service, target, VICTIM)
            feed.until(QUIET)
            moving = apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
            feed.until_alert(lambda active: any(a.node == VICTIM and a.action == moving for a in active))
            name = apb.RecommendedAction.Name(moving)
            wait_until(
                "the guard to hear it", lambda: run.progress()[VICTIM].get("pending") == name, logs=logs
            )
            faulted, faulted_monotonic = time.time(), time.monotonic()
            at_fault = shape.hold_at + 1  # the step the job replicates at once
        run.go.touch()
        wait_until(
            "a step on the spare", lambda: run.progress().get(SPARE, {}).get("step", 0) > at_fault, logs=logs
        )
        wait_until(
            "every report", lambda: all((run.work / "out" / f"rank-{r}.json").is_file() for r in range(3))
        )
        spare = next(r for r in run.reports() if r["node"] == SPARE)
        first = float(spare["first_step"])
        failed_s = None
        if guard is not None:
            heard_at, _ = heard.wait(lambda a: a.node == VICTIM)
            failed_s = round(heard_at - faulted_monotonic, 3)
        reports = run.reports()
        start = min(r["start"] for r in reports)
        return Trial(
            path,
            shape.state_mib,
            failed_s,
            round(first - faulted, 2),
            round(spare["resumed"] - faulted, 2),
            round(spare["started"] - faulted, 2),
            at_fault,
            start,
            at_fault - start,
            sum(r["fetched_from_peer"] for r in reports),
            sum(r["bytes_fetched"] for r in reports),
            same(run.weights(), want.from_replica[start]),
            same(run.weights(), want.uninterrupted),
        )
    finally:
        run.stop()
        if killed:
            cluster.restart_node(VICTIM)
        cluster.run("scancel", *run.jobs.values(), check=False)
        if guard is not None:
            guard.close()
        if service is not None:
            service.stop(0)


@dataclass
class References:
    """What a trial's outcome must equal: a run from the replica's step (by step), and one never
    interrupted (the same as the first when recomputing from a replica in a fresh process changes
    nothing; at 256 MiB on this CPU it changes the last bit, in a fresh run from the replica too)."""

    uninterrupted: list[dict[str, torch.Tensor]]
    from_replica: dict[int, list[dict[str, torch.Tensor]]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="the service's model (the predicted path); default: skip it")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--state-mib", type=float, nargs="+", default=[1.0, 256.0])
    p.add_argument("--paths", nargs="+", choices=("lost", "predicted"), default=["lost", "predicted"])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    paths = [path for path in args.paths if path == "lost" or args.model is not None]
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="fc-replace-") as tmp, SlurmCluster((*NODES, SPARE)) as cluster:
        for mib in args.state_mib:
            shape = Shape(steps=24, every=3, hold_at=10, state_mib=mib, agree_every=1)
            uninterrupted = reference(Path(tmp) / f"reference-{mib}", shape)
            # The lost path goes on from step 9's replica: its yardstick is a run to step 10 and a fresh
            # run from that run's replicas. The predicted path goes on from the replica made at step 11
            # in the running job, where the uninterrupted run is the yardstick.
            from_nine = reference(Path(tmp) / f"reference-{mib}-from-9", shape, stop=shape.hold_at)
            want = References(uninterrupted, {shape.hold_at - 1: from_nine, shape.hold_at + 1: uninterrupted})
            for path in paths:
                for i in range(args.trials):
                    trial = _trial(cluster, Path(tmp) / f"{path}-{mib}-{i}", shape, path, args.model, want)
                    print(json.dumps(asdict(trial)), flush=True)
                    trials.append(trial)
    print()
    failed = [t.fault_to_failed_s for t in trials if t.fault_to_failed_s is not None]
    if failed:
        median, worst = statistics.median(failed), max(failed)
        print(
            f"fault to FAILED at a guard (the lost node's collector gone): median {median:.2f} s, max {worst:.2f} s"
        )
    print(
        "| path | state per rank | fault to first step on the spare (median, max) | part loaded "
        "| steps lost | parts fetched | bytes fetched | bit-identical to a run from the replica's step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mib in args.state_mib:
        for path in paths:
            group = [t for t in trials if t.state_mib == mib and t.path == path]
            first = [t.fault_to_first_step_s for t in group]
            print(
                f"| {path} | {mib:g} MiB | {statistics.median(first):.2f} s, {max(first):.2f} s "
                f"| {statistics.median(t.fault_to_restored_s for t in group):.2f} s "
                f"| {sorted({t.steps_lost for t in group})} | {sorted({t.parts_fetched for t in group})} "
                f"| {statistics.median(t.bytes_fetched for t in group):,.0f} "
                f"| {sum(t.bit_identical for t in group)}/{len(group)} "
                f"({sum(t.uninterrupted_identical for t in group)}/{len(group)} to a run never interrupted) |"
            )
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    if not all(t.bit_identical for t in trials):
        sys.exit(1)


if __name__ == "__main__":
    main()
