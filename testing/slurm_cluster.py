"""A private, throw-away Slurm cluster on this host, for tests that drive a real scheduler.

`SlurmCluster` writes a slurm.conf in its own temporary directory and starts, each in the foreground
under `subprocess.Popen` so the helper owns them: a munged with its own key and socket, a slurmctld,
and one slurmd per node (`slurmd -N`, Debian builds Slurm with multiple-slurmd support), all nodes
on localhost with distinct ports. Client commands find the cluster through `SLURM_CONF` in `env`.
Nothing touches /etc/slurm, /etc/munge or a system munged.

Config quirks (Slurm 22.05, Debian bookworm), each needed for a fast and deterministic test:
- munged insists that every directory on its socket path be searchable by all, and that the key be
  private: the root directory is mode 0755, the key 0600. pytest's own tmp dirs are 0700, so the
  helper makes its own under the system temporary directory (which also keeps the socket path short).
- A requeued job may not start again until `cred_expire` + 1 seconds have passed (default 120 s):
  `AuthInfo=...,cred_expire=5` (with a smaller value the 120 s default applies: tried 2).
- By default the main scheduler loop runs every 60 s and backfill every 30 s, and a requeued job whose
  begin time has passed waits for one of them: `SchedulerParameters=sched_interval=1,bf_interval=1`.
- `ProctrackType=proctrack/linuxproc` and `TaskPlugin=task/none`, so no cgroup setup is needed.
- Nodes carry increasing `Weight`, so a job submitted to an idle cluster lands on the first node.
- slurmctld and slurmd take their ports from slurm.conf and cannot pick one themselves: the ports are
  ones free a moment ago, and when a daemon finds one taken after all ("Address already in use" in
  its log) the whole cluster starts again on fresh ports (`tests.conftest.start_on_free_ports`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from faultcast.testing.system import AddressInUseError, require_binary, start_on_free_ports

CLIENT_TIMEOUT_S = 15.0


# What a test cluster runs: fails in CI (skips elsewhere) when one is missing.
SLURM_PARTS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "sinfo", "scancel")


def running_cluster(nodes: Sequence[str]) -> Iterator[SlurmCluster]:
    """For a module-scoped fixture: `yield from running_cluster(names)`."""
    for part in SLURM_PARTS:
        require_binary(part)
    with SlurmCluster(nodes) as started:
        yield started


class SlurmClusterError(RuntimeError):
    """The cluster did not come up (or a client command failed); the message carries the log tails."""


class SlurmCluster:
    """Starts munged, slurmctld and one slurmd per node in a temporary directory; stops them on exit.

    Use as a context manager. `env` is the environment for client commands (scontrol, sbatch, squeue).
    """

    def __init__(
        self,
        nodes: Sequence[str] = ("fc-node1", "fc-node2", "fc-node3"),
        *,
        partition: str = "fc",
        start_timeout_s: float = 30.0,
    ) -> None:
        if not nodes:
            raise ValueError("a Slurm cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.partition = partition
        self.start_timeout_s = start_timeout_s
        self.env: dict[str, str] = {}  # for client commands; set by start()
        self._root: Path | None = None
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    @property
    def root(self) -> Path:
        """The cluster's directory: slurm.conf, state, spools, logs, the munge key and socket."""
        if self._root is None:
            raise RuntimeError("the Slurm cluster is not started")
        return self._root

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Writes the config, starts the daemons and waits until every node is IDLE; starts again on
        fresh ports when a daemon could not bind its own."""
        start_on_free_ports(self._start_on, count=1 + len(self.nodes))

    def _start_on(self, ports: list[int]) -> None:
        """slurmctld on ports[0], the slurmds on the rest."""
        self._root = Path(tempfile.mkdtemp(prefix="fc-slurm-"))
        self.root.chmod(0o755)  # munged checks that all may search the directories on its socket path
        try:
            self._write_config(ports[0], ports[1:])
            self._start_munged()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            self._wait_for("slurmctld to answer", self._controller_up)
            for node in self.nodes:
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
            self._wait_for("all nodes to be IDLE", self._all_idle)
        except SlurmClusterError as exc:
            self.stop()
            if "Address already in use" in str(exc):  # the message carries the daemons' log tails
                raise AddressInUseError(str(exc)) from exc
            raise
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancels every job (their slurmstepd outlive slurmd otherwise), then stops the daemons."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc, _ in self._procs):
            self._cancel_all_jobs()
        # slurmds first, then the controller, then munged (both of the others talk through it).
        for _, proc, _ in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for _, _, out in self._procs:
            out.close()
        self._procs.clear()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def kill_node(self, node: str) -> None:
        """The node lost whole, as far as Slurm goes: SIGKILL its slurmd (its jobs' processes are the
        caller's to kill: slurmstepd outlives slurmd)."""
        for name, proc, _ in self._procs:
            if name == f"slurmd-{node}" and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def restart_node(self, node: str) -> None:
        """The node back (repaired): its slurmd started again; the controller then ends what it
        believed ran there."""
        dead = [(n, p, o) for n, p, o in self._procs if n == f"slurmd-{node}" and p.poll() is not None]
        for entry in dead:
            entry[2].close()
            self._procs.remove(entry)
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    # -- client commands ---------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm client command against this cluster; raises (with log tails) when `check` fails."""
        result = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, check=False
        )
        if check and result.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}\n{self.log_tails()}"
            )
        return result

    def sbatch(self, *options: str) -> str:
        """Submits a batch job (output under the cluster directory); returns its job id."""
        out = self.run(
            "sbatch",
            "--parsable",
            f"--partition={self.partition}",
            f"--chdir={self.root}",
            f"--output={self.root / 'job-%j.out'}",
            *options,
        ).stdout
        return out.strip().split(";")[0]  # "id" or "id;cluster"

    def job(self, job_id: str) -> tuple[str, str]:
        """(state, node list) of a job as squeue shows it; ("", "") once squeue no longer knows it."""
        fields = self.run("squeue", "-h", "-j", job_id, "-o", "%T %N", check=False).stdout.split()
        return (fields[0], fields[1] if len(fields) > 1 else "") if fields else ("", "")

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Polls `predicate` until it holds; fails with the daemons' log tails at the deadline."""
        self._wait_for(what, predicate, timeout_s)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon's log and captured output, for failure messages."""
        parts: list[str] = []
        for path in sorted((self.root / "log").glob("*")) if self._root is not None else []:
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    # -- internals ---------------------------------------------------------------------------------

    def _write_config(self, controller_port: int, node_ports: Sequence[int]) -> None:
        for sub in ("log", "state", "munge", *(f"spool/{node}" for node in self.nodes)):
            (self.root / sub).mkdir(parents=True)
        (self.root / "munge").chmod(0o755)
        user = getpass.getuser()
        node_lines = [
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"CPUs=1 RealMemory=100 Weight={i + 1} State=UNKNOWN"
            for i, (node, port) in enumerate(zip(self.nodes, node_ports, strict=True))
        ]
        conf = [
            "ClusterName=faultcast-test",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={controller_port}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "JobRequeue=1",
            "ReturnToService=2",
            "KillWait=2",
            "MpiDefault=none",
            "MailProg=/bin/true",
            *node_lines,
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(conf) + "\n")
        # Inherited SLURM_* variables (a test run inside a Slurm job) would point clients elsewhere.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))}
        self.env["SLURM_CONF"] = str(self.conf)

    def _start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(1024))
        munge = self.root / "munge"
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
        )
        self._wait_for("munged to create its socket", lambda: self.munge_socket.is_socket())

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = (self.root / "log" / f"{name}.out").open("wb")
        proc = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        self._procs.append((name, proc, out))

    def _controller_up(self) -> bool:
        return self.run("scontrol", "ping", check=False).returncode == 0

    def all_idle(self) -> bool:
        """Every node of the cluster is idle (none down, drained or running a job)."""
        return self._all_idle()

    def _all_idle(self) -> bool:
        result = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in self.nodes)

    def _cancel_all_jobs(self) -> None:
        """Best effort, bounded: a hung controller must not keep the daemons from being stopped."""

        def queued() -> list[str]:
            return self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()

        try:
            jobs = queued()
            if jobs:
                self.run("scancel", *jobs, check=False)
            deadline = time.monotonic() + 20
            while jobs and time.monotonic() < deadline:
                time.sleep(0.2)
                jobs = queued()
        except subprocess.TimeoutExpired:
            pass

    def _wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self.start_timeout_s if timeout_s is None else timeout_s)
        while True:
            dead = [
                f"{name} exited {proc.returncode}" for name, proc, _ in self._procs if proc.poll() is not None
            ]
            if dead:
                raise SlurmClusterError(f"waiting for {what}: {', '.join(dead)}\n{self.log_tails()}")
            if predicate():
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.1)
