"""Spares through a webhook: the service POSTs an event and the receiver readies the replacement on
whatever scheduler it drives.

`prepare` POSTs {"event": "prepare_spare", "job_id", "node" (the doomed one: the replacement must not
land there), "alert_id", "gpu", "mode", "risk", "standby_job_id" (the job id the service names for the
standby: "<job_id>-standby-<alert_id>"), "standby_env": {"FAULTCAST_STANDBY_FOR": job_id,
"FAULTCAST_STANDBY_ALERT": alert_id, "FAULTCAST_STANDBY_CLAIM": the spare's claim (a secret: keep it
out of logs and command lines), "FAULTCAST_JOB_ID": standby_job_id}};
the receiver starts the job's own command away from that node with `standby_env` added, and the
trainer there stands by (client/standby.py). Any 2xx answer is ok; a JSON answer's "handle" (a string)
names the replacement for `release`, else the handle is "alert-<alert id>"; its "standby_job_id" (a
string) is the job id the standby runs under when the receiver's scheduler names its jobs itself (a
SLURM_JOB_ID comes before FAULTCAST_JOB_ID in the trainer), else the event's. The job is handed over
to that job id only, and only a standby presenting the claim may wait for it. `release` POSTs
{"event": "release_spare", "handle", "job_id", "alert_id", "why"}: the receiver gives the replacement
back. A provider's calls must be safe to repeat: a receiver takes a second event for the same
`alert_id` (or `handle`) as the first.

Ending the old job after a hand-over is the actuator's part (a webhook actuator's receiver gets the
remediation with `handover_to` set).
"""

from __future__ import annotations

import json
import logging

from faultcast.service.remediation.actuators import Outcome, post_json
from faultcast.service.remediation.spares.prescheduler import (
    JOB_ID_ENV,
    STANDBY_ALERT,
    STANDBY_CLAIM,
    STANDBY_FOR,
    Prepared,
    SpareRequest,
)

log = logging.getLogger(__name__)

MAX_HANDLE = 256


class WebhookSpares:
    """Spares through a webhook (see the module's docstring); `headers` go with every POST (an
    Authorization for the receiver), as with the webhook actuator."""

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must be http(s): {url!r}")
        if timeout_s <= 0:
            raise ValueError("webhook spares need a positive timeout")
        self.url, self.timeout_s, self.headers = url, timeout_s, dict(headers or {})
        if url.startswith("http://"):
            log.warning(
                "spares webhook %s is plain http: each spare's claim (the secret its standby proves "
                "itself with) crosses the network in clear; use https",
                url,
            )

    def prepare(self, request: SpareRequest) -> Prepared:
        """POST the prepare_spare event; the handle is the receiver's, else "alert-<id>"; the
        standby's job id the receiver's "standby_job_id", else the one the event named."""
        named = f"{request.job_id}-standby-{request.alert_id}"
        posted = post_json(
            self.url,
            {
                "event": "prepare_spare",
                "job_id": request.job_id,
                "node": request.node,
                "alert_id": request.alert_id,
                "gpu": request.gpu,
                "mode": request.mode,
                "risk": request.risk,
                "standby_job_id": named,
                "standby_env": {
                    STANDBY_FOR: request.job_id,
                    STANDBY_ALERT: str(request.alert_id),
                    STANDBY_CLAIM: request.claim,
                    JOB_ID_ENV: named,
                },
            },
            timeout_s=self.timeout_s,
            headers=self.headers,
        )
        if not posted.ok:
            return Prepared(False, "", f"webhook {self.url}: spare for job {request.job_id}: {posted.detail}")
        handle = _answered(posted.body, "handle") or f"alert-{request.alert_id}"
        standby_job = _answered(posted.body, "standby_job_id") or named
        log.info("spare for job %s asked through %s: %s", request.job_id, self.url, handle)
        return Prepared(
            True,
            handle,
            f"webhook {self.url}: spare {handle} for job {request.job_id}, standby job {standby_job}: "
            f"{posted.detail}",
            standby_job=standby_job,
        )

    def release(self, request: SpareRequest, handle: str, why: str) -> Outcome:
        """POST the release_spare event."""
        posted = post_json(
            self.url,
            {
                "event": "release_spare",
                "handle": handle,
                "job_id": request.job_id,
                "alert_id": request.alert_id,
                "why": why,
            },
            timeout_s=self.timeout_s,
            headers=self.headers,
        )
        verb = "released" if posted.ok else "releasing"
        return Outcome(posted.ok, f"webhook {self.url}: {verb} spare {handle}: {posted.detail}")


def _answered(answer: bytes, key: str) -> str:
    """The receiver's string under `key`, when its answer is a JSON object with one; else ""."""
    try:
        parsed = json.loads(answer)
    except ValueError:  # no body, or not JSON: the receiver names nothing
        return ""
    value = parsed.get(key) if isinstance(parsed, dict) else None
    return value.strip()[:MAX_HANDLE] if isinstance(value, str) else ""
