"""The standby side of a pre-scheduled migration: a copy of the job started on a spare during an
alert's lead, which prepares everything and waits for the service's word.

The scheduler starts the job's own command on the spare with FAULTCAST_STANDBY_FOR naming the job it
stands by for (service/slurm_spares.py does so on Slurm). `Protection.resume()` then loads the newest
whole snapshot (the periodic checkpoint: imports, model construction and most of the load are done
before anything is asked of the old job) and waits on the service (AwaitHandOver): "go" names the
snapshot the old job took on the alert, which it loads and trains on from; "released" (a false
alarm, or the old job went the usual way) ends the process with exit status 0.

A standby that the scheduler restarts (SLURM_RESTART_COUNT above 0: it crashed or was requeued after
it took over) is an ordinary run of the job: it resumes from the newest snapshot and does not wait.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from faultcast.client.snapshots import Snapshot, SnapshotStore
from faultcast.v1 import alerts_pb2 as apb

if TYPE_CHECKING:
    from faultcast.client.guard import Guard

STANDBY_FOR = "FAULTCAST_STANDBY_FOR"
STANDBY_WAIT_S = 3600.0  # a standby gives up (exit 0) when nothing came this long
POLL_S = 10.0  # each AwaitHandOver is held by the service at most this long; every rank hears each answer


class StandbyReleased(SystemExit):
    """The service released this standby (or nothing came in time): the process ends, status 0."""

    def __init__(self, reason: str) -> None:
        super().__init__(0)
        self.reason = reason

    def __str__(self) -> str:
        return f"standby released: {self.reason}"


class HandedOver(SystemExit):
    """The job was handed over to its standby and the scheduler did not end this copy: it ends
    itself (status 0) rather than train beside the standby."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step

    def __str__(self) -> str:
        return f"handed over to a standby at step {self.step}"


def standby_for(environ: Mapping[str, str] | None = None) -> str | None:
    """The job this process stands by for, from the environment; None for an ordinary run (no
    variable, or a scheduler restart of a standby that had taken over)."""
    env = os.environ if environ is None else environ
    job = env.get(STANDBY_FOR, "").strip()
    restarted = env.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")
    return job if job and not restarted else None


@dataclass(frozen=True)
class Word:
    """The service's word to a standby (picklable: rank 0 broadcasts it to the other ranks)."""

    go: bool = False
    released: bool = False
    step: int = 0
    checkpoint_uri: str = ""
    reason: str = ""


def ask(guard: Guard | None, job: str, since: float, *, give_up_s: float = STANDBY_WAIT_S) -> Word:
    """One long poll of the service on behalf of the standby for `job` that became ready at
    `since` (time.monotonic()); waiting is an empty Word, an unreachable service too (asked again)."""
    if guard is None:
        return Word(released=True, reason="this rank has no guard to ask the service with")
    if time.monotonic() - since > give_up_s:
        return Word(released=True, reason=f"no hand-over came within {give_up_s:.0f} s")
    reply = guard.await_hand_over(job, POLL_S)
    if reply is None or reply.state == apb.HAND_OVER_STATE_WAITING:
        return Word()
    if reply.state == apb.HAND_OVER_STATE_GO:
        return Word(go=True, step=reply.step, checkpoint_uri=reply.checkpoint_uri)
    return Word(released=True, reason=reply.reason or apb.HandOverState.Name(reply.state))


def snapshot_at(store: SnapshotStore, uri: str, step: int) -> Snapshot:
    """The whole snapshot the hand-over names: in this job's store (the same command, the same
    directory), else at the URI's own directory; RuntimeError when it is not whole there."""
    parsed = urlparse(uri)
    path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(uri)
    for where in (store, SnapshotStore(path.parent)):
        for snapshot in where.complete():
            if snapshot.step == step and snapshot.path.resolve() == path.resolve():
                return snapshot
    raise RuntimeError(f"the hand-over names the snapshot of step {step} at {uri}, which is not whole here")
