"""The training job of bench/client.py, run under torchrun (2 ranks, gloo, CPU); not run by hand.

Each step is a small DDP forward/backward/AdamW step on a fixed batch, then a fixed `time.sleep` that
stands in for the rest of a ~100 ms step. The sleep is chosen once, from the median compute time of
the warm-up steps (rank 0's, broadcast), and never adapted afterwards: a guarded step that costs more
shows as a longer step.

Phase 1 (overhead): `--rounds` rounds of four blocks of `--block-steps` steps, plain, guarded, guarded,
plain (ABBA, so a linear drift of the machine's speed cancels within a round). A plain step is the
step alone; a guarded step also calls `Protection.step_end`, timed with `perf_counter`. The one
`Protection` (its Guard subscribed to the service) lives through both kinds of block: a plain block
leaves its idle subscription thread running, as a job between agreements does.

Phase 2 (alerts): guarded steps until `<out>/stop` exists (checked by rank 0, agreed by an all-reduce
every `--agree-every` steps so both ranks stop at the same step). Each snapshot the hook takes is
written to the event log at once, so the bench can drive the next trial.

Rank 0 (the guard's rank) appends one JSON line per event to <out>/events.jsonl and writes every raw
timing to <out>/result.json at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from faultcast.client import Protection, TrainState
from faultcast.client.agreement import Agreement, Vote

CONNECT_TIMEOUT_S = 120.0
BLOCK_ORDER = ("plain", "guarded", "guarded", "plain")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--snapshots", type=Path, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument(
        "--node-name", required=True, help="the node name the Protection (and its Guard) uses"
    )
    parser.add_argument("--job-id", default="bench-client")
    parser.add_argument("--agree-every", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.100)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block-steps", type=int, default=50)
    parser.add_argument("--probe-calls", type=int, default=100, help="back-to-back agreement all-reduces")
    parser.add_argument("--max-alert-phase-s", type=float, default=900.0, help="stop even without <out>/stop")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    )  # fmt: skip
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(64, 256, generator=data), torch.randn(64, 1, generator=data)

    def train_step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        optimizer.step()

    events = args.out / "events.jsonl"

    def event(kind: str, **fields: Any) -> None:
        if rank == 0:
            with events.open("a") as handle:
                handle.write(json.dumps({"event": kind, "unix": time.time(), **fields}) + "\n")

    protection = Protection(
        args.snapshots,
        TrainState(model=model, optimizer=optimizer),
        target=args.target,
        job_id=args.job_id,
        node=args.node_name,
        agree_every=args.agree_every,
        migration_wait_s=0.0,  # the service's NoopActuator moves nothing: go on at once
    )
    guard = protection.guard
    if guard is not None and not guard.wait_connected(CONNECT_TIMEOUT_S):
        raise SystemExit(f"the guard never connected to {args.target}: {guard.last_error}")
    dist.barrier()
    step = protection.resume()

    # Calibration: the fixed sleep that makes a plain step about --step-s.
    compute: list[float] = []
    for _ in range(args.warmup_steps):
        start = time.perf_counter()
        train_step()
        compute.append(time.perf_counter() - start)
    sleep = torch.tensor([max(0.0, args.step_s - statistics.median(compute))], dtype=torch.float64)
    dist.broadcast(sleep, src=0)
    sleep_s = float(sleep.item())
    # The agreement's all-reduce alone, the ranks in step (a barrier first), back to back.
    probe = Agreement()
    dist.barrier()
    for _ in range(args.probe_calls):
        probe.agree(Vote())

    event("ready", node=protection.node, job_id=protection.job_id, compute_s=compute, sleep_s=sleep_s)

    # Phase 1: interleaved plain and guarded blocks.
    blocks: list[dict[str, Any]] = []
    block_cpu_s: list[float] = []  # this process's CPU time in each block (the guard's thread included)
    step_end_s: list[float] = []
    for block in range(args.rounds * len(BLOCK_ORDER)):
        mode = BLOCK_ORDER[block % len(BLOCK_ORDER)]
        steps_s: list[float] = []
        cpu = time.process_time()
        for _ in range(args.block_steps):
            start = time.perf_counter()
            train_step()
            time.sleep(sleep_s)  # stands in for the rest of the step's compute: fixed, never adapted
            if mode == "guarded":
                step += 1
                before = time.perf_counter()
                protection.step_end(step)
                end = time.perf_counter()
                step_end_s.append(end - before)
            else:
                end = time.perf_counter()
            steps_s.append(end - start)
        block_cpu_s.append(time.process_time() - cpu)
        blocks.append({"mode": mode, "steps_s": steps_s})
    # Each rank's own figures for phase 1 (gathered at the end).
    mine = {
        "step_end_s": step_end_s,
        "agreement_calls": protection.agreement.calls,
        "agreement_s": protection.agreement.seconds,
        "snapshots": len(protection.stats.snapshots),
        "block_cpu_s": block_cpu_s,
        "probe_calls": probe.calls,
        "probe_s": probe.seconds,
    }
    event("trials", step=step)

    # Phase 2: guarded steps while the bench raises alerts; each snapshot is reported at once.
    stop_file, deadline = args.out / "stop", time.monotonic() + args.max_alert_phase_s
    snapshots: list[dict[str, Any]] = []
    alert_steps_s: list[float] = []  # the steps that took no snapshot
    # Wall clock as the last agreement step's step_end began. Phase 1 ended on one, and the bench
    # raises its first alert only after the "trials" event: an alert that reaches the guard before
    # phase 2's first agreement step waits at most from here.
    agreed_unix: float | None = time.time()
    while True:
        start = time.perf_counter()
        train_step()
        time.sleep(sleep_s)
        step += 1
        pending = guard.pending() if guard is not None else None
        taken = len(protection.stats.snapshots)
        previous = agreed_unix
        if step % args.agree_every == 0:
            agreed_unix = time.time()
        before = time.perf_counter()
        protection.step_end(step)
        end = time.perf_counter()
        if len(protection.stats.snapshots) == taken:
            alert_steps_s.append(end - start)
        else:
            stats = protection.stats
            snapshot = {
                "step": step,
                "started_unix": stats.snapshot_started_unix[-1],
                "alert_to_snapshot_s": stats.alert_to_snapshot_s[-1] if guard is not None else None,
                "opened_id": pending.opened_id if pending is not None else None,
                "gpu": pending.gpu if pending is not None else None,
                "step_end_s": end - before,
                # From the agreement step before, which did not see the alert yet, to this one.
                "agreement_interval_s": None
                if previous is None
                else stats.snapshot_started_unix[-1] - previous,
                "acknowledgement": stats.acknowledgements[-1] if stats.acknowledgements else "",
            }
            snapshots.append(snapshot)
            event("snapshot", **snapshot)
        if step % args.agree_every == 0:
            flag = torch.tensor([int(rank == 0 and (stop_file.exists() or time.monotonic() > deadline))])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                break
    protection.close()

    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        result = {"sleep_s": sleep_s, "compute_s": compute, "blocks": blocks, "ranks": ranks,
                  "snapshots": snapshots, "alert_steps_s": alert_steps_s, "steps": step}  # fmt: skip
        (args.out / "result.json").write_text(json.dumps(result))
    event("done", step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
