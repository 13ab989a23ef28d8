"""Trainer client: the per-step overhead of the Guard and the agreement at 100 ms steps, and the time
from an alert to the snapshot starting, in one run.

    .venv/bin/python bench/client.py            # 10 rounds x 4 blocks of 50 steps, 3 alert trials
    .venv/bin/python bench/client.py --quick    # smoke run: 1 round of 20-step blocks, 1 trial

The service (`faultcast.service.server.Service` with the model of `--model`, a temporary state folder,
the NoopActuator and `Limits(max_future_s=0, max_age_s=0)`, event time being synthetic) runs in this
process on 127.0.0.1. The job is bench/client_job.py under
`python -m torch.distributed.run --standalone --nproc_per_node 2`: two ranks (gloo, CPU), each step a
small DDP forward/backward/AdamW step plus a fixed `time.sleep` chosen once from the warm-up so a
plain step takes about `--step-ms` (never adapted per step: what the hook costs shows in full).
Rank 0 holds the `Protection`'s Guard, subscribed to the service for the job's node, `--node`.

Overhead: `--rounds` rounds of plain, guarded, guarded, plain blocks of `--block-steps` steps (ABBA
interleaving, so a drift of the machine's speed cancels within a round). A guarded step also calls
`Protection.step_end(n)` (agreement every `--agree-every` steps: one all-reduce of two int64s), timed
with `perf_counter` around the call. Reported: the mean step time of each mode and the ratio
(guarded - plain) / plain (mean over rounds, with its standard error), `step_end` per call on each
rank (mean, p50, p99, max), the agreement all-reduce (`Agreement.seconds / calls`), and the per-step
overhead: all of `step_end`'s time over the guarded steps, against the step time. In the loop the
all-reduce also waits for the other rank to reach the step boundary (rank skew, which a plain step
leaves to the next gradient all-reduce instead), so the bench also times 100 of the same all-reduces
back to back after a barrier, the ranks in step. Each rank's CPU time (`time.process_time`, every
thread of the process, the guard's included) per step of each mode is reported too. No alert exists
during this phase (no telemetry has been sent yet).

Alert to snapshot: then the job runs guarded steps while the bench feeds the service twin telemetry
for the job's node: a 1-day twin (4 nodes, seed 77, twin node 2) with an `hbm_wear` failure on a
different GPU at 6 h, 12 h and 18 h, each with a 30 min precursor (the quick model's horizon: an alert
raised by the precursor cannot expire and be raised again before its failure). Per trial the bench
pushes the healthy samples up to the precursor, then those up to 5 min before the failure, waits for
the alert and the job's snapshot, then pushes 15 samples more: the GPU goes dark and its alert
clears. The samples are generated before the job starts. Alert events are timed in this process by
the wall clock where the service's alert book emits them (a listener) and where a Subscribe stream
of this process receives them; the job reports `time.time()` as each snapshot began
(`ProtectionStats.snapshot_started_unix`) and the guard's own `alert_to_snapshot_s` (guard received
the alert -> save begins). Same host, so the clocks agree. The bound: an alert waits at most for the
next agreement step, `--agree-every` steps.

The machine's cores are shared by the job's two ranks, the torchrun agent and this process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from faultcast.actions import asks_snapshot
from faultcast.demo.feed import push, twin_snapshots
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

JOB = Path(__file__).resolve().parent / "client_job.py"
TARGET_OVERHEAD = 0.01  # of the step time
FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
TWIN_NODE = 2
FAILURES = ((1, 6 * 3600.0), (4, 12 * 3600.0), (6, 18 * 3600.0))  # (gpu, failure time in the twin)
LEAD_S = 30 * 60.0  # the precursor's lead
PUSH_UNTIL_S = 5 * 60.0  # before the failure
AFTER_SAMPLES = 15  # past the failure: the GPU is dark
START_TIMEOUT_S = 240.0  # torchrun, three interpreters importing torch, the guard connecting
TRIAL_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 120.0
POLL_S = 0.05


# -- the model and the telemetry ----------------------------------------------------------------


def train_quick_model(path: Path) -> Path:
    """The demo model (faultcast.demo.model's recipe, as the service tests use it)."""
    from faultcast.demo.model import train_demo_model

    print(f"training a quick model into {path} (about a minute)", flush=True)
    return train_demo_model(path)


@dataclass(frozen=True)
class Trial:
    gpu: int
    fail_s: float
    healthy: list[NodeSnapshot]  # up to the precursor's start
    precursor: list[NodeSnapshot]  # up to PUSH_UNTIL_S before the failure
    after: list[NodeSnapshot]  # past the failure


def make_trials(count: int, node: str) -> list[Trial]:
    """The twin's samples for `count` trials, under the job's node name, numbered on."""
    failures = FAILURES[:count]
    source = TwinSource(
        FLEET, TWIN_NODE, [Scenario("hbm_wear", TWIN_NODE, g, f, LEAD_S) for g, f in failures]
    )
    sequence = 1

    def take(until_s: float | None) -> list[NodeSnapshot]:
        nonlocal sequence
        n = AFTER_SAMPLES if until_s is None else int(until_s / FLEET.cadence_s) - source.step
        out = list(twin_snapshots(source, node, n, sequence))
        sequence += len(out)
        return out

    return [
        Trial(gpu, fail_s, take(fail_s - LEAD_S), take(fail_s - PUSH_UNTIL_S), take(None))
        for gpu, fail_s in failures
    ]


# -- alert events, as this process sees them -----------------------------------------------------


@dataclass
class AlertLog:
    """Wall-clock times of the alert events for one node: where the service emits them (its alert
    book's listener) and where a Subscribe stream in this process receives them."""

    node: str
    emitted: dict[int, float] = field(default_factory=dict)  # opened_id -> first OPEN event emitted
    received: dict[int, float] = field(default_factory=dict)  # opened_id -> first OPEN event received
    opened: dict[int, apb.Alert] = field(default_factory=dict)  # opened_id -> its first OPEN event
    requested: set[int] = field(default_factory=set)  # alerts with an OPEN event asking for a snapshot
    cleared: dict[int, str] = field(default_factory=dict)  # opened_id -> reason
    error: str = ""
    changed: threading.Condition = field(default_factory=threading.Condition)

    def on_emitted(self, alerts: Sequence[apb.Alert]) -> None:
        now = time.time()
        with self.changed:
            for alert in alerts:
                if alert.node == self.node and alert.state == apb.ALERT_STATE_OPEN:
                    self.emitted.setdefault(alert.opened_id, now)

    def follow(self, call: Any) -> None:
        try:
            for event in call:
                if not event.HasField("alert"):
                    continue  # the caught-up marker
                alert, now = event.alert, time.time()
                with self.changed:
                    if alert.state == apb.ALERT_STATE_OPEN:
                        self.received.setdefault(alert.opened_id, now)
                        self.opened.setdefault(alert.opened_id, alert)
                        if asks_snapshot(alert.action):
                            self.requested.add(alert.opened_id)
                    elif alert.state == apb.ALERT_STATE_CLEARED:
                        self.cleared[alert.opened_id] = alert.cleared_reason
                    self.changed.notify_all()
        except grpc.RpcError as exc:
            with self.changed:
                self.error = str(exc.code()) if isinstance(exc, grpc.Call) else str(exc)
                self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)


# -- the job ------------------------------------------------------------------------------------


class Job:
    """The torchrun job, its event log and its result."""

    def __init__(self, out: Path, command: list[str]) -> None:
        self.out, self.log = out, out / "job.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.log.open("w") as log:
            # Its own session: on a timeout the agent and both ranks are stopped together.
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def events(self, kind: str) -> list[dict[str, Any]]:
        path = self.out / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        parsed = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in parsed if e["event"] == kind]

    def wait(self, what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Poll the job's event log (it appends as it goes) until `predicate` holds."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the job exited ({self.process.returncode}) waiting for {what}\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.tail()}")
            time.sleep(POLL_S)  # polling the event file between checks

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-12000:] if self.log.exists() else "(no job output)"

    def stop(self, timeout_s: float) -> int:
        (self.out / "stop").touch()
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


# -- figures ------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def distribution(values: Sequence[float]) -> str:
    if not values:
        return "n/a (no calls)"
    a = np.asarray(values)
    p50, p99 = np.percentile(a, [50, 99])
    return (
        f"mean {ms(float(a.mean()))}, p50 {ms(float(p50))}, p99 {ms(float(p99))}, "
        f"max {ms(float(a.max()))} (n={len(a):,})"
    )


@dataclass(frozen=True)
class Overhead:
    plain_s: float  # mean step time
    guarded_s: float
    ratio: float  # (guarded - plain) / plain, all steps
    round_ratio: float  # mean of the rounds' ratios
    round_stderr: float  # its standard error (nan with one round)
    rounds: int


def overhead(blocks: list[dict[str, Any]], per_round: int) -> Overhead:
    def mean(chosen: list[dict[str, Any]], mode: str) -> float:
        return statistics.fmean(s for b in chosen if b["mode"] == mode for s in b["steps_s"])

    plain, guarded = mean(blocks, "plain"), mean(blocks, "guarded")
    ratios = []
    for r in range(0, len(blocks), per_round):
        one = blocks[r : r + per_round]
        ratios.append((mean(one, "guarded") - mean(one, "plain")) / mean(one, "plain"))
    stderr = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
    return Overhead(plain, guarded, (guarded - plain) / plain, statistics.fmean(ratios), stderr, len(ratios))


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 100:.2f}%"


# -- the run ------------------------------------------------------------------------------------


def run_trials(
    trials: list[Trial], channel: grpc.Channel, node: str, alerts: AlertLog, job: Job
) -> list[list[int]]:
    """Drive each trial; returns the alerts (opened ids) each one raised."""
    return [run_trial(i, trial, channel, node, alerts, job) for i, trial in enumerate(trials, 1)]


def run_trial(
    i: int, trial: Trial, channel: grpc.Channel, node: str, alerts: AlertLog, job: Job
) -> list[int]:
    with alerts.changed:
        before = set(alerts.opened)

    def new(gpu_only: bool) -> list[int]:  # called with the log's lock held
        return sorted(
            k for k, a in alerts.opened.items() if k not in before and (a.gpu == trial.gpu or not gpu_only)
        )

    def snapshots_caught_up() -> bool:
        with alerts.changed:
            wanted = len(alerts.requested)
        return len(job.events("snapshot")) >= wanted

    push(channel, node, trial.healthy)
    push(channel, node, trial.precursor)
    if not alerts.wait(lambda: bool(new(True)), TRIAL_TIMEOUT_S):
        print(f"  trial {i}: no alert for gpu {trial.gpu} within {TRIAL_TIMEOUT_S:.0f} s", flush=True)
    job.wait(f"trial {i}'s snapshot", snapshots_caught_up, TRIAL_TIMEOUT_S)
    push(channel, node, trial.after)
    with alerts.changed:
        mine = new(True)
    if not alerts.wait(lambda: all(k in alerts.cleared for k in mine), TRIAL_TIMEOUT_S):
        print(f"  trial {i}: its alert did not clear within {TRIAL_TIMEOUT_S:.0f} s", flush=True)
    job.wait(f"trial {i}'s snapshots after the failure", snapshots_caught_up, TRIAL_TIMEOUT_S)
    with alerts.changed:
        return new(False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="model artifact (default: train a quick one into a temp dir)")
    p.add_argument("--node", default="bench-client-node", help="the job's node name (Protection's node=)")
    p.add_argument("--agree-every", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=100.0, help="target plain step time")
    p.add_argument("--warmup-steps", type=int, default=30, help="steps that choose the fixed sleep")
    p.add_argument("--rounds", type=int, default=10, help="rounds of plain, guarded, guarded, plain blocks")
    p.add_argument("--block-steps", type=int, default=50)
    p.add_argument("--trials", type=int, default=3, choices=range(1, len(FAILURES) + 1))
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 20-step blocks, 1 trial")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.block_steps, args.trials, args.warmup_steps = 1, 20, 1, 10
    if args.block_steps % args.agree_every:
        p.error("--block-steps must be a multiple of --agree-every")

    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        root = Path(tmp)
        model = args.model or train_quick_model(root / "model")
        return run(args, model, root)


def run(args: argparse.Namespace, model: Path, root: Path) -> int:
    load_start = os.getloadavg()
    trials = make_trials(args.trials, args.node)
    alerts = AlertLog(args.node)
    service = Service.open(
        model,
        root / "state",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0)),
        actuator=NoopActuator(),
    )
    service.book.listen(alerts.on_emitted)
    port = service.start("127.0.0.1:0")
    target = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(target)
    call = apb_grpc.AlertsStub(channel).Subscribe(apb.SubscribeRequest(nodes=[args.node]))
    follower = threading.Thread(target=alerts.follow, args=(call,), name="bench-alerts", daemon=True)
    follower.start()
    out = root / "job"
    out.mkdir()
    command = [
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
        str(root / "snapshots"),
        "--target",
        target,
        "--node-name",
        args.node,
        "--agree-every",
        str(args.agree_every),
        "--step-s",
        str(args.step_ms / 1e3),
        "--warmup-steps",
        str(args.warmup_steps),
        "--rounds",
        str(args.rounds),
        "--block-steps",
        str(args.block_steps),
    ]
    job = Job(out, command)
    started = time.monotonic()
    try:
        job.wait("the job to start", lambda: bool(job.events("ready")), START_TIMEOUT_S)
        phase_s = args.rounds * 4 * args.block_steps * args.step_ms / 1e3
        job.wait("the overhead blocks", lambda: bool(job.events("trials")), 3 * phase_s + START_TIMEOUT_S)
        raised = run_trials(trials, channel, args.node, alerts, job)
        code = job.stop(EXIT_TIMEOUT_S)
        if code != 0:
            print(f"the job failed ({code}):\n{job.tail()}", file=sys.stderr)
            return 1
        result = json.loads((out / "result.json").read_text())
        [ready] = job.events("ready")
    finally:
        job.kill()
        call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
        follower.join(timeout=10)
        channel.close()
        service.stop(0)
    wall_s = time.monotonic() - started
    report(args, result, ready, trials, raised, alerts, load_start, wall_s)
    return 0


def report(
    args: argparse.Namespace,
    result: dict[str, Any],
    ready: dict[str, Any],
    trials: list[Trial],
    raised: list[list[int]],
    alerts: AlertLog,
    load_start: tuple[float, float, float],
    wall_s: float,
) -> None:
    blocks, ranks = result["blocks"], result["ranks"]
    o = overhead(blocks, 4)
    steps = sum(len(b["steps_s"]) for b in blocks if b["mode"] == "guarded")
    print(
        f"trainer client: 2-rank DDP job (gloo, CPU) under torchrun, Protection(agree_every="
        f"{args.agree_every}) with a live Guard on a real Service at 127.0.0.1; node {ready['node']}"
    )
    print(
        f"  step: DDP forward/backward/AdamW on a 256-512-512-1 MLP, batch 64 "
        f"(median {ms(statistics.median(result['compute_s']))} in warm-up) + a fixed sleep of "
        f"{ms(result['sleep_s'])}"
    )
    print(
        f"  machine: {os.cpu_count()} cores, load average {load_start[0]:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {wall_s:.0f} s in all"
    )
    print(
        f"\noverhead: {plural(o.rounds, 'round')} of (plain, guarded, guarded, plain) blocks of "
        f"{args.block_steps} steps; {steps:,} steps per mode"
    )
    print(f"  mean step time, plain:            {ms(o.plain_s)}")
    print(f"  mean step time, guarded:          {ms(o.guarded_s)}")
    print(f"  overhead (guarded-plain)/plain:   {pct(o.ratio)} (all steps)")
    spread = f"{pct(o.round_ratio)} +- {pct(o.round_stderr)}"
    print(f"  overhead per round:               {spread} (mean +- standard error)")
    for rank, figures in enumerate(ranks):
        who = "rank 0 (guard)" if rank == 0 else f"rank {rank}"
        print(f"  step_end per call, {who + ':':<15} {distribution(figures['step_end_s'])}")
    for rank, figures in enumerate(ranks):
        calls, seconds = figures["agreement_calls"], figures["agreement_s"]
        per = ms(seconds / calls) if calls else "n/a"
        print(f"  agreement all-reduce, rank {rank}:    {per} per call ({calls} calls, {ms(seconds)} in all)")
    step_s = args.step_ms / 1e3
    per_step = [sum(figures["step_end_s"]) / steps for figures in ranks]
    for rank, cost in enumerate(per_step):
        share = pct(cost / step_s)
        print(f"  per-step overhead, rank {rank} (step_end total / steps): {ms(cost)} = {share} of a step")
    for rank, figures in enumerate(ranks):
        calls, seconds = figures["probe_calls"], figures["probe_s"]
        per = ms(seconds / calls) if calls else "n/a"
        print(
            f"  the same all-reduce back to back, ranks in step, rank {rank}: {per} per call ({calls} calls)"
        )
    for rank, figures in enumerate(ranks):
        cpu = {
            mode: sum(c for c, b in zip(figures["block_cpu_s"], blocks, strict=True) if b["mode"] == mode)
            / steps
            for mode in ("plain", "guarded")
        }
        who = "rank 0 (guard)" if rank == 0 else f"rank {rank}"
        print(f"  CPU per step, {who + ':':<15}      plain {ms(cpu['plain'])}, guarded {ms(cpu['guarded'])}")
    print(f"  snapshots during these blocks:    {ranks[0]['snapshots']}")

    snapshots: list[dict[str, Any]] = result["snapshots"]
    requested = len(alerts.requested)
    print(
        f"\nalert to snapshot: {plural(len(trials), 'trial')}, hbm_wear with a {LEAD_S / 60:.0f} min "
        f"precursor on twin node {TWIN_NODE}'s GPUs, samples pushed to {PUSH_UNTIL_S / 60:.0f} min before "
        "each failure"
    )
    by_alert = {s["opened_id"]: s for s in snapshots}
    guard_s: list[float] = []
    waits: list[tuple[float, float]] = []  # (guard received -> snapshot, agreement interval)
    for i, (trial, ids) in enumerate(zip(trials, raised, strict=True), 1):
        print(f"  trial {i}: gpu {trial.gpu} failing at {trial.fail_s / 3600:.0f} h; alerts {ids or 'none'}")
        for k in ids:
            alert = alerts.opened[k]
            before_min = (trial.fail_s - (alert.time_unix_nano / 1e9 - FLEET.start_unix_s)) / 60
            print(
                f"    alert {k}: gpu {alert.gpu} {apb.RecommendedAction.Name(alert.action)}, event time "
                f"{before_min:.0f} min before the failure, cleared: {alerts.cleared.get(k, 'no')}"
            )
            s = by_alert.get(k)
            if s is None:
                print("    no snapshot for it")
                continue
            print(f"    snapshot at step {s['step']}: {s['acknowledgement']}")
            if k in alerts.emitted:
                print(
                    f"      service emitted -> snapshot began:   {ms(s['started_unix'] - alerts.emitted[k])}"
                )
            print(f"      bench received -> snapshot began:    {ms(s['started_unix'] - alerts.received[k])}")
            if s["alert_to_snapshot_s"] is not None:
                guard_s.append(s["alert_to_snapshot_s"])
                print(f"      guard received -> snapshot began:    {ms(s['alert_to_snapshot_s'])}")
            if s["agreement_interval_s"] is not None:
                interval = ms(s["agreement_interval_s"])
                print(f"      agreement step before -> snapshot:   {interval} (an alert waits at most this)")
                if s["alert_to_snapshot_s"] is not None:
                    waits.append((s["alert_to_snapshot_s"], s["agreement_interval_s"]))
            took = ms(s["step_end_s"])
            print(f"      step_end on the snapshot step:       {took} (save, acknowledge, hold 0 s)")
    alert_steps = result["alert_steps_s"]
    bound = args.agree_every * statistics.fmean(alert_steps)
    print(f"  snapshots: {len(snapshots)}; alerts asking for one: {requested}; trials: {len(trials)}")
    print(f"  step time while alerts were driven (no snapshot): {distribution(alert_steps)}")
    if guard_s:
        print(
            f"  guard received -> snapshot began: mean {ms(statistics.fmean(guard_s))}, "
            f"max {ms(max(guard_s))}; expected bound agree_every x mean step = {ms(bound)}"
        )
    print("\ntargets:")
    worst = max(per_step)
    verdict = "met" if worst <= TARGET_OVERHEAD * step_s else "NOT met"
    share = pct(worst / step_s)
    print(f"  per-step overhead <= 1% of a {args.step_ms:.0f} ms step: {verdict} ({share}, the worse rank)")
    # The guard's time is monotonic, the interval wall clock: a millisecond's slack.
    within = "yes" if waits and all(wait <= interval + 1e-3 for wait, interval in waits) else "NO"
    print(f"  every snapshot began within one agreement interval of the guard's alert: {within}")
    under = all(v <= bound for v in guard_s)
    print(f"  guard received -> snapshot began <= agree_every x mean step: {'met' if under else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
