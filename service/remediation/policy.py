"""Remediation's decisions, without I/O: which alerts start a grace timer and when it is due, what an
acknowledgement is answered, whether the circuit breaker admits a node, what an attempt's result
leads to, and how the breaker's window and the grace deadlines map to wall-clock time for the next
process. Time is passed in; nothing here reads a clock, the store, or runs an actuator, so each rule
is tested directly (tests/test_remediation_policy.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from faultcast.actions import moves_node as action_moves_node
from faultcast.service.alert_events import mode_of
from faultcast.service.remediation.actuators import CircuitBreaker, Remediation
from faultcast.service.state.acks import Ack
from faultcast.v1 import alerts_pb2 as apb

# Clear reasons after which a grace timer has nothing to do (others may be the failure itself).
RISK_FELL = (apb.CLEAR_REASON_RISK_FELL, apb.CLEAR_REASON_SUPERSEDED)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# -- grace timers ---------------------------------------------------------------------------


class GraceTimers:
    """Each alert's grace deadline (clock time), started once per alert and kept until settled.
    Not locked: the remediator holds its lock around every call."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []  # (clock time, opened_id): timers to look at
        self._running: dict[int, float] = {}  # opened_id -> clock time its grace ends, until settled
        self._started: set[int] = set()  # alerts whose timer started (once per alert)
        self._dirty = False  # the deadlines changed since they were last written

    def arm(self, opened_id: int, due: float) -> None:
        """Start the alert's timer at a deadline already on disk (restored)."""
        self._started.add(opened_id)
        self._running[opened_id] = due
        heapq.heappush(self._heap, (due, opened_id))

    def start(self, opened_id: int, due: float) -> None:
        """Start the alert's timer at a new deadline, to be written."""
        self.arm(opened_id, due)
        self._dirty = True

    def settle(self, opened_id: int) -> None:
        """The alert's timer has nothing left to do: forget its deadline."""
        if self._running.pop(opened_id, None) is not None:
            self._dirty = True

    def look_again(self, opened_id: int, at: float) -> None:
        """Look at the timer again at `at` (its deadline unchanged)."""
        heapq.heappush(self._heap, (at, opened_id))

    def started(self, opened_id: int) -> bool:
        return opened_id in self._started

    def running(self, opened_id: int) -> bool:
        return opened_id in self._running

    def due(self, now: float) -> list[int]:
        """The alerts whose timer is due at `now`, taken off the heap."""
        return due_ids(self._heap, now)

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def take_dirty(self) -> bool:
        """Whether the deadlines changed since last written; the caller writes them now."""
        dirty, self._dirty = self._dirty, False
        return dirty

    def mark_dirty(self) -> None:
        """The write failed: write them again later."""
        self._dirty = True

    def on_disk(self, now: float, wall: float) -> dict[str, float]:
        """The running deadlines in wall-clock time (what the next process reads)."""
        return {str(k): round(wall + (at - now), 3) for k, at in sorted(self._running.items())}

    def restore(self, saved: object, now: float, wall: float, grace_s: float) -> None:
        """Arm the timers an earlier run left (`on_disk`'s dict), at their original deadlines."""
        for key, due in saved.items() if isinstance(saved, dict) else ():
            if str(key).isdigit() and isinstance(due, int | float):
                # A wall clock set back since must not stretch a deadline past a full grace period.
                self.arm(int(key), now + min(due - wall, grace_s))


def due_ids(timers: list[tuple[float, int]], now: float) -> list[int]:
    """Pop every (time, id) due at `now` off a heap of timers."""
    due = []
    while timers and timers[0][0] <= now:
        due.append(heapq.heappop(timers)[1])
    return due


class GraceStep(Enum):
    """What an alert does to its grace timer."""

    NOW = "now"  # a failure that happened: due at once
    AFTER_GRACE = "after grace"  # snapshot-and-migrate: due after the grace period
    SETTLE = "settle"  # the risk fell: nothing left to do


def grace_step(alert: apb.Alert, timers: GraceTimers) -> tuple[int, GraceStep] | None:
    """The timer an alert from the book touches (its key) and what it does; a timer that starts
    (NOW, AFTER_GRACE) starts only on a node that may run a registered job, which the caller checks."""
    if alert.kind == apb.EVENT_KIND_FAILED:
        # It has happened: no grace to wait for a snapshot. The node goes now (unless it is being
        # taken out already) and the job is requeued from its last checkpoint.
        return (alert.id, GraceStep.NOW) if alert.failure.drains_node else None
    key = alert.opened_id or alert.id
    if alert.state == apb.ALERT_STATE_CLEARED and alert.clear_reason in RISK_FELL:
        return key, GraceStep.SETTLE
    if alert.state != apb.ALERT_STATE_OPEN or not moves_node(alert) or timers.started(key):
        return None
    return key, GraceStep.AFTER_GRACE


def moves_node(alert: apb.Alert) -> bool:
    """Whether the alert recommends snapshot-and-migrate: its node is taken out after SNAPSHOT_DONE
    or its grace period (an open one left without a stored deadline gets a timer at a start)."""
    return action_moves_node(alert.action)


# -- alerts and acknowledgements --------------------------------------------------------------


def risk_fell(cleared: apb.Alert | None) -> bool:
    """Whether the alert (its CLEARED event, None while open) cleared because its risk fell back (its
    other endings, a GPU gone dark or a node gone silent, may be the failure itself: the node goes)."""
    return cleared is not None and cleared.clear_reason in RISK_FELL


def declined(acks: Iterable[Ack]) -> bool:
    """Whether the job declined the alert (the node is left to the operator)."""
    return any(a.action == apb.ACK_ACTION_DECLINED for a in acks)


def holds_node(event: apb.Alert | None, outcome: str, cleared: apb.Alert | None) -> bool:
    """Whether an alert still keeps its node taken out: one not yet cleared (`cleared` None), or a
    FAILED event (which never clears) only while its own remediation is under way."""
    if event is not None and event.kind == apb.EVENT_KIND_FAILED:
        return outcome == "pending"
    return cleared is None


def declined_answer(alert: apb.Alert) -> str:
    return f"declined: {alert.node} stays in service; the operator decides"


def ack_answer(alert: apb.Alert, action: int, grace_s: float, *, fell: bool) -> str | None:
    """What an acknowledgement (not DECLINED) of the alert's newest event is answered when it takes
    out no node now; None when it does (a SNAPSHOT_DONE of snapshot-and-migrate)."""
    if fell:
        return f"noted; alert {alert.opened_id} has cleared (its risk fell back): nothing to remediate"
    if not moves_node(alert):
        what = apb.RecommendedAction.Name(alert.action)
        return f"noted; alert {alert.opened_id} recommends {what}: {alert.node} stays in service"
    if action != apb.ACK_ACTION_SNAPSHOT_DONE:
        return f"noted; {alert.node} is drained after SNAPSHOT_DONE or in {grace_s:.0f} s"
    return None


def evidence_of(alert: apb.Alert) -> str:
    """What showed a FAILED event's failure, in the words a drain reason carries ("xid 79",
    "gpu_lost", "node_silent", ...); "" for a prediction."""
    if alert.kind != apb.EVENT_KIND_FAILED:
        return ""
    if alert.failure.evidence == apb.FAILURE_EVIDENCE_XID:
        return f"xid {alert.failure.xid}"
    name = apb.FailureEvidence.Name(alert.failure.evidence).removeprefix("FAILURE_EVIDENCE_").lower()
    return name or "unspecified"


# The evidence of a failure of the GPU itself: one GPU's fact, which no shared cause fakes on many
# nodes at once. A port down (a subnet manager's failover takes down every port of the fabric), an
# NVML that does not answer (a driver or collector bug) and a silence (a partition) can all come from
# one cause on the whole fleet.
_GPU_FACTS = ("xid ", "gpu_lost", "uncorrectable_ecc")


def bypasses_breaker(r: Remediation) -> bool:
    """Whether the circuit breaker lets the remediation through uncounted: a GPU that failed (an Xid,
    off the bus, an uncorrectable memory error) is a fact, not a prediction, and its node goes
    whatever the window holds. The breaker guards predictions (a model bug must not drain a
    cluster) and the failures one shared cause can show on every node at once (ports down, NVML
    not answering, silences)."""
    return r.evidence.startswith(_GPU_FACTS)


def remediation_for(
    alert: apb.Alert, job: str, *, requeue: bool, checkpoint_uri: str, also_requeue: Sequence[str] = ()
) -> Remediation:
    """The remediation of the alert's node; `requeue` False for a job that replaces its nodes itself;
    `also_requeue`: the other jobs on a failed node that are requeued with it."""
    return Remediation(
        alert_id=alert.opened_id,
        node=alert.node,
        gpu=alert.gpu,
        mode=mode_of(alert),
        risk=alert.risk,
        job_id=job,
        requeue=requeue,
        checkpoint_uri=checkpoint_uri,
        evidence=evidence_of(alert),
        also_requeue=tuple(also_requeue),
    )


def jobs_moved(
    jobs: Sequence[str], replacing: Collection[str], *, failed: bool, own: str = ""
) -> tuple[str, bool, tuple[str, ...]]:
    """Which of the node's registered `jobs` (sorted) a drain moves: (the alert's job, whether it
    is requeued, the others requeued with it). `own`: the job that acknowledged, when one did. A
    prediction moves one job (the one that acknowledged, else the first); a failure that happened
    moves every job on the node, each by its own policy: a job in `replacing` replaces its nodes
    itself and is not requeued."""
    job = own or (jobs[0] if jobs else "")
    others = [j for j in jobs if j != job and j not in replacing] if failed else []
    return job, job not in replacing, tuple(others)


def queued_answer(actuator: str, r: Remediation) -> str:
    """What the job is told once its remediation is queued."""
    if r.handover_to:
        return f"{actuator}: drain {r.node} and hand job {r.job_id} over to standby {r.handover_to}"
    if not r.requeue:
        return f"{actuator}: drain {r.node}; job {r.job_id} replaces the node itself"
    return f"{actuator}: drain {r.node} and requeue job {r.job_id}"


def answer_again(opened_id: int, outcome: str, detail: str, stored: Remediation | None, actuator: str) -> str:
    """What a repeated acknowledgement is told: the decision made the first time (a job that hears
    it again must hold again, not train on beside a standby or a requeue; one refused hears the
    refusal again). `stored`: the claimed request, None when it cannot be read."""
    if outcome == "refused":
        return f"refused: {detail}; alert {opened_id} is not remediated; the operator decides"
    doing = "being remediated" if outcome == "pending" else "already remediated"
    if stored is None or (not stored.requeue and not stored.handover_to):
        return f"alert {opened_id} is {doing}"
    if stored.handover_to:
        what = f"drain {stored.node} and hand job {stored.job_id} over to standby {stored.handover_to}"
    else:
        what = f"drain {stored.node} and requeue job {stored.job_id}"
    return f"{actuator}: {what} (alert {opened_id} is {doing})"


# -- the circuit breaker ----------------------------------------------------------------------


def refusal(
    paused_by: str | None, breaker: CircuitBreaker, node: str, now: float, *, fact: bool = False
) -> str | None:
    """None when `node` may go now (the breaker counts it); else why not. The breaker counts a node
    once, at its first attempt: a retry takes out no more nodes, and must not be refused because the
    window moved on meanwhile. `fact`: a failure with hardware evidence (`bypasses_breaker`), which
    only a pause holds back and the breaker neither refuses nor counts."""
    if paused_by is not None:
        return f"remediation paused by {paused_by}; {node} left in service"
    if fact:
        return None
    if not breaker.allow(node, now):
        return (
            f"circuit breaker: {breaker.max_nodes} nodes already taken out in "
            f"{breaker.window_s:.0f} s; {node} left in service"
        )
    return None


def would_admit(breaker: CircuitBreaker, node: str, now: float) -> bool:
    """Whether the circuit breaker would let `node` go now (without counting it)."""
    return not breaker.is_open(now) or any(n == node for _, n in breaker.admissions(now))


def window_on_disk(taken: list[tuple[float, str]], now: float, wall: float) -> list[list[float | str]]:
    """The breaker's admissions in wall-clock time (what the next process reads)."""
    return [[round(wall - (now - at), 3), node] for at, node in taken]


def window_from_disk(saved: object, now: float, wall: float) -> list[tuple[float, str]]:
    """The admissions an earlier run wrote (`window_on_disk`), in this process's clock time."""
    admissions = []
    for entry in saved if isinstance(saved, list) else []:
        match entry:
            case [int() | float() as at, str() as node]:
                # A wall clock set back since makes an admission count from now: longer, not shorter.
                admissions.append((now - max(0.0, wall - at), node))
    return admissions


# -- attempts ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an attempt's result leads to: the remediation's outcome ("ok", "failed") with its
    detail, or "retry" (after the retry policy's backoff)."""

    outcome: str
    detail: str


def attempt_verdict(ok: bool, detail: str, attempts: int, max_attempts: int) -> Verdict:
    if ok:
        return Verdict("ok", detail if attempts == 1 else f"{detail} (on attempt {attempts})")
    if attempts >= max_attempts:
        return Verdict("failed", f"{detail}; gave up after {plural(attempts, 'attempt')}")
    return Verdict("retry", detail)


def given_up(attempts: int, max_attempts: int, last: str) -> str | None:
    """Why a remediation an earlier run left unfinished is failed at once (every attempt was made),
    or None when it is carried on."""
    if attempts < max_attempts:
        return None
    last = last or "no outcome stored"
    return f"{last}; gave up after {plural(attempts, 'attempt')} (the last cut off by a restart)"
