"""The prescheduler (service/remediation/spares/prescheduler.py): when a spare is asked for, when it
counts as ready, what a standby is told, and when the spare is given back. The provider here is a recording one (the
scheduler's side is tested on real Slurm in tests/test_slurm.py and end to end in
tests/test_handover_e2e.py); the standby's long poll runs on a real thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Outcome
from faultcast.service.remediation.spares.prescheduler import (
    HandOverReply,
    Prepared,
    Prescheduler,
    SpareRequest,
    SpareState,
    StandbyRefused,
)
from faultcast.v1 import alerts_pb2 as apb

JOBS = {"job-1": ["node-a", "node-b"], "job-2": ["node-c"]}
WAIT_S = 10.0


class RecordingProvider:
    """Answers as told and records every call; `hold` keeps prepare() waiting until set."""

    name = "recording"

    def __init__(self, ok: bool = True, *, standby_job: str = "") -> None:
        """`standby_job`: the job id each standby runs under (empty: the handle, "standby-<alert>")."""
        self.ok, self.standby_job = ok, standby_job
        self.prepared: list[SpareRequest] = []
        self.released: list[tuple[str, str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.preparing = threading.Event()

    def prepare(self, request: SpareRequest) -> Prepared:
        self.preparing.set()
        self.hold.wait(WAIT_S)
        self.prepared.append(request)
        if not self.ok:
            return Prepared(False, "", "the scheduler has no spare node")
        return Prepared(True, f"standby-{request.alert_id}", "asked", standby_job=self.standby_job)

    def release(self, request: SpareRequest, handle: str, why: str) -> Outcome:
        self.released.append((handle, why))
        return Outcome(True, "released")


@pytest.fixture
def provider() -> RecordingProvider:
    return RecordingProvider()


@pytest.fixture
def metrics() -> ServiceMetrics:
    return ServiceMetrics()


@pytest.fixture
def prescheduler(provider: RecordingProvider, metrics: ServiceMetrics) -> Iterator[Prescheduler]:
    # The scheduler is told at once here; the delay a standby gets to exit by itself has its own test.
    running = _standing_by(Prescheduler(provider, lambda: JOBS, metrics, give_back_after_s=0.0))
    running.start()
    yield running
    running.stop()


def _standing_by(prescheduler: Prescheduler) -> Prescheduler:
    """Both jobs registered as able to stand by (their trainers use Protection)."""
    for job in JOBS:
        prescheduler.note_job(job, stands_by=True)
    return prescheduler


def _alert(opened: int, node: str, *, state: int = apb.ALERT_STATE_OPEN, reason: int = 0) -> apb.Alert:
    return apb.Alert(
        id=opened + 100 if state == apb.ALERT_STATE_CLEARED else opened,
        opened_id=opened,
        node=node,
        gpu=2,
        state=state,  # type: ignore[arg-type]  # an int of the enum
        clear_reason=reason,  # type: ignore[arg-type]
        risk=0.4,
        mode=apb.FAILURE_MODE_HBM_WEAR,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY,
    )


def _count(metrics: ServiceMetrics, event: str) -> float:
    value = metrics.registry.get_sample_value("faultcast_spares_total", {"event": event})
    return value or 0.0


def _until(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polling another thread's progress, bounded by the deadline


def _claim(prescheduler: Prescheduler, job: str) -> str:
    """The claim the service issued with the job's spare (what the provider puts in its standby's
    environment)."""
    spare = prescheduler.spare_of(job)
    assert spare is not None
    return spare.request.claim


def _ask(
    prescheduler: Prescheduler, job: str, own: str, wait_s: float = 0.0, *, alert_id: int = 0
) -> HandOverReply:
    """The job's standby asks, with its spare's claim and the job id `own`."""
    claim = _claim(prescheduler, job) if prescheduler.spare_of(job) is not None else ""
    return prescheduler.await_hand_over(job, own, "node-z", wait_s, alert_id=alert_id, claim=claim)


def _standby(
    prescheduler: Prescheduler, job: str, own: str = "standby-1"
) -> tuple[threading.Thread, list[HandOverReply]]:
    """A standby's long poll on its own thread; its answer lands in the returned list."""
    answers: list[HandOverReply] = []
    thread = threading.Thread(target=lambda: answers.append(_ask(prescheduler, job, own, WAIT_S)))
    thread.start()
    _until("the standby to wait", lambda: (s := prescheduler.spare_of(job)) is not None and s.waiting == 1)
    return thread, answers


def test_an_alert_on_a_jobs_node_asks_for_one_spare_and_others_ask_nothing(
    prescheduler: Prescheduler, provider: RecordingProvider, metrics: ServiceMetrics
) -> None:
    prescheduler.on_alerts([_alert(1, "node-b"), _alert(2, "node-a"), _alert(3, "node-x")])
    prescheduler.drain_calls()
    assert [(r.job_id, r.node, r.alert_id, r.mode) for r in provider.prepared] == [
        ("job-1", "node-b", 1, "hbm_wear")
    ]
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert spare.state == SpareState.ASKED
    assert spare.handle == "standby-1"
    assert prescheduler.spare_of("job-2") is None
    assert _count(metrics, "asked") == 1


def test_a_waiting_standby_is_told_to_go_on_from_the_snapshot(
    prescheduler: Prescheduler, metrics: ServiceMetrics
) -> None:
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()
    thread, answers = _standby(prescheduler, "job-1")
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert spare.state.value == "ready"  # (by value: mypy would keep the narrowing past hand_over)
    assert spare.standby_job == "standby-1"  # the job id the provider named

    handed = prescheduler.hand_over("job-1", 1, 35, "file:///ckpt/step-35")
    thread.join(WAIT_S)

    assert handed is spare
    assert answers == [HandOverReply(apb.HAND_OVER_STATE_GO, 1, 35, "file:///ckpt/step-35")]
    assert spare.state == SpareState.HANDED_OVER
    # Asked again (a reconnect), the standby hears the same word.
    again = _ask(prescheduler, "job-1", "standby-1")
    assert again.state == apb.HAND_OVER_STATE_GO
    assert (_count(metrics, "ready"), _count(metrics, "handed_over")) == (1, 1)


def test_no_standby_waiting_at_the_snapshot_releases_the_spare_and_keeps_todays_path(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()

    assert prescheduler.hand_over("job-1", 1, 35, "file:///ckpt/step-35") is None
    prescheduler.drain_calls()

    assert provider.released == [("standby-1", "no standby waiting at the snapshot")]
    late = _ask(prescheduler, "job-1", "standby-1")  # it came after all
    assert late.state == apb.HAND_OVER_STATE_RELEASED


def test_a_standby_that_stopped_asking_is_not_handed_the_job(prescheduler: Prescheduler) -> None:
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()
    _ask(prescheduler, "job-1", "standby-1")  # ready once, then gone

    assert prescheduler.hand_over("job-1", 1, 35, "file:///ckpt/step-35") is None


def test_a_false_alarm_releases_the_spare_and_its_standby_hears_why(
    prescheduler: Prescheduler, provider: RecordingProvider, metrics: ServiceMetrics
) -> None:
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()
    thread, answers = _standby(prescheduler, "job-1")

    prescheduler.on_alerts(
        [_alert(1, "node-a", state=apb.ALERT_STATE_CLEARED, reason=apb.CLEAR_REASON_RISK_FELL)]
    )
    thread.join(WAIT_S)
    prescheduler.drain_calls()

    assert answers[0].state == apb.HAND_OVER_STATE_RELEASED
    assert "risk fell" in answers[0].reason
    assert provider.released == [("standby-1", answers[0].reason)]
    assert _count(metrics, "released") == 1
    # The next alert on the job asks for a new spare.
    prescheduler.on_alerts([_alert(5, "node-b")])
    prescheduler.drain_calls()
    assert [r.alert_id for r in provider.prepared] == [1, 5]


def test_a_released_standby_that_heard_it_gets_time_to_exit_before_the_scheduler_ends_it(
    provider: RecordingProvider, metrics: ServiceMetrics
) -> None:
    prescheduler = _standing_by(Prescheduler(provider, lambda: JOBS, metrics, give_back_after_s=600.0))
    prescheduler.start()
    try:
        prescheduler.on_alerts([_alert(1, "node-a")])
        prescheduler.drain_calls()
        thread, answers = _standby(prescheduler, "job-1")
        assert prescheduler.release("job-1", "a false alarm")
        thread.join(WAIT_S)
        prescheduler.drain_calls()
        assert answers[0].state == apb.HAND_OVER_STATE_RELEASED
        assert provider.released == []  # not yet: the standby exits by itself first
        # One nobody waits for is given back at once.
        prescheduler.on_alerts([_alert(2, "node-c")])
        prescheduler.drain_calls()
        assert prescheduler.release("job-2", "a false alarm")
        prescheduler.drain_calls()
        assert provider.released == [("standby-2", "a false alarm")]
    finally:
        prescheduler.stop()


def test_a_gpu_gone_dark_before_any_snapshot_releases_the_spare(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()
    dark = _alert(1, "node-a", state=apb.ALERT_STATE_CLEARED, reason=apb.CLEAR_REASON_GPU_DARK)
    dark.cleared_reason = "gpu dark"
    prescheduler.on_alerts([dark])
    prescheduler.drain_calls()
    assert provider.released == [("standby-1", "the alert cleared: gpu dark")]


def test_a_job_whose_trainer_cannot_stand_by_gets_no_spare(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    # A Lightning or Hugging Face job (or an old client) registers without stands_by: a copy of it
    # started on a spare would train from its newest checkpoint beside the original.
    prescheduler.note_job("job-2", stands_by=False)
    prescheduler.on_alerts([_alert(1, "node-c")])
    prescheduler.drain_calls()
    assert provider.prepared == []
    assert prescheduler.spare_of("job-2") is None


def test_a_refused_request_fails_the_spare_and_a_standby_is_let_go(
    metrics: ServiceMetrics,
) -> None:
    provider = RecordingProvider(ok=False)
    prescheduler = _standing_by(Prescheduler(provider, lambda: JOBS, metrics))
    prescheduler.start()
    try:
        prescheduler.on_alerts([_alert(1, "node-a")])
        prescheduler.drain_calls()
        spare = prescheduler.spare_of("job-1")
        assert spare is not None
        assert spare.state == SpareState.FAILED
        reply = _ask(prescheduler, "job-1", "standby-1")
        assert reply.state == apb.HAND_OVER_STATE_RELEASED
        assert reply.reason == "the scheduler has no spare node"
        assert prescheduler.hand_over("job-1", 1, 35, "file:///x") is None
        assert _count(metrics, "failed") == 1
    finally:
        prescheduler.stop()


def test_a_standby_of_an_earlier_alert_is_let_go(prescheduler: Prescheduler) -> None:
    prescheduler.on_alerts([_alert(7, "node-a")])
    prescheduler.drain_calls()
    stale = prescheduler.await_hand_over("job-1", "old-standby", "node-z", 0.0, alert_id=3)
    assert stale.state == apb.HAND_OVER_STATE_RELEASED
    assert "started for alert 3" in stale.reason
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert spare.state == SpareState.ASKED  # the spare still waits for its own standby
    own = _ask(prescheduler, "job-1", "standby-7", alert_id=7)
    assert own.state == apb.HAND_OVER_STATE_WAITING


def test_standbys_nobody_asked_for_are_let_go(prescheduler: Prescheduler) -> None:
    stray = prescheduler.await_hand_over("job-9", "standby-x", "node-z", 0.0)
    assert stray.state == apb.HAND_OVER_STATE_RELEASED
    assert "no spare was asked for job job-9" in stray.reason


@pytest.mark.parametrize("claim", ["", "a-guess", "claim-of-the-other-spare"])
def test_a_caller_without_the_spares_claim_is_refused_and_changes_nothing(
    prescheduler: Prescheduler, claim: str
) -> None:
    # The squat: the job's own identity (or anyone) asks first, naming a job id of its choosing.
    prescheduler.on_alerts([_alert(1, "node-a"), _alert(2, "node-c")])
    prescheduler.drain_calls()
    if claim == "claim-of-the-other-spare":
        claim = _claim(prescheduler, "job-2")
    with pytest.raises(StandbyRefused) as refused:
        prescheduler.await_hand_over("job-1", "standby-1", "node-z", 0.0, claim=claim)
    assert refused.value.reason == "standby_claim"
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert (spare.state, spare.standby_job, spare.waiting) == (SpareState.ASKED, "", 0)
    # The real standby is not released: it waits, and the job is handed over to it.
    thread, answers = _standby(prescheduler, "job-1")
    prescheduler.hand_over("job-1", 1, 35, "file:///ckpt/step-35")
    thread.join(WAIT_S)
    assert [a.state for a in answers] == [apb.HAND_OVER_STATE_GO]
    assert spare.standby_job == "standby-1"


def test_the_claim_does_not_let_a_standby_name_its_own_job_id(prescheduler: Prescheduler) -> None:
    # Whoever reads the standby's environment has the claim; the job id is still the scheduler's.
    prescheduler.on_alerts([_alert(1, "node-a")])
    prescheduler.drain_calls()
    with pytest.raises(StandbyRefused) as refused:
        _ask(prescheduler, "job-1", "job-2")
    assert refused.value.reason == "standby_job"
    assert "runs as job 'standby-1'" in str(refused.value)
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert (spare.state, spare.standby_job) == (SpareState.ASKED, "")
    assert prescheduler.hand_over("job-1", 1, 35, "file:///ckpt/step-35") is None  # nobody to hand to


def test_before_the_scheduler_named_the_standby_nobody_takes_the_spare(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    provider.hold.clear()
    prescheduler.on_alerts([_alert(1, "node-a")])
    assert provider.preparing.wait(WAIT_S)
    early = _ask(prescheduler, "job-1", "standby-1")
    assert early.state == apb.HAND_OVER_STATE_WAITING
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert (spare.state, spare.standby_job) == (SpareState.ASKED, "")
    provider.hold.set()
    prescheduler.drain_calls()
    assert _ask(prescheduler, "job-1", "standby-1").state == apb.HAND_OVER_STATE_WAITING
    assert spare.standby_job == "standby-1"


def test_every_spare_gets_a_claim_of_its_own_that_no_log_line_shows(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    prescheduler.on_alerts([_alert(1, "node-a"), _alert(2, "node-c")])
    prescheduler.drain_calls()
    claims = [r.claim for r in provider.prepared]
    assert len(set(claims)) == 2
    assert all(len(c) >= 32 for c in claims)
    assert all(c not in repr(r) for c, r in zip(claims, provider.prepared, strict=True))


def test_a_spare_released_while_the_scheduler_was_asked_is_given_back_once_it_exists(
    prescheduler: Prescheduler, provider: RecordingProvider
) -> None:
    provider.hold.clear()
    prescheduler.on_alerts([_alert(1, "node-a")])
    assert provider.preparing.wait(WAIT_S)
    assert prescheduler.release("job-1", "the job declined the alert")
    provider.hold.set()
    prescheduler.drain_calls()
    prescheduler.drain_calls()  # the give-back queued by the prepare that finished
    assert provider.released == [("standby-1", "the job declined the alert")]
    spare = prescheduler.spare_of("job-1")
    assert spare is not None
    assert spare.state == SpareState.RELEASED
