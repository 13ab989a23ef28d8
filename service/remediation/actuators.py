"""Actuators: what the service does to a node once an alert on it is acted on, and the retry
policy and circuit breaker every actuator runs behind (when to act is `remediator.Remediator`).

An actuator takes one `Remediation` (drain this node, requeue this job) and reports an `Outcome`;
it never raises for an expected failure (a node the scheduler does not know, a refused request): the
outcome says what went wrong. A failed attempt (an outcome not ok, or an exception after all) is
tried again after a backoff (`RetryPolicy`), so an actuator must be safe to repeat for one alert:
draining a drained node or cordoning a cordoned one changes nothing, and a webhook receiver should
dedupe on `alert_id`. The circuit breaker in front of every actuator caps how many nodes may be taken
out per window, so a model bug cannot drain a cluster. Only the service holds the privileges an
actuator uses.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Remediation:
    """What to do about one alert: take `node` out of service (and requeue `job_id` when `requeue`,
    or end it when `handover_to` names the standby that carries it on)."""

    alert_id: int
    node: str
    gpu: int  # -1 for a node-level alert
    mode: str  # the failure mode the model expects ("hbm_wear", ...)
    risk: float
    job_id: str  # the registered job on the node ("" when none)
    requeue: bool  # requeue (or evict) the job as well as draining the node
    checkpoint_uri: str = ""  # where the trainer's snapshot went, when it acknowledged one
    handover_to: str = ""  # the standby that took the job over at that snapshot: end the job, no requeue
    # A failure that happened (a FAILED event): what showed it ("xid", "gpu_lost", "node_silent", ...);
    # "" for a prediction. Hardware evidence is a fact the circuit breaker does not hold back.
    evidence: str = ""
    # The other registered jobs on a failed node that are requeued too (each by its own policy: a job
    # that replaces its nodes itself is not listed); empty for a prediction, which moves one job.
    also_requeue: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A stored request read back from JSON gives a list.
        object.__setattr__(self, "also_requeue", tuple(self.also_requeue))

    @property
    def requeued(self) -> list[str]:
        """Every job requeued (or evicted) with the drain, the alert's own first."""
        own = [self.job_id] if self.requeue and self.job_id and not self.handover_to else []
        return own + [job for job in self.also_requeue if job not in own]

    @property
    def reason(self) -> str:
        """One line an operator sees in `sinfo -R` or on the Kubernetes taint: names the alert."""
        gpu = f" gpu {self.gpu}" if self.gpu >= 0 else ""
        if self.evidence:
            return f"faultcast failure {self.alert_id}: {self.evidence} {self.mode}{gpu}"
        return f"faultcast alert {self.alert_id}: {self.mode}{gpu} risk {self.risk:.2f}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt at a remediation went; `ok` False is an expected failure, tried again."""

    ok: bool
    detail: str  # what was done, or why it could not be


class Actuator(Protocol):
    """Takes a node out of service. Implementations: Noop, Webhook, Slurm, Kubernetes."""

    name: str

    def remediate(self, remediation: Remediation) -> Outcome:
        """Act on one remediation; an expected failure is an Outcome that is not ok, not an exception."""


class NoopActuator:
    """The default: logs what it would do and does nothing."""

    name = "noop"

    def __init__(self) -> None:
        self.seen: list[Remediation] = []

    def remediate(self, remediation: Remediation) -> Outcome:
        """Keep the remediation in `seen`, log it, and report success."""
        self.seen.append(remediation)
        log.info("would drain %s (%s)", remediation.node, remediation.reason)
        return Outcome(True, f"noop: would drain {remediation.node}")


MAX_ANSWER = 64 * 1024  # the most of a webhook receiver's answer read (a spare's handle)


@dataclass(frozen=True, slots=True)
class Posted:
    """How one POST went: `ok` on a 2xx; `detail` says what came back; `body` is the answer."""

    ok: bool
    detail: str
    body: bytes = b""


def post_json(url: str, payload: dict[str, Any], *, timeout_s: float, headers: dict[str, str]) -> Posted:
    """POST `payload` as JSON to `url` (checked http(s) by the caller); never raises for a refusal
    or an unreachable receiver, which is a Posted that is not ok."""
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked by the caller)
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return Posted(True, f"HTTP {response.status}", response.read(MAX_ANSWER))
    except urllib.error.HTTPError as exc:
        return Posted(False, f"HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, timed out
        return Posted(False, str(exc))


class WebhookActuator:
    """POSTs the remediation as JSON to a URL; any 2xx is success."""

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must be http(s): {url!r}")
        self.url, self.timeout_s, self.headers = url, timeout_s, dict(headers or {})

    def remediate(self, remediation: Remediation) -> Outcome:
        """POST the remediation (and its reason) as JSON; ok on any 2xx answer."""
        payload = {**asdict(remediation), "reason": remediation.reason}
        posted = post_json(self.url, payload, timeout_s=self.timeout_s, headers=self.headers)
        return Outcome(posted.ok, f"webhook {self.url}: {posted.detail}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed remediation is tried again: the wait after attempt n is
    `initial_s * multiplier**(n-1)`, capped at `max_s`, then shortened by up to `jitter` of itself
    at random (so that remediations failing together do not retry in lockstep against a scheduler
    that just came back). After `max_attempts` attempts the remediation is recorded as failed.

    The defaults give up about 2.5 minutes after the first attempt (waits of 5, 10, 20, 40, 80 s):
    long enough to ride out a scheduler restart, short enough that an operator hears of it while
    the predicted fault is still ahead."""

    initial_s: float = 5.0
    multiplier: float = 2.0
    max_s: float = 300.0
    max_attempts: int = 6
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("a retry policy needs max_attempts >= 1 (1: no retry)")
        if not 0 < self.initial_s <= self.max_s or self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ValueError(
                "a retry policy needs 0 < initial_s <= max_s, multiplier >= 1 and 0 <= jitter < 1"
            )

    def delay_s(self, attempts: int, rand: float) -> float:
        """The wait after `attempts` (>= 1) failed attempts; `rand` in [0, 1) picks the jitter."""
        base = self.initial_s
        for _ in range(attempts - 1):  # a loop, not a power: stops at the cap, never overflows
            if base >= self.max_s:
                break
            base *= self.multiplier
        return min(base, self.max_s) * (1.0 - self.jitter * rand)


class CircuitBreaker:
    """Allows at most `max_nodes` distinct nodes to be taken out per `window_s` of its owner's clock.
    The owner keeps its window across restarts (`admissions`, `restore`): a service in a crash loop
    must not start each run with a fresh allowance."""

    def __init__(self, max_nodes: int = 4, window_s: float = 3600.0) -> None:
        self.check(max_nodes, window_s)
        self.max_nodes, self.window_s = max_nodes, window_s
        self._taken: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()
        self.tripped = 0  # remediations refused

    def resize(self, max_nodes: int, window_s: float) -> None:
        """New limits from now on (an admin's SetRemediation); the nodes taken so far still count."""
        self.check(max_nodes, window_s)
        with self._lock:
            self.max_nodes, self.window_s = max_nodes, window_s

    @staticmethod
    def check(max_nodes: int, window_s: float) -> None:
        """ValueError unless the limits make sense: at least one node (--max-drains), a window of
        finitely many seconds over zero (--drain-window; NaN would never end one)."""
        if max_nodes < 1 or not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(
                f"the circuit breaker needs at least 1 node (--max-drains, max_drains) and a finite, positive "
                f"window (--drain-window, drain_window_seconds), not {max_nodes} per {window_s} s"
            )

    def allow(self, node: str, now_s: float) -> bool:
        """Whether `node` may be taken out at `now_s`: a node already admitted in the window
        costs nothing more; a new one is admitted while fewer than `max_nodes` are (else counted in
        `tripped`)."""
        with self._lock:
            self._expire(now_s)
            if any(n == node for _, n in self._taken):
                return True  # the same node again costs nothing more
            if len(self._taken) >= self.max_nodes:
                self.tripped += 1
                return False
            self._taken.append((now_s, node))
            return True

    def is_open(self, now_s: float) -> bool:
        """True when the next new node would be refused."""
        with self._lock:
            return sum(1 for t, _ in self._taken if t > now_s - self.window_s) >= self.max_nodes

    def admissions(self, now_s: float) -> list[tuple[float, str]]:
        """(time, node) of each node taken out within the window at `now_s`, oldest first."""
        with self._lock:
            self._expire(now_s)
            return list(self._taken)

    def restore(self, admissions: Iterable[tuple[float, str]]) -> None:
        """Count again nodes an earlier run took out (times on this breaker's clock); a node listed
        twice counts once, at its latest time (the longer it counts, the safer)."""
        with self._lock:
            latest: dict[str, float] = {}
            for t, node in [*self._taken, *admissions]:
                latest[node] = max(t, latest.get(node, t))
            self._taken = deque(sorted((t, node) for node, t in latest.items()))

    def _expire(self, now_s: float) -> None:
        """Forget admissions that left the window (the lock held)."""
        while self._taken and self._taken[0][0] <= now_s - self.window_s:
            self._taken.popleft()
