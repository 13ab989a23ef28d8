"""The harness of one-node replacement, shared by tests/test_node_replacement.py and
bench/node_replacement.py: an elastic job of testing/jobs/elastic_job.py, one torchrun agent per
node (started directly, or as one Slurm job per node), the c10d rendezvous store hosted here (the
service host: never one of the nodes that may die), a node killed whole, and what the job did after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # exported at run time only

from faultcast.client.elastic import ELASTIC_ENV, torchrun_args
from faultcast.testing.slurm_cluster import SlurmCluster

JOB = Path(__file__).parent / "jobs" / "elastic_job.py"
WAIT_S = 180.0


@dataclass(frozen=True)
class Shape:
    """The job: steps, replica interval, the step it holds at for the kill, extra state."""

    steps: int = 24
    every: int = 3
    hold_at: int = 10
    state_mib: float = 0.0
    agree_every: int = 10


@dataclass
class Run:
    """One elastic run's folders, its rendezvous store and its agents."""

    work: Path
    shape: Shape
    target: str | None = None  # the faultcast service, when the job's guards listen to one
    store: TCPStore = field(init=False)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    jobs: dict[str, str] = field(default_factory=dict)  # node -> Slurm job id (submitted agents)

    def __post_init__(self) -> None:
        for sub in ("out", "snapshots", "progress", "logs"):  # memory: the replicas make it, private
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)

    @property
    def go(self) -> Path:
        return self.work / "go"

    def job_args(self) -> list[str]:
        w, s = self.work, self.shape
        return [
            "--out", str(w / "out"), "--root", str(w / "memory"), "--snapshots", str(w / "snapshots"),
            "--progress", str(w / "progress"), "--steps", str(s.steps), "--every", str(s.every),
            "--hold-at", str(s.hold_at), "--go", str(self.go), "--state-mib", str(s.state_mib),
            "--agree-every", str(s.agree_every), *(["--target", self.target] if self.target else []),
        ]  # fmt: skip

    def command(self, nodes: int = 3) -> list[str]:
        """One node's agent (every node's, the spare's too: the node's name comes from its environment)."""
        options = torchrun_args(
            nodes=nodes,
            procs_per_node=1,
            endpoint=f"127.0.0.1:{self.store.port}",
            run_id="elastic-job",
            local_addr="127.0.0.1",
        )
        return [sys.executable, "-m", "torch.distributed.run", *options, str(JOB), *self.job_args()]

    def env(self, node: str) -> dict[str, str]:
        return {
            **os.environ,
            **ELASTIC_ENV,
            "SLURMD_NODENAME": node,
            "LOGLEVEL": "INFO",
            "OMP_NUM_THREADS": "1",
        }

    def start(self, node: str) -> None:
        """Start `node`'s agent here (no scheduler)."""
        log = (self.work / "logs" / f"{node}.log").open("wb")
        self.agents[node] = subprocess.Popen(
            self.command(), env=self.env(node), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def submit(self, cluster: SlurmCluster, node: str, beside: str = "") -> str:
        """Submit `node`'s agent as a Slurm job of its own on that node; its job id. `beside`: a shell
        command run in the background in the same job (the node's collector): it dies with the node."""
        exports = ",".join(
            f"{k}={v}" for k, v in {**ELASTIC_ENV, "LOGLEVEL": "INFO", "OMP_NUM_THREADS": "1"}.items()
        )
        job = cluster.sbatch(
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name=fc-elastic-{node}",
            f"--export=ALL,{exports}",
            f"--output={self.work / 'logs' / f'{node}.log'}",
            "--wrap",
            f"{beside + ' & ' if beside else ''}exec {shlex.join(self.command())}",
        )
        self.jobs[node] = job
        return job

    def submit_with_spare(
        self, cluster: SlurmCluster, nodes: Sequence[str], spare: str, beside: Mapping[str, str] | None = None
    ) -> None:
        """Submit the nodes' agents, wait until they hold at `shape.hold_at`, then submit the spare's
        and wait until it waits in the rendezvous (warm). `beside`: a command per node (see submit)."""
        for node in nodes:
            self.submit(cluster, node, beside=(beside or {}).get(node, ""))
        logs = self.work / "logs"
        wait_until(
            f"the nodes to hold at step {self.shape.hold_at}", lambda: self.holding(len(nodes)), logs=logs
        )
        self.submit(cluster, spare)
        wait_until("the spare to wait in the rendezvous", lambda: self.spare_waiting(spare), logs=logs)

    def agent_of(self, node: str) -> int | None:
        """The pid of `node`'s torchrun agent under Slurm (found by its job's environment)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            env = environ_of(int(entry.name))
            if env.get("SLURM_JOB_ID") != self.jobs.get(node) or env.get("SLURMD_NODENAME") != node:
                continue
            with contextlib.suppress(OSError):
                if b"torch.distributed.run" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
        return None

    def lose_memory(self, node: str) -> None:
        """The node's host memory is gone with it: its replicas and the parts it held."""
        shutil.rmtree(self.work / "memory" / "elastic-job" / node)

    def progress(self) -> dict[str, dict[str, Any]]:
        """Each node's newest progress (local rank 0's)."""
        out = {}
        for path in (self.work / "progress").glob("*-0.json"):
            with contextlib.suppress(OSError, ValueError):
                out[path.stem.removesuffix("-0")] = json.loads(path.read_text())
        return out

    def holding(self, nodes: int = 3) -> bool:
        seen = self.progress()
        return sum(1 for p in seen.values() if p.get("holding")) == nodes

    def spare_waiting(self, node: str) -> bool:
        """The spare's agent has joined the rendezvous (imports done: warm)."""
        log = self.work / "logs" / f"{node}.log"
        return log.is_file() and "Rendezvous'ing worker group" in log.read_text(errors="replace")

    def reports(self, world: int = 3) -> list[dict[str, Any]]:
        return [json.loads((self.work / "out" / f"rank-{r}.json").read_text()) for r in range(world)]

    def weights(self, world: int = 3) -> list[dict[str, torch.Tensor]]:
        return [torch.load(self.work / "out" / f"rank-{r}.pt", weights_only=True) for r in range(world)]

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                kill_tree(agent.pid)
                agent.wait()


def wait_until(
    what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_S, logs: Path | None = None
) -> None:
    """Poll `predicate` (file state written by other processes) until true; AssertionError naming
    `what` (and the logs' tails) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tails = ""
            if logs is not None:
                tails = "\n".join(
                    f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                    for p in sorted(logs.glob("*.log"))
                )
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.02)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc: torchrun's workers leave its process group)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def kill_tree(pid: int) -> list[int]:
    """A node lost whole: freeze the tree (so nothing in it reacts or spawns), then SIGKILL all of it."""
    procs = descendants(pid)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    procs = sorted({q for p in procs for q in descendants(p)})
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return procs


def parent_of(pid: int) -> int:
    """The parent's pid (0 when the process is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def environ_of(pid: int) -> Mapping[str, str]:
    """A process's environment (empty when it is gone or not ours)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def reference(work: Path, shape: Shape, stop: int = 0) -> list[dict[str, torch.Tensor]]:
    """The same job on one host (--standalone, 3 ranks), never interrupted: the yardstick. With
    `stop`: a run to step `stop`, then a fresh run that goes on from its newest replica (the
    reference run from the replica's step)."""
    for steps in (stop, shape.steps) if stop else (shape.steps,):
        run = Run(work, Shape(steps, shape.every, 0, shape.state_mib, shape.agree_every))
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", str(JOB),
            *run.job_args(),
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=WAIT_S, env=run.env("reference")
        )
        ranks = "\n".join(line for line in done.stderr.splitlines() if line.startswith("[rank"))
        assert done.returncode == 0, f"{ranks[-8000:]}\n{done.stderr[-4000:]}"
    return run.weights()


def same(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]) -> bool:
    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(torch.equal(g[k], w[k]) for k in w)
        for g, w in zip(got, want, strict=True)
    )
