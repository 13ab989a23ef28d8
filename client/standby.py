"""The standby side of a pre-scheduled migration: a copy of the job started on a spare during an
alert's lead, which prepares everything and waits for the service's word.

The scheduler starts the job's own command on the spare with FAULTCAST_STANDBY_FOR naming the job it
stands by for and FAULTCAST_STANDBY_CLAIM holding the spare's claim, a secret the service issued with
the spare that every AwaitHandOver carries (service/remediation/spares/slurm.py does so on Slurm).
`Protection.resume()` then loads the newest whole snapshot (the periodic checkpoint: imports, model
construction and most of the load are done before anything is asked of the old job) and waits on
the service (AwaitHandOver): "go" names the snapshot the old job took on the alert, which it loads
and trains on from; "released" (a false alarm, or the old job went the usual way) ends the process
with EXIT_STOOD_DOWN (75).

The snapshot the word names must be a whole one in the standby's own snapshot store (the same
command, the same directory): one anywhere else, or one reached through a symbolic link that leads
out of the store, is refused, and the standby ends (HandOverRefused, exit status 65) without
training: a forged word must not make it load, or unpickle, what someone else wrote.

A standby that took the job over records it in the snapshot directory (TAKEN_OVER.json, its own job
id): started again (the scheduler requeued it, torchrun restarted it), it is an ordinary run of the
job and resumes from the newest snapshot. A standby the scheduler started again before it took over
stands down (exit 75): it would otherwise train beside the job.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import grpc

from faultcast.client.guard import channel_to
from faultcast.client.snapshots import Snapshot, SnapshotStore
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)

STANDBY_FOR = "FAULTCAST_STANDBY_FOR"
STANDBY_ALERT = "FAULTCAST_STANDBY_ALERT"
STANDBY_CLAIM = "FAULTCAST_STANDBY_CLAIM"  # the spare's secret: sent to the service, never logged
STANDBY_WAIT_S = 3600.0  # a standby gives up (exit 75) when nothing came this long
POLL_S = 10.0  # each AwaitHandOver is held by the service at most this long; every rank hears each answer


# The exit status of a copy of the job that ends on faultcast's word (a released standby, a copy
# handed over): nothing failed, but the job did not finish here, so `torchrun ... && post-step` in
# a batch script must not go on (EX_TEMPFAIL).
EXIT_STOOD_DOWN = 75
# The exit status of a standby that refused the snapshot its hand-over named (EX_DATAERR): the job
# runs nowhere now, and its operator must look (the log line says why).
EXIT_HANDOVER_REFUSED = 65
TAKEN_OVER = "TAKEN_OVER.json"  # in the snapshot directory: which run took the job over, at which step


class StandbyReleased(SystemExit):
    """The service released this standby (or nothing came in time): the process ends with
    EXIT_STOOD_DOWN."""

    def __init__(self, reason: str) -> None:
        super().__init__(EXIT_STOOD_DOWN)
        self.reason = reason

    def __str__(self) -> str:
        return f"standby released: {self.reason}"


class HandedOver(SystemExit):
    """The job was handed over to its standby and the scheduler did not end this copy: it ends
    itself (EXIT_STOOD_DOWN) rather than train beside the standby."""

    def __init__(self, step: int) -> None:
        super().__init__(EXIT_STOOD_DOWN)
        self.step = step

    def __str__(self) -> str:
        return f"handed over to a standby at step {self.step}"


class HandOverRefused(SystemExit):
    """The hand-over named a snapshot this standby will not load: the process ends with
    EXIT_HANDOVER_REFUSED, without training."""

    def __init__(self, reason: str) -> None:
        super().__init__(EXIT_HANDOVER_REFUSED)
        self.reason = reason

    def __str__(self) -> str:
        return f"hand-over refused: {self.reason}"


class RefusedSnapshotError(RuntimeError):
    """The snapshot a hand-over names is not a whole one in this job's own store (the reason says
    which rule it breaks)."""


def standby_for(environ: Mapping[str, str] | None = None) -> str | None:
    """The job this process was started to stand by for, from the environment; None for an
    ordinary run. (Whether it took the job over already is in the snapshot directory: `took_over`.)"""
    env = os.environ if environ is None else environ
    return env.get(STANDBY_FOR, "").strip() or None


def standby_alert(environ: Mapping[str, str] | None = None) -> int:
    """The alert this standby was started for (FAULTCAST_STANDBY_ALERT; 0 when not set or not a number)."""
    env = os.environ if environ is None else environ
    value = env.get(STANDBY_ALERT, "").strip()
    return int(value) if value.isdigit() else 0


def standby_claim(environ: Mapping[str, str] | None = None) -> str:
    """The spare's claim (FAULTCAST_STANDBY_CLAIM), which the service asks of its standby; "" when not set."""
    env = os.environ if environ is None else environ
    return env.get(STANDBY_CLAIM, "").strip()


def restarted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the scheduler started this run again (Slurm's SLURM_RESTART_COUNT above 0)."""
    env = os.environ if environ is None else environ
    return env.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")


@dataclass(frozen=True)
class Word:
    """The service's word to a standby (picklable: rank 0 broadcasts it to the other ranks)."""

    go: bool = False
    released: bool = False
    step: int = 0
    checkpoint_uri: str = ""
    reason: str = ""


class HandOverAsker:
    """Rank 0's channel to the service while it stands by (the guard starts only at the take-over).
    Every request carries the spare's `claim`, which is kept out of logs and reprs."""

    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None,
        job_id: str,
        node: str,
        alert_id: int = 0,
        claim: str = "",
    ) -> None:
        self.job_id, self.node, self.alert_id = job_id, node, alert_id
        self._claim = claim
        self._channel = channel_to(target, credentials)
        self._stub = apb_grpc.AlertsStub(self._channel)
        self._backoff = threading.Event()  # never set: its wait is the pause after a refusal
        self.last_error = ""

    def ask(self, standby_for: str, wait_s: float) -> apb.HandOver | None:
        """The service's word, held by it up to `wait_s`; None when it could not be asked (a pause
        of a second first, so an unreachable service is not asked in a tight loop). A refusal
        (PERMISSION_DENIED: not the spare's claim, not the job id the service named) is final: it is
        answered as RELEASED with the service's reason, and asking again would change nothing."""
        request = apb.AwaitHandOverRequest(
            standby_for=standby_for,
            job_id=self.job_id,
            node=self.node,
            wait_seconds=wait_s,
            alert_id=self.alert_id,
            claim=self._claim,
        )
        try:
            reply: apb.HandOver = self._stub.AwaitHandOver(request, timeout=wait_s + 10.0)
        except grpc.RpcError as exc:
            self.last_error = (
                f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.Call) else str(exc)
            )
            log.warning("faultcast: asking for the hand-over of job %s: %s", standby_for, self.last_error)
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                return apb.HandOver(
                    state=apb.HAND_OVER_STATE_RELEASED,
                    reason=f"the service refused this standby: {exc.details()}",
                )
            self._backoff.wait(1.0)
            return None
        return reply

    def close(self) -> None:
        self._channel.close()


def took_over(store: SnapshotStore, job_id: str) -> bool:
    """Whether this run (`job_id`) took the job over already (its restart is an ordinary run)."""
    try:
        marker = json.loads((store.root / TAKEN_OVER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("job") == job_id


def mark_taken_over(store: SnapshotStore, job_id: str, standby_for: str, step: int) -> None:
    """Record that `job_id` took `standby_for` over at `step` (written whole, then renamed)."""
    tmp = store.root / (TAKEN_OVER + ".tmp")
    tmp.write_text(json.dumps({"job": job_id, "from": standby_for, "step": step, "unix": time.time()}))
    tmp.replace(store.root / TAKEN_OVER)


def ask(asker: HandOverAsker | None, job: str, since: float, *, give_up_s: float = STANDBY_WAIT_S) -> Word:
    """One long poll of the service on behalf of the standby for `job` that became ready at
    `since` (time.monotonic()); waiting is an empty Word, an unreachable service too (asked again)."""
    if asker is None:
        return Word(released=True, reason="this rank has no channel to ask the service with")
    if time.monotonic() - since > give_up_s:
        return Word(released=True, reason=f"no hand-over came within {give_up_s:.0f} s")
    reply = asker.ask(job, POLL_S)
    if reply is None or reply.state == apb.HAND_OVER_STATE_WAITING:
        return Word()
    if reply.state == apb.HAND_OVER_STATE_GO:
        return Word(go=True, step=reply.step, checkpoint_uri=reply.checkpoint_uri)
    return Word(released=True, reason=reply.reason or apb.HandOverState.Name(reply.state))


def snapshot_at(store: SnapshotStore, uri: str, step: int) -> Snapshot:
    """The whole snapshot of `step` that the hand-over names (a file:// URI or an absolute path),
    which must lie in this job's own store, symbolic links resolved. RefusedSnapshotError, with the
    reason, for one that resolves outside the store's root (a step directory linking out of it
    included), or is not a whole snapshot of that step there."""
    named = _named_path(uri)
    root = store.root.resolve()
    where = named.resolve()
    if not where.is_relative_to(root):
        linked = " through a symbolic link" if where != Path(os.path.normpath(named)) else ""
        raise RefusedSnapshotError(
            f"the hand-over names {uri}, which leads{linked} to {where}, outside this job's snapshot "
            f"store {root}"
        )
    for snapshot in store.complete():
        if snapshot.step == step and snapshot.path.resolve() == where:
            return snapshot
    raise RefusedSnapshotError(
        f"the hand-over names the snapshot of step {step} at {uri}, which is not a whole snapshot of "
        f"that step in this job's store {root}"
    )


def _named_path(uri: str) -> Path:
    """The absolute local path a hand-over's URI names; RefusedSnapshotError for anything else."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise RefusedSnapshotError(f"the hand-over names {uri}, on another host ({parsed.netloc})")
        path = Path(unquote(parsed.path))
    elif parsed.scheme == "":
        path = Path(uri)
    else:
        raise RefusedSnapshotError(f"the hand-over names {uri!r}, neither a file:// URI nor a path")
    if not path.is_absolute():
        raise RefusedSnapshotError(f"the hand-over names {uri!r}, not an absolute path")
    return path
