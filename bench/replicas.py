"""What buddy replicas cost a training step: a 3-rank DDP job (torchrun, CPU, gloo; each rank playing a
node of its own) carrying `--state-mb` of state per rank, run twice in one launch: without replicas
and with one every `--every` steps; the difference in wall time per replica, and that per minute.

    .venv/bin/python bench/replicas.py                   # 256 MiB per rank, 40 steps a run
    .venv/bin/python bench/replicas.py --state-mb 16     # smoke run

Each step is a fixed matrix product (`--step-ms` of compute, tuned once at the start) and a DDP
all-reduce of a small model; the state is that model plus a buffer of `--state-mb` (what a rank's
part of a large job's weights and optimizer would be). Both runs take the same steps in the same
process, alternated `--rounds` times; the replica run's extra wall time, divided by the replicas it
made (one every `--every` steps but none at the last step, whose work no later step could hide),
is the cost of one replica to training (the staging copy it blocks on, and the CPU its background thread takes from the
steps on a 2-core machine); the share of a minute it takes is the overhead at one replica a minute.
The host memory the replicas hold (own two newest parts and the buddy's two) is reported per rank.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from faultcast.client.replicas import BuddyReplicas
from faultcast.client.train_state import TrainState

KEY = b"bench-replica-key-of-32-bytes..."


class Job(torch.nn.Module):
    def __init__(self, state_mb: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)
        self.register_buffer("ballast", torch.rand(state_mb * 2**20 // 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        return out


def worker(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(Job(args.state_mb))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    matrix = torch.rand(256, 256)
    started = time.perf_counter()
    for _ in range(20):
        torch.mm(matrix, matrix)
    per_mm = (time.perf_counter() - started) / 20
    reps = torch.tensor([max(1, round(args.step_ms / 1000 / per_mm))], dtype=torch.float64)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # the same compute on every rank
    work = (matrix, int(reps.item()))
    state = TrainState(model=model, optimizer=optimizer)
    replicas = BuddyReplicas(state, KEY, every=args.every, job_id="bench", root=args.root, node=f"n{rank}")
    plain, with_replicas = [], []
    for _ in range(args.rounds):  # alternated: a noisy machine slows both alike
        plain.append(_timed(model, optimizer, work, args.steps, None))
        with_replicas.append(_timed(model, optimizer, work, args.steps, replicas))
    replicas.close()
    stats = replicas.stats
    report = {
        "rank": rank,
        "plain_s": plain,
        "replicas_s": with_replicas,
        "made": stats.made,
        "blocked_s": stats.blocked_s,
        "waited_s": stats.waited_s,
        "background_s": sum(stats.seconds),
        "background_cpu_s": sum(stats.cpu_seconds),
        "bytes_held": stats.bytes_held,
        "bytes_sent": stats.bytes_sent,
    }
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def _timed(model: torch.nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer,
           work: tuple[torch.Tensor, int], steps: int, replicas: BuddyReplicas | None) -> float:  # fmt: skip
    matrix, reps = work
    dist.barrier()
    started = time.perf_counter()
    for step in range(steps):
        for _ in range(reps):
            torch.mm(matrix, matrix)  # the step's compute
        loss = model(torch.ones(4, 64)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if replicas is not None and step + 1 < steps:  # none at the end: no step left to hide it behind
            replicas.step_end(step + 1)
    if replicas is not None:
        replicas.wait()  # the last one's work counts (done by now when it fits in its interval)
    dist.barrier()
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mb", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="runs of each kind, alternated")
    p.add_argument("--step-ms", type=float, default=500.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="faultcast-replicas-") as folder:
        shm = Path("/dev/shm")  # noqa: S108 (host memory, where the replicas live in production)
        root = shm if shm.is_dir() else Path(folder)
        with tempfile.TemporaryDirectory(dir=root, prefix="faultcast-bench-") as memory:
            command = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3",
                __file__, "--worker", "--out", folder, "--root", memory, "--state-mb", str(args.state_mb),
                "--steps", str(args.steps), "--every", str(args.every), "--step-ms", str(args.step_ms),
                "--rounds", str(args.rounds),
            ]  # fmt: skip
            subprocess.run(command, check=True)
            ranks = [json.loads(Path(folder, f"rank-{r}.json").read_text()) for r in range(3)]
    # The job's time is its slowest rank's; per round, the replica run against the plain one before it.
    plain = [max(r["plain_s"][i] for r in ranks) for i in range(args.rounds)]
    replicated = [max(r["replicas_s"][i] for r in ranks) for i in range(args.rounds)]
    made = ranks[0]["made"] // args.rounds
    costs = sorted((b - a) / made for a, b in zip(plain, replicated, strict=True))
    per_replica = statistics.median(costs)
    print(
        f"\n3 ranks (one per simulated node), {args.state_mb} MiB of state per rank, {args.steps} steps of "
        f"~{args.step_ms:.0f} ms, a replica every {args.every} steps ({made} a run), {args.rounds} rounds"
    )
    print(f"{'':34}{'seconds (each round)':>24}")
    print(f"{'steps without replicas':34}{'  '.join(f'{t:.2f}' for t in plain):>24}")
    print(f"{'the same steps with replicas':34}{'  '.join(f'{t:.2f}' for t in replicated):>24}")
    print(
        f"cost of one replica to training: median {per_replica:.3f} s (rounds {costs[0]:.3f} to {costs[-1]:.3f})"
    )
    total = sum(r["made"] for r in ranks)
    print(f"  blocked staging, mean per replica: {sum(r['blocked_s'] for r in ranks) / total:.3f} s")
    print(
        f"  background work, mean per replica: {sum(r['background_s'] for r in ranks) / total:.3f} s, "
        f"of which the replica thread's CPU {sum(r['background_cpu_s'] for r in ranks) / total:.3f} s"
    )
    print(f"overhead at one replica a minute: {100 * per_replica / 60:.2f}% of training time")
    held = max(r["bytes_held"] for r in ranks) / 2**20
    print(f"host memory held per rank: {held:.0f} MiB ({held / args.state_mb:.1f}x its state)")


if __name__ == "__main__":
    main()
