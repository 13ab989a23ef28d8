"""After a predictive snapshot: acknowledge it, and hold while the service moves the job.

Shared by the training-loop hook and both framework adapters; each adds its own collective around
these (an agreement, a barrier) since each framework synchronises ranks its own way.
"""

from __future__ import annotations

import logging
import threading

from faultcast.client.guard import Guard
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)


def acknowledge(
    guard: Guard, step: int, uri: str, replies: list[str], *, taken_for: apb.Alert | None = None
) -> bool:
    """Send SNAPSHOT_DONE for `step` (see Guard.snapshot_done for `taken_for`); True when the service
    answered that it drains this node (it replies "<alert>: drain <node> ..."), so the job is about to
    be stopped and requeued."""
    reply = guard.snapshot_done(step, uri, taken_for)
    replies.append(reply)
    log.warning("faultcast: snapshot of step %d at %s acknowledged: %s", step, uri, reply)
    return reply.split(": ", 1)[-1].startswith("drain ")


def handed_over(reply: str) -> bool:
    """Whether the service's reply says a standby took the job over ("... hand job J over to standby
    S"): this copy must not train on."""
    return " over to standby " in reply.split(": ", 1)[-1]


def hold(released: threading.Event, step: int, wait_s: float) -> None:
    """The service drains this node and requeues the job: training on would only be redone. Wait
    (the scheduler ends the job) until `released` is set or `wait_s` passes."""
    log.warning("faultcast: holding at step %d for up to %.0f s while the job is moved", step, wait_s)
    released.wait(wait_s)
