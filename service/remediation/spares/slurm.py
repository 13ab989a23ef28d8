"""Spares on Slurm: a standby copy of the warned job, submitted before anything is drained.

`prepare` reads the job's own batch script from the controller (`scontrol write batch_script JOB -`)
and its shape (`scontrol show job -o`: nodes, tasks, working directory, output file) and submits the
same script again with `sbatch`, away from the doomed node, onto the hot-spare partition or the
reservation held for such jobs when one is configured (else the job's own partition), with
FAULTCAST_STANDBY_FOR naming the job and FAULTCAST_STANDBY_CLAIM carrying the spare's claim (through
sbatch's environment, never its arguments). The standby job's id is the only job id the service
hands the job over to. The job's trainer (`faultcast.client.Protection`) sees that
variable, prepares everything (imports, model, the newest periodic checkpoint) and waits for the
service's hand-over instead of training. `release` cancels the standby (`scancel`).

The standby runs as the job's owner: a service running as root submits it with `--uid`/`--gid` of
the job; a service running as another user readies spares only for its own user's jobs (anything
else would run the user's script with the service's rights). Its environment is the owner's login
environment (`--get-user-env`, root only) plus the two variables, not the service's (`export`,
default "NONE"; "ALL" passes the service's environment on, for sites that want that). It keeps
the job's requeue flag: a standby Slurm starts again after it took the job over resumes as the
job; one started again before that stands down (faultcast.client.standby). Array jobs get no
standby (the copy would not be the same task). Copied from the job: nodes, tasks (and per node),
CPUs per task, memory per node, generic resources (GPUs), time limit, account, QOS, constraints,
working directory and output files (appended to). Everything goes through the binaries, argument
lists only, as the Slurm actuator does.
"""

from __future__ import annotations

import logging
import os
import re

from faultcast.service.remediation.actuators import Outcome
from faultcast.service.remediation.slurm import JOB_ID, NODE_NAME, SlurmCommands
from faultcast.service.remediation.spares.prescheduler import (
    STANDBY_ALERT,
    STANDBY_CLAIM,
    STANDBY_FOR,
    Prepared,
    SpareRequest,
)

log = logging.getLogger(__name__)
_FIELD = re.compile(r"(?:^|\s)([A-Za-z/]+)=(\S*)")
_SLURM_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._&|,\[\]*-]*")  # an account, QOS or constraint expression


class SlurmSpares:
    """Standby jobs on Slurm (see the module's docstring). `partition` / `reservation`: where spares
    are held (both optional; without either the job's own partition, minus the doomed node)."""

    name = "slurm"

    def __init__(
        self,
        commands: SlurmCommands,
        *,
        partition: str = "",
        reservation: str = "",
        export: str = "NONE",
    ) -> None:
        for what, value in (("partition", partition), ("reservation", reservation)):
            if value and not NODE_NAME.fullmatch(value):  # one plain Slurm name, as a node's
                raise ValueError(f"spare {what} {value!r} is not a Slurm name")
        self.commands, self.partition, self.reservation, self.export = (
            commands,
            partition,
            reservation,
            export,
        )

    def prepare(self, request: SpareRequest) -> Prepared:
        """Submit the job's script again as its standby; the handle is the standby's job id."""
        job, node = request.job_id, request.node
        if not JOB_ID.fullmatch(job):
            return Prepared(False, "", f"slurm: {job!r} is not a Slurm job id: no standby")
        if not NODE_NAME.fullmatch(node):
            return Prepared(False, "", f"slurm: {node!r} is not a single Slurm node name: no standby")
        shown = self.commands.run("scontrol", "show", "job", "-o", job)
        if isinstance(shown, str):
            return Prepared(False, "", f"slurm: cannot read job {job}: {shown}")
        fields = dict(_FIELD.findall(shown.stdout))
        if fields.get("ArrayJobId", "(null)") not in ("", "(null)") or "_" in job:
            return Prepared(
                False, "", f"slurm: job {job} is an array task: a copy would not be the same task"
            )
        owner = self._owner(fields)
        if isinstance(owner, str):
            return Prepared(False, "", f"slurm: no standby for job {job}: {owner}")
        script = self.commands.run("scontrol", "write", "batch_script", job, "-")
        if isinstance(script, str):
            return Prepared(False, "", f"slurm: cannot read the batch script of job {job}: {script}")
        options = self._options(request, fields) + owner
        # The claim goes through sbatch's environment, named (not valued) in --export: never in an
        # argument list, which every user of the host may read.
        submitted = self.commands.run(
            "sbatch", *options, stdin=script.stdout, extra_env={STANDBY_CLAIM: request.claim}
        )
        if isinstance(submitted, str):
            return Prepared(False, "", f"slurm: standby for job {job} refused: {submitted}")
        standby = submitted.stdout.strip().split(";")[0]
        where = self.partition or self.reservation or fields.get("Partition", "?")
        log.info("submitted standby job %s for job %s (away from %s, on %s)", standby, job, node, where)
        return Prepared(
            True,
            standby,
            f"slurm: standby job {standby} for job {job} on {where}, not on {node}",
            standby_job=standby,  # its SLURM_JOB_ID
        )

    @staticmethod
    def _owner(fields: dict[str, str]) -> list[str] | str:
        """The options that make the standby run as the job's owner, or why it cannot."""
        uid = re.search(r"\((\d+)\)", fields.get("UserId", ""))
        gid = re.search(r"\((\d+)\)", fields.get("GroupId", ""))
        if uid is None or gid is None:
            return f"its owner is unknown (UserId={fields.get('UserId', '')!r})"
        if os.geteuid() == 0:
            return [f"--uid={uid.group(1)}", f"--gid={gid.group(1)}", "--get-user-env"]
        if int(uid.group(1)) != os.geteuid():
            return (
                f"it belongs to uid {uid.group(1)} and the service runs as uid {os.geteuid()}, not root: "
                "the standby would run as the wrong user"
            )
        return []

    def _options(self, request: SpareRequest, fields: dict[str, str]) -> list[str]:
        options = [
            "--parsable",
            f"--job-name={fields.get('JobName', 'job')}-standby"[:200],
            f"--exclude={request.node}",
            "--export="
            + _export(
                self.export,
                f"{STANDBY_FOR}={request.job_id},{STANDBY_ALERT}={request.alert_id},{STANDBY_CLAIM}",
            ),
            "--open-mode=append",
            "--requeue" if fields.get("Requeue") == "1" else "--no-requeue",
        ]
        partition = self.partition or fields.get("Partition", "")
        if partition:
            options.append(f"--partition={partition}")
        if self.reservation:
            options.append(f"--reservation={self.reservation}")
        for key, flag in (
            ("NumNodes", "--nodes"),
            ("NumTasks", "--ntasks"),
            ("CPUs/Task", "--cpus-per-task"),
        ):
            value = fields.get(key, "")
            if re.fullmatch(r"[0-9]+", value):
                options.append(f"{flag}={value}")
        options += _resources(fields)
        for key, flag in (("WorkDir", "--chdir"), ("StdOut", "--output"), ("StdErr", "--error")):
            value = fields.get(key, "")
            if value.startswith("/"):
                options.append(f"{flag}={value}")
        return options

    def release(self, request: SpareRequest, handle: str, why: str) -> Outcome:
        """Cancel the standby job (pending or waiting)."""
        if not JOB_ID.fullmatch(handle):
            return Outcome(False, f"slurm: {handle!r} is not a Slurm job id, cancelled nothing")
        failure = self.commands.run("scancel", handle)
        if isinstance(failure, str):
            return Outcome(False, f"slurm: cancelling standby job {handle} failed: {failure}")
        log.info("cancelled standby job %s of job %s (%s)", handle, request.job_id, why)
        return Outcome(True, f"slurm: cancelled standby job {handle} ({why})")


def _resources(fields: dict[str, str]) -> list[str]:
    """The job's resources and accounting, as sbatch options (what `scontrol show job` names)."""
    options: list[str] = []
    per_node = fields.get("NtasksPerN:B:S:C", "").split(":")[0]
    if re.fullmatch(r"[1-9][0-9]*", per_node):
        options.append(f"--ntasks-per-node={per_node}")
    memory = fields.get("MinMemoryNode", "")
    if re.fullmatch(r"[1-9][0-9]*[KMGT]?", memory):
        options.append(f"--mem={memory}")
    gres = fields.get("TresPerNode", "")
    if gres and gres != "(null)":
        options.append(
            "--gres=" + ",".join(g.removeprefix("gres:").removeprefix("gres/") for g in gres.split(","))
        )
    limit = fields.get("TimeLimit", "")
    if re.fullmatch(r"[0-9:-]+", limit):
        options.append(f"--time={limit}")
    for key, flag in (("Account", "--account"), ("QOS", "--qos"), ("Features", "--constraint")):
        value = fields.get(key, "")
        if value and value != "(null)" and _SLURM_VALUE.fullmatch(value):
            options.append(f"{flag}={value}")
    return options


def _export(setting: str, standby: str) -> str:
    """sbatch's --export value: the standby's variables after the setting ("NONE": those alone, on
    top of the login environment --get-user-env brings)."""
    return standby if setting.upper() == "NONE" else f"{setting},{standby}"
