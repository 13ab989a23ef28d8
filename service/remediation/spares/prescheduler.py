"""Pre-scheduling: the replacement is readied while the doomed node still works, and takes over at
the snapshot.

When an alert opens on a node of a registered job, the service asks the scheduler for a replacement
before anything is drained (a `SpareProvider`: a standby job on Slurm, a placeholder pod on
Kubernetes, an event through the webhook). The replacement's trainer starts during the lead
(imports, model construction, the newest periodic checkpoint) and calls AwaitHandOver naming the job
it stands by for: that call is how the service knows a spare is ready, on any scheduler. At the job's
SNAPSHOT_DONE the remediator asks `hand_over`: with a standby waiting, the standby is told to go on
from that snapshot and the doomed node is drained while the old job ends (no requeue); without one,
the spare is released and today's path (drain and requeue) runs. A false alarm (the risk fell back)
releases the spare; so does a remediation that came by the grace timer, without a snapshot.

One spare per job at a time, asked for by the first alert on any of its nodes; the provider's calls
(seconds, on a busy scheduler) run on this module's own thread, never on the scoring thread.

Who may stand by is the service's decision, never the caller's. Each spare is asked for with a claim
(a secret the provider puts in the standby's environment, FAULTCAST_STANDBY_CLAIM) and the provider
names the job id its standby will run under (the standby job's id on Slurm, the pod's name on
Kubernetes); an AwaitHandOver without the spare's claim, or naming another job id, is refused and
changes nothing. The job is handed over only to that named identity, and a job's credentials act for
its standby only along such hand-overs (the remediation ledger's `predecessors`), so no trainer can
make itself another job's standby, and no one without the claim can take a spare's place.
"""

from __future__ import annotations

import enum
import functools
import hmac
import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from faultcast.service.alert_events import mode_of
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Outcome
from faultcast.service.remediation.policy import RISK_FELL  # a false alarm: its spare has nothing to do
from faultcast.service.state.settings import Settings
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# What a standby's environment carries (every provider sets them; faultcast.client.standby reads the first).
STANDBY_FOR = "FAULTCAST_STANDBY_FOR"  # the job it stands by for
STANDBY_ALERT = "FAULTCAST_STANDBY_ALERT"  # the alert that asked for it: the standby names it when it asks
STANDBY_CLAIM = "FAULTCAST_STANDBY_CLAIM"  # the spare's claim: the secret its standby proves itself with
JOB_ID_ENV = "FAULTCAST_JOB_ID"  # the trainer's job id where its scheduler sets none (client/identity.py)
# The longest a standby's AwaitHandOver is held before it is answered "waiting" (it asks again).
MAX_WAIT_S = 30.0
# Calls held at once per spare (a standby asks from one rank; two cover a reconnect's overlap):
# more are answered "waiting" at once, so no caller can pin the service's threads with them.
MAX_HELD = 2
# A released standby that was waiting hears it and exits by itself; the scheduler ends it only after.
GIVE_BACK_AFTER_S = 10.0


@dataclass(frozen=True, slots=True)
class SpareRequest:
    """What the scheduler is asked for: a replacement for `job_id`, away from `node`."""

    alert_id: int  # the alert (its opened id) that asked for it
    job_id: str
    node: str  # the doomed node: the replacement must not land there
    gpu: int
    mode: str
    risk: float
    # The secret the standby must present (the provider puts it in its environment as STANDBY_CLAIM;
    # never in a command line, a log or a label).
    claim: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class Prepared:
    """How a request to the scheduler went: `handle` names the replacement there (a standby job id,
    a pod name, an event id) for `release`; `standby_job` is the job id its standby will run and
    register under (empty: the handle), the only identity the job may be handed over to."""

    ok: bool
    handle: str
    detail: str
    standby_job: str = ""


class SpareProvider(Protocol):
    """Readies a replacement on a scheduler. Both calls report expected failures in their result,
    never as exceptions, and must be safe to repeat. `prepare` gives the standby the request's
    claim in its environment (STANDBY_CLAIM) and says which job id the standby runs under."""

    name: str

    def prepare(self, request: SpareRequest) -> Prepared:
        """Ask the scheduler for the replacement and start the job's standby there."""

    def release(self, request: SpareRequest, handle: str, why: str) -> Outcome:
        """Give the replacement back (a false alarm, or it was not ready in time)."""


class SpareState(enum.Enum):
    ASKED = "asked"  # the provider is asked (or was); no standby has called yet
    READY = "ready"  # a standby is waiting in AwaitHandOver
    RESERVED = "reserved"  # chosen at a snapshot; the hand-over is being claimed on disk
    HANDED_OVER = "handed_over"  # the standby was told to go on from the snapshot
    RELEASED = "released"  # given back: a false alarm, or not ready at the snapshot
    FAILED = "failed"  # the scheduler refused it


@dataclass
class Spare:
    """One job's replacement, from the request to its end (times on the service's clock)."""

    request: SpareRequest
    asked_at: float
    state: SpareState = SpareState.ASKED
    handle: str = ""
    detail: str = ""
    ready_at: float | None = None  # the standby's first AwaitHandOver
    named_job: str = ""  # the job id the provider said its standby runs under ("" until it answered)
    standby_job: str = ""  # the standby's own job id (the named one) and node, once it called
    standby_node: str = ""
    waiting: int = 0  # AwaitHandOver calls held right now: a standby alive at this moment
    step: int = 0  # the hand-over: the snapshot's step and where it is
    checkpoint_uri: str = ""
    why: str = ""  # why it was released or failed

    @property
    def open(self) -> bool:
        return self.state in (SpareState.ASKED, SpareState.READY)


class KeptSpares(Protocol):
    """Where the spares are kept for the next process (the state store's settings): a spare the
    scheduler readied outlives a restart of the service, and so must the service's word on it."""

    def load(self) -> str | None:
        """What `save` last wrote (None: nothing)."""

    def save(self, value: str | None) -> None:
        """Keep `value`; raises when the store refuses."""


class SpareSetting:
    """The spares kept in the state store's settings (`KeptSpares`)."""

    KEY = "prescheduled_spares"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def load(self) -> str | None:
        return self.settings.get(self.KEY)

    def save(self, value: str | None) -> None:
        self.settings.save(self.KEY, value)


# The spares a restart takes back: those a standby may still ask about. One released or failed is
# over (its standby heard it, or hears "no spare" and exits).
_KEPT_STATES = (SpareState.ASKED, SpareState.READY, SpareState.RESERVED, SpareState.HANDED_OVER)


def spares_to_json(spares: Sequence[Spare]) -> str | None:
    """The spares worth keeping, as JSON (None when none is)."""
    kept = [
        {
            "request": asdict(s.request),
            # A reservation not yet recorded is undone by a restart: its standby waits on.
            "state": (SpareState.READY if s.state == SpareState.RESERVED else s.state).value,
            "handle": s.handle,
            "named_job": s.named_job,
            "standby_job": s.standby_job,
            "standby_node": s.standby_node,
            "step": s.step,
            "checkpoint_uri": s.checkpoint_uri,
        }
        for s in spares
        if s.state in _KEPT_STATES
    ]
    return json.dumps(kept) if kept else None


def spares_from_json(raw: str, now: float) -> list[Spare]:
    """The spares `spares_to_json` kept; ValueError or TypeError when the text is not such a list.
    A spare that was ready is taken back as asked: its standby is ready again when it next asks."""
    spares = []
    for kept in json.loads(raw):
        state = SpareState(kept["state"])
        spare = Spare(
            SpareRequest(**kept["request"]),
            asked_at=now,
            state=SpareState.ASKED if state == SpareState.READY else state,
            handle=str(kept["handle"]),
            named_job=str(kept["named_job"]),
            standby_job=str(kept["standby_job"]),
            standby_node=str(kept["standby_node"]),
            step=int(kept["step"]),
            checkpoint_uri=str(kept["checkpoint_uri"]),
        )
        if spare.state not in _KEPT_STATES or not isinstance(spare.request.claim, str):
            raise ValueError(f"a kept spare of job {spare.request.job_id} in state {state.value}")
        spares.append(spare)
    return spares


class StandbyRefused(Exception):  # noqa: N818 (a refusal with its reason, as AuthError)
    """An AwaitHandOver that may not speak for the spare: no claim, another spare's, or another job id
    than the one the service named. `reason` labels faultcast_auth_denied_total."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HandOverReply:
    """What a standby is told: wait, go on from this snapshot, or exit (released)."""

    state: apb.HandOverState.ValueType
    alert_id: int = 0
    step: int = 0
    checkpoint_uri: str = ""
    reason: str = ""


class Prescheduler:
    """Asks `provider` for a replacement when an alert opens on a registered job's node, tracks the
    standby that answers, and hands the job over at its snapshot (see the module's docstring)."""

    def __init__(
        self,
        provider: SpareProvider,
        jobs: Callable[[], dict[str, list[str]]],
        metrics: ServiceMetrics,
        *,
        clock: Clock = time.monotonic,
        give_back_after_s: float = GIVE_BACK_AFTER_S,
        kept: KeptSpares | None = None,
    ) -> None:
        """`jobs`: the registered jobs and their nodes (the state store's), read when an alert opens.
        `give_back_after_s`: how long a released standby that heard it is given to exit by itself
        before the scheduler is told to end it. `kept`: where the spares are kept across restarts
        (None: in memory only); those an earlier run kept are taken back here."""
        self.provider, self.jobs, self.metrics, self.clock = provider, jobs, metrics, clock
        self.give_back_after_s = give_back_after_s
        self.kept = kept
        self._spares: dict[str, Spare] = {}  # job id -> its newest spare
        self._keep_lock = threading.Lock()  # one writer of the kept spares at a time, newest last
        # Jobs whose trainer registered as able to stand by (kept in memory: a guard registers again
        # on every connect, so a restarted service hears it again).
        self._stands_by: set[str] = set()
        self._asked: set[int] = set()  # alerts (opened ids) a spare was asked for: one each
        self._stopping = False
        self._cv = threading.Condition()
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._take_back()

    # -- what a restart keeps -------------------------------------------------------------------

    def _take_back(self) -> None:
        """The spares an earlier run kept: the scheduler still runs their standbys, which ask again
        with the same claim (and one told to go hears it again)."""
        raw = self.kept.load() if self.kept is not None else None
        if raw is None:
            return
        try:
            spares = spares_from_json(raw, self.clock())
        except (ValueError, TypeError, KeyError) as exc:
            log.error("the spares an earlier run kept are unreadable (%s); going on without them", exc)
            return
        for spare in spares:
            self._spares[spare.request.job_id] = spare
            self._asked.add(spare.request.alert_id)
        log.info("took back %d spare(s) an earlier run readied", len(spares))

    def _keep(self) -> None:
        """Write the spares worth keeping; a refusal loses only what a restart would take back."""
        if self.kept is None:
            return
        with self._keep_lock:
            with self._cv:
                value = spares_to_json(list(self._spares.values()))
            try:
                self.kept.save(value)
            except Exception as exc:
                log.warning("the spares could not be kept for a restart: %s", exc)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread that calls the provider."""
        self._thread = threading.Thread(target=self._run, name="faultcast-spares", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Answer every waiting standby "waiting" (it asks the next service) and stop the thread;
        spares are not released: the scheduler keeps them until a service decides."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._calls.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call()
            except Exception:  # a provider bug must not stop the next request
                log.exception("spare provider %s failed", self.provider.name)

    def drain_calls(self) -> None:
        """Block until the provider calls queued so far have run (tests and benchmarks)."""
        done = threading.Event()
        self._calls.put(done.set)
        done.wait()

    # -- alerts -----------------------------------------------------------------------------------

    def on_alerts(self, alerts: Sequence[apb.Alert]) -> None:
        """A listener on the alert book: ask for a spare when an alert opens on a registered job's
        node (one per job at a time); release it when that alert turns out a false alarm."""
        for alert in alerts:
            key = alert.opened_id or alert.id
            if alert.state == apb.ALERT_STATE_CLEARED:
                # A false alarm; or the GPU went dark or the node silent before any snapshot came
                # (the job crashed, or goes the usual way): the spare has nothing to take over.
                why = "its risk fell back" if alert.clear_reason in RISK_FELL else alert.cleared_reason
                self._release_for_alert(key, f"the alert cleared: {why or 'cleared'}")
                continue
            if alert.state != apb.ALERT_STATE_OPEN:
                continue
            job = self._job_on(alert.node)
            if not job:
                continue
            with self._cv:
                if job not in self._stands_by:
                    continue  # its trainer cannot take a spare over: a copy would train beside it
                if key in self._asked:
                    continue  # one spare per alert: its updates, a decline or a refusal ask no more
                spare = self._spares.get(job)
                if spare is not None and (spare.open or spare.state == SpareState.RESERVED):
                    continue  # the job has one coming, or waiting
                self._asked.add(key)
                request = SpareRequest(
                    key,
                    job,
                    alert.node,
                    alert.gpu,
                    mode_of(alert),
                    alert.risk,
                    claim=secrets.token_urlsafe(32),
                )
                spare = Spare(request, asked_at=self.clock())
                self._spares[job] = spare
            self._count("asked")
            self._keep()
            self._calls.put(functools.partial(self._prepare, spare))

    def note_job(self, job_id: str, *, stands_by: bool) -> None:
        """A job registered (RegisterJob): whether its trainer can stand by on a spare."""
        with self._cv:
            if stands_by:
                self._stands_by.add(job_id)
            else:
                self._stands_by.discard(job_id)

    def _job_on(self, node: str) -> str:
        for job, nodes in sorted(self.jobs().items()):
            if node in nodes:
                return job
        return ""

    def _prepare(self, spare: Spare) -> None:
        if not spare.open:
            return  # released before the scheduler was even asked
        prepared = self.provider.prepare(spare.request)
        with self._cv:
            spare.handle, spare.detail = prepared.handle, prepared.detail
            if prepared.ok:
                spare.named_job = prepared.standby_job or prepared.handle
            if not prepared.ok and spare.open:
                self._end(spare, SpareState.FAILED, prepared.detail)
                failed = True
            else:
                failed = False
            released = spare.state == SpareState.RELEASED
        self._keep()
        if failed:
            self._count("failed")
            log.warning("no spare for job %s: %s", spare.request.job_id, prepared.detail)
            return
        log.info("spare for job %s asked (%s): %s", spare.request.job_id, self.provider.name, prepared.detail)
        if released and prepared.ok:  # released while the scheduler was being asked
            self._calls.put(lambda: self._give_back(spare))

    def _release_for_alert(self, alert_id: int, why: str) -> None:
        with self._cv:
            spares = [s for s in self._spares.values() if s.request.alert_id == alert_id and s.open]
        for spare in spares:
            self.release(spare.request.job_id, why)

    def release(self, job_id: str, why: str) -> bool:
        """Give back the job's spare, if one is open; False when there was none."""
        with self._cv:
            spare = self._spares.get(job_id)
            if spare is None or not spare.open:
                return False
            self._end(spare, SpareState.RELEASED, why)
            asked = bool(spare.handle)
            heard = spare.waiting > 0  # a standby held right now hears "released" and exits itself
        self._count("released")
        self._keep()
        log.info("spare for job %s released: %s", job_id, why)
        if asked and heard and self.give_back_after_s > 0:
            # Its own exit first (status 75, its log says why); the scheduler's cancel after, for
            # one that does not go.
            later = threading.Timer(
                self.give_back_after_s, lambda: self._calls.put(lambda: self._give_back(spare))
            )
            later.daemon = True
            later.start()
        elif asked:
            self._calls.put(lambda: self._give_back(spare))
        return True

    def _give_back(self, spare: Spare) -> None:
        outcome = self.provider.release(spare.request, spare.handle, spare.why)
        if not outcome.ok:
            log.warning(
                "releasing spare %s of job %s: %s", spare.handle, spare.request.job_id, outcome.detail
            )

    def _end(self, spare: Spare, state: SpareState, why: str) -> None:
        """Move the spare to a final state and wake its standby (the condition held)."""
        spare.state, spare.why = state, why
        self._cv.notify_all()

    # -- the hand-over --------------------------------------------------------------------------

    def hand_over(self, job_id: str, alert_id: int, step: int, checkpoint_uri: str) -> Spare | None:
        """`reserve` then `go` at once (callers with nothing to record in between)."""
        spare = self.reserve(job_id, checkpoint_uri)
        if spare is not None and spare.state == SpareState.RESERVED:
            self.go(spare, alert_id, step, checkpoint_uri)
        return spare

    def reserve(self, job_id: str, checkpoint_uri: str) -> Spare | None:
        """At the job's SNAPSHOT_DONE: choose its standby if one is waiting at this moment (the
        spare then can no longer be released, and its standby keeps waiting) and return the spare;
        the caller records the hand-over, then calls `go` (or `unreserve`). None, and the spare
        released, when no standby is waiting. A spare handed over already is returned as it is."""
        with self._cv:
            spare = self._spares.get(job_id)
            if spare is None:
                return None
            if spare.state == SpareState.HANDED_OVER:
                return spare  # the same acknowledgement again
            if spare.state != SpareState.READY or spare.waiting == 0 or not checkpoint_uri:
                why = "no standby waiting at the snapshot" if checkpoint_uri else "no snapshot to hand over"
            else:
                spare.state = SpareState.RESERVED
                return spare
        self.release(job_id, why)
        return None

    def unreserve(self, spare: Spare, why: str) -> None:
        """The hand-over could not be recorded: release the reserved spare (the job takes today's path)."""
        with self._cv:
            if spare.state != SpareState.RESERVED:
                return
            spare.state = SpareState.READY  # open again, so release() takes it
        self.release(spare.request.job_id, why)

    def go(self, spare: Spare, alert_id: int, step: int, checkpoint_uri: str) -> None:
        """Tell the reserved spare's standby to go on from this snapshot. The old job gets no
        other spare (it is being ended)."""
        with self._cv:
            if spare.state != SpareState.RESERVED:
                return
            spare.step, spare.checkpoint_uri = step, checkpoint_uri
            self._end(spare, SpareState.HANDED_OVER, f"hand-over for alert {alert_id}")
            self._stands_by.discard(spare.request.job_id)
        self._count("handed_over")
        self._keep()
        log.info(
            "job %s handed over to standby %s on %s at step %d",
            spare.request.job_id,
            spare.standby_job,
            spare.standby_node,
            step,
        )

    def arrive(
        self, standby_for: str, job_id: str, node: str, *, alert_id: int = 0, claim: str = ""
    ) -> HandOverReply | Spare:
        """A standby asks: a final answer at once (no spare, another standby's, an earlier alert's,
        not named yet, too many calls held, or handed over or released already), else its spare, now
        counted as held until `leave`: while held, the standby counts as alive, which is what
        `reserve` needs. Raises StandbyRefused, changing nothing, for a caller without the spare's
        claim or naming another job id than the one the provider named."""
        with self._cv:
            spare = self._spares.get(standby_for)
            if spare is None:
                return HandOverReply(
                    apb.HAND_OVER_STATE_RELEASED, reason=f"no spare was asked for job {standby_for}"
                )
            if alert_id and alert_id != spare.request.alert_id:
                return HandOverReply(
                    apb.HAND_OVER_STATE_RELEASED,
                    reason=f"this standby was started for alert {alert_id}, not for job {standby_for}'s "
                    "current spare",
                )
            if not claim or not hmac.compare_digest(claim.encode(), spare.request.claim.encode()):
                raise StandbyRefused(
                    "standby_claim",
                    f"no standby of job {standby_for} was started with this claim (FAULTCAST_STANDBY_CLAIM "
                    "in a standby's environment): only the spare the service asked for may wait for the "
                    "hand-over",
                )
            if spare.state in (SpareState.RELEASED, SpareState.FAILED):
                return self._reply(spare)
            if not spare.named_job:
                # The scheduler has not answered yet: nobody can be this spare's standby before it has.
                return HandOverReply(apb.HAND_OVER_STATE_WAITING, spare.request.alert_id)
            if job_id != spare.named_job:
                raise StandbyRefused(
                    "standby_job",
                    f"the spare of job {standby_for} runs as job {spare.named_job!r}, not {job_id!r}: a "
                    "standby waits under the job id its scheduler gave it",
                )
            first = spare.state == SpareState.ASKED
            if first:
                spare.state, spare.ready_at = SpareState.READY, self.clock()
                spare.standby_job, spare.standby_node = job_id, node
            if first:
                self._count("ready")
                log.info("standby %s on %s waits to take over job %s", job_id, node, standby_for)
                self._calls.put(self._keep)  # off the caller's thread (the event loop's, for the RPC)
            if not self._waits(spare) or spare.waiting >= MAX_HELD:
                return self._reply(spare)  # final, or answered at once: held calls are capped per spare
            spare.waiting += 1
            return spare

    def answer(self, spare: Spare) -> HandOverReply | None:
        """The held standby's answer once there is one (None while it should wait on)."""
        with self._cv:
            return None if self._waits(spare) else self._reply(spare)

    def leave(self, spare: Spare) -> HandOverReply:
        """The held call ends (answered, timed out, or cancelled by the standby): its answer now."""
        with self._cv:
            spare.waiting -= 1
            return self._reply(spare)

    def _waits(self, spare: Spare) -> bool:
        return spare.state in (SpareState.READY, SpareState.RESERVED) and not self._stopping

    def await_hand_over(
        self, standby_for: str, job_id: str, node: str, wait_s: float, *, alert_id: int = 0, claim: str = ""
    ) -> HandOverReply:
        """`arrive`, held on this thread up to `wait_s` (at most MAX_WAIT_S), then `leave`: the
        blocking form of the standby's call (the service's RPC waits on its event loop instead)."""
        deadline = self.clock() + max(0.0, min(wait_s, MAX_WAIT_S))
        arrived = self.arrive(standby_for, job_id, node, alert_id=alert_id, claim=claim)
        if isinstance(arrived, HandOverReply):
            return arrived
        with self._cv:
            try:
                while self._waits(arrived):
                    left = deadline - self.clock()
                    if left <= 0 or not self._cv.wait(left):
                        break
            finally:
                arrived.waiting -= 1
            return self._reply(arrived)

    @staticmethod
    def _reply(spare: Spare) -> HandOverReply:
        if spare.state == SpareState.HANDED_OVER:
            return HandOverReply(
                apb.HAND_OVER_STATE_GO, spare.request.alert_id, spare.step, spare.checkpoint_uri
            )
        if spare.state in (SpareState.RELEASED, SpareState.FAILED):
            return HandOverReply(apb.HAND_OVER_STATE_RELEASED, spare.request.alert_id, reason=spare.why)
        return HandOverReply(apb.HAND_OVER_STATE_WAITING, spare.request.alert_id)

    def spare_of(self, job_id: str) -> Spare | None:
        """The job's newest spare (for the remediator's words, tests and benchmarks)."""
        with self._cv:
            return self._spares.get(job_id)

    def _count(self, event: str) -> None:
        self.metrics.spares.labels(event).inc()
