"""Slurm actuator: drain the node with `scontrol`, then requeue the job that ran there.

Draining (not downing) lets Slurm stop scheduling onto the node without killing what runs there; the
requeue then ends the job on the drained node and puts it back in the queue, so it restarts on healthy
nodes and resumes from the snapshot its trainer just took. When a standby took the job over at that
snapshot (a pre-scheduled spare, service/remediation/spares/slurm.py), the job is cancelled instead: the standby
is the job now. The reason carries the alert id, so an operator sees it in `sinfo -R` and
`scontrol show node`.

Everything goes through the `scontrol` binary (argument lists, never a shell), so the actuator needs
no Slurm library and works with whatever version the cluster runs; the service's user needs the
Slurm operator privilege (or SlurmUser/root) to drain nodes and requeue other users' jobs.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from faultcast.service.remediation.actuators import Outcome, Remediation

log = logging.getLogger(__name__)

# One plain node name: a hostlist expression ("gpu[1-64]") or a list would take out many nodes in one
# remediation, behind the circuit breaker's back, and a leading "-" could read as an option.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A job id, or one task of an array job ("1234_7").
JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
# The "[user@time]" stamp Slurm appends to a node's reason.
_REASON_STAMP = re.compile(r"\s*\[[^\]\s]+@[^\]\s]+\]")


class SlurmError(RuntimeError):
    """A query to Slurm failed (scontrol missing, timed out or refused); the message says why."""


class SlurmCommands:
    """Runs Slurm's client binaries (from `bin_dir`, else the PATH) with `env` added to the
    environment, each call bounded by `timeout_s`; argument lists only, never a shell."""

    def __init__(
        self, bin_dir: Path | None = None, *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("Slurm commands need a positive timeout")
        self.bin_dir, self.env, self.timeout_s = bin_dir, dict(env or {}), timeout_s

    def binary(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir is not None else name

    def run(
        self,
        name: str,
        *args: str,
        stdin: str | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str] | str:
        """The finished call on success; otherwise a one-line description of the failure.
        `extra_env`: variables for this call alone (a secret sbatch passes on by name)."""
        binary = self.binary(name)
        try:
            result = subprocess.run(
                [binary, *args],
                env={**os.environ, **self.env, **(extra_env or {})},
                input=stdin,
                stdin=subprocess.DEVNULL if stdin is None else None,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{binary} timed out after {self.timeout_s:g} s"
        except OSError as exc:  # not installed, not executable
            return f"cannot run {binary}: {exc.strerror or exc}"
        if result.returncode != 0:
            message = " ".join((result.stderr.strip() or result.stdout.strip() or "no message").split())
            return f"{binary} exited {result.returncode}: {message}"
        return result


class SlurmActuator:
    """Drains the node (`scontrol update ... State=DRAIN`) and, on requeue, requeues the Slurm job.

    `scontrol` is the binary's path (scancel is taken from beside it); `env` adds variables
    (SLURM_CONF) to the service's environment for each call; `timeout_s` bounds every call (scontrol
    retries a missing config for a minute).
    """

    name = "slurm"

    def __init__(
        self, scontrol: str = "scontrol", *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("the Slurm actuator needs a positive timeout")
        self.scontrol = scontrol
        where = Path(scontrol).parent if os.sep in scontrol else None
        self.commands = SlurmCommands(where, env=env, timeout_s=timeout_s)

    def remediate(self, remediation: Remediation) -> Outcome:
        """Drain the node with scontrol (and requeue the job when `requeue`); a refusal is an
        Outcome that is not ok."""
        node, job_id = remediation.node, remediation.job_id
        if not NODE_NAME.fullmatch(node):
            return Outcome(False, f"slurm: {node!r} is not a single Slurm node name, drained nothing")
        reason = " ".join(remediation.reason.split())  # one line, whatever the mode string held
        failure = self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        if failure:
            return Outcome(False, f"slurm: drain of node {node} failed: {failure}")
        log.info("drained Slurm node %s (%s)", node, reason)
        done = [f"drained node {node} ({reason})"]
        if remediation.handover_to:  # only at a snapshot: a prediction, which moves one job
            return self._end_handed_over(remediation, done)
        if remediation.requeue and not job_id:
            done.append("no job registered on the node, nothing to requeue")
        requeued = [self._requeue(job, done) for job in remediation.requeued]
        # The alert's own job decides: another job on a failed node that cannot be requeued (it has
        # ended, or it is pending) is said, not retried with the whole remediation.
        ok = requeued[0] if requeued and remediation.requeue and job_id else True
        return Outcome(ok, "slurm: " + "; ".join(done))

    def _requeue(self, job_id: str, done: list[str]) -> bool:
        """Requeue one job; whether it worked (what happened is added to `done`)."""
        if not JOB_ID.fullmatch(job_id):
            done.append(f"job id {job_id!r} is not a Slurm job id, requeued nothing")
            return False
        failure = self._scontrol("requeue", job_id)
        if failure:
            done.append(f"requeue of job {job_id} failed: {failure}")
            return False
        log.info("requeued Slurm job %s", job_id)
        done.append(f"requeued job {job_id}")
        return True

    def _end_handed_over(self, remediation: Remediation, done: list[str]) -> Outcome:
        """The standby took the job over at its snapshot: cancel the job on the drained node."""
        job_id, standby = remediation.job_id, remediation.handover_to
        if not JOB_ID.fullmatch(job_id):
            done.append(f"job id {job_id!r} is not a Slurm job id, cancelled nothing")
            return Outcome(False, "slurm: " + "; ".join(done))
        state = self._standby_state(standby)
        if state != "RUNNING":
            # The standby was told to go and is gone (or never was a Slurm job): ending the job too
            # would lose it. Requeue it, from the same snapshot, as without a spare.
            done.append(f"standby job {standby} is not running ({state or 'unknown to squeue'})")
            return Outcome(self._requeue(job_id, done), "slurm: " + "; ".join(done))
        failure = self.commands.run("scancel", job_id)
        if isinstance(failure, str):
            done.append(f"cancelling job {job_id} failed: {failure}")
            return Outcome(False, "slurm: " + "; ".join(done))
        log.info(
            "cancelled Slurm job %s on node %s: standby %s carries it on", job_id, remediation.node, standby
        )
        done.append(f"cancelled job {job_id}, handed over to standby job {standby}")
        return Outcome(True, "slurm: " + "; ".join(done))

    def _standby_state(self, standby: str) -> str:
        """The standby job's state as squeue shows it ("" when squeue does not know it)."""
        if not JOB_ID.fullmatch(standby):
            return ""
        shown = self.commands.run("squeue", "-h", "-j", standby, "-o", "%T")
        return shown.stdout.strip() if not isinstance(shown, str) else ""

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of a node from `scontrol show node -o`: "IDLE+DRAIN", "faultcast alert 7: ...".

        The reason is "" when the node has none; Slurm's "[user@time]" stamp is left off. Raises
        SlurmError when scontrol fails (an unknown node, no controller), for operators and tests.
        """
        if not NODE_NAME.fullmatch(node):
            raise SlurmError(f"{node!r} is not a single Slurm node name")
        result = self._run("show", "node", "-o", node)
        if isinstance(result, str):
            raise SlurmError(f"scontrol show node {node}: {result}")
        return parse_node_line(result.stdout)

    def _scontrol(self, *args: str) -> str:
        """Runs scontrol; "" on success, else why it failed (scontrol's own message where it gave one)."""
        result = self._run(*args)
        return result if isinstance(result, str) else ""

    def _run(self, *args: str) -> subprocess.CompletedProcess[str] | str:
        """The finished call on success; otherwise a one-line description of the failure."""
        return self.commands.run(os.path.basename(self.scontrol), *args)


def parse_node_line(text: str) -> tuple[str, str]:
    """(state, reason) from one `scontrol show node -o` line; SlurmError when it has no State=."""
    state = re.search(r"(?:^|\s)State=(\S+)", text)
    if state is None:
        raise SlurmError(f"no State= in scontrol output: {text.strip()[:200]!r}")
    reason = ""
    found = re.search(r"(?:^|\s)Reason=(.*)$", text.strip())
    if found:
        rest = found.group(1)
        stamp = _REASON_STAMP.search(rest)
        # The reason runs to Slurm's stamp; without one, to where the next Key= begins.
        reason = rest[: stamp.start()] if stamp else re.split(r"\s+(?=[A-Z][A-Za-z]*=)", rest, maxsplit=1)[0]
    return state.group(1), reason.strip()
