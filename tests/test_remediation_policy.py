"""Remediation's decisions, without a store, an actuator, a thread or a clock
(service/remediation/policy.py): each rule is given its inputs, time included, and checked alone."""

from __future__ import annotations

from faultcast.service.remediation import policy
from faultcast.service.remediation.actuators import CircuitBreaker, Remediation
from faultcast.service.remediation.policy import GraceStep, GraceTimers
from faultcast.service.state.acks import Ack
from faultcast.v1 import alerts_pb2 as apb

MIGRATE = apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE


def _alert(**fields: object) -> apb.Alert:
    base: dict[str, object] = {
        "id": 7,
        "opened_id": 7,
        "node": "node-a",
        "gpu": 1,
        "state": apb.ALERT_STATE_OPEN,
        "action": MIGRATE,
        "risk": 0.9,
    }
    return apb.Alert(**{**base, **fields})  # type: ignore[arg-type]


def _remediation(**fields: object) -> Remediation:
    base: dict[str, object] = {
        "alert_id": 7,
        "node": "node-a",
        "gpu": 1,
        "mode": "hbm_wear",
        "risk": 0.9,
        "job_id": "job-1",
        "requeue": True,
    }
    return Remediation(**{**base, **fields})  # type: ignore[arg-type]


# -- grace timers -------------------------------------------------------------------------------


def test_a_grace_timer_is_due_at_its_deadline_and_not_before() -> None:
    timers = GraceTimers()
    timers.start(7, 160.0)
    timers.start(8, 130.0)
    assert timers.next_due() == 130.0
    assert timers.due(129.9) == []
    assert timers.due(160.0) == [8, 7]
    assert timers.running(7)
    assert timers.started(7)


def test_a_settled_timer_is_no_longer_running_but_stays_started() -> None:
    timers = GraceTimers()
    timers.start(7, 160.0)
    assert timers.take_dirty()
    timers.settle(7)
    assert not timers.running(7)
    assert timers.started(7)
    assert timers.take_dirty()
    timers.settle(7)  # nothing to forget: nothing to write
    assert not timers.take_dirty()


def test_restored_deadlines_are_not_written_again() -> None:
    timers = GraceTimers()
    timers.restore({"7": 1_000_030.0}, now=100.0, wall=1_000_000.0, grace_s=60.0)
    assert not timers.take_dirty()
    assert timers.due(129.9) == []
    assert timers.due(130.0) == [7]


def test_deadlines_go_to_disk_in_wall_clock_time_and_come_back() -> None:
    timers = GraceTimers()
    timers.start(7, 160.0)
    saved = timers.on_disk(now=100.0, wall=1_000_000.0)
    assert saved == {"7": 1_000_060.0}
    after_restart = GraceTimers()
    after_restart.restore(saved, now=5.0, wall=1_000_020.0, grace_s=60.0)  # 20 s later, a new clock
    assert after_restart.due(44.9) == []
    assert after_restart.due(45.0) == [7]


def test_a_wall_clock_set_back_does_not_stretch_a_deadline_past_a_grace_period() -> None:
    timers = GraceTimers()
    timers.restore({"7": 1_000_060.0}, now=5.0, wall=999_000.0, grace_s=60.0)
    assert timers.next_due() == 65.0


def test_unreadable_saved_deadlines_are_skipped() -> None:
    timers = GraceTimers()
    timers.restore({"x": 1.0, "8": "soon", "9": 1_000_010.0}, now=0.0, wall=1_000_000.0, grace_s=60.0)
    timers.restore(["not", "a", "dict"], now=0.0, wall=1_000_000.0, grace_s=60.0)
    assert timers.due(100.0) == [9]


def test_timers_looked_at_again_keep_their_deadline() -> None:
    timers = GraceTimers()
    timers.start(7, 10.0)
    assert timers.take_dirty()
    assert timers.due(10.0) == [7]
    timers.look_again(7, 11.0)
    assert timers.due(10.5) == []  # not before it is looked at again
    assert timers.due(11.0) == [7]
    assert not timers.take_dirty()  # nothing new to write: the deadline is the one written
    assert timers.on_disk(now=11.0, wall=1011.0) == {"7": 1010.0}


# -- which alerts start a timer ----------------------------------------------------------------


def test_a_snapshot_and_migrate_alert_starts_its_timer_once() -> None:
    timers = GraceTimers()
    assert policy.grace_step(_alert(), timers) == (7, GraceStep.AFTER_GRACE)
    timers.start(7, 60.0)
    assert policy.grace_step(_alert(id=9, kind=apb.EVENT_KIND_UPDATED), timers) is None  # same incident


def test_alerts_that_do_not_ask_for_a_move_start_no_timer() -> None:
    timers = GraceTimers()
    assert policy.grace_step(_alert(action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY), timers) is None
    cleared = _alert(state=apb.ALERT_STATE_CLEARED, clear_reason=apb.CLEAR_REASON_GPU_DARK)
    assert policy.grace_step(cleared, timers) is None


def test_an_alert_whose_risk_fell_settles_its_timer() -> None:
    for reason in (apb.CLEAR_REASON_RISK_FELL, apb.CLEAR_REASON_SUPERSEDED):
        cleared = _alert(id=9, state=apb.ALERT_STATE_CLEARED, clear_reason=reason)
        assert policy.grace_step(cleared, GraceTimers()) == (7, GraceStep.SETTLE)


def test_a_failure_that_drains_its_node_is_due_at_once() -> None:
    failed = _alert(id=12, opened_id=0, kind=apb.EVENT_KIND_FAILED, failure=apb.Failure(drains_node=True))
    assert policy.grace_step(failed, GraceTimers()) == (12, GraceStep.NOW)
    harmless = _alert(id=13, opened_id=0, kind=apb.EVENT_KIND_FAILED, failure=apb.Failure(drains_node=False))
    assert policy.grace_step(harmless, GraceTimers()) is None


# -- alerts and acknowledgements ----------------------------------------------------------------


def test_only_a_risk_that_fell_back_spares_the_node() -> None:
    assert not policy.risk_fell(None)
    assert policy.risk_fell(_alert(clear_reason=apb.CLEAR_REASON_SUPERSEDED))
    assert not policy.risk_fell(_alert(clear_reason=apb.CLEAR_REASON_NODE_SILENT))


def test_a_declined_alert_is_left_to_the_operator() -> None:
    done = Ack(7, "job-1", apb.ACK_ACTION_SNAPSHOT_DONE, 10, "")
    no = Ack(7, "job-1", apb.ACK_ACTION_DECLINED, 0, "")
    assert not policy.declined([done])
    assert policy.declined([done, no])


def test_a_failure_holds_its_node_only_while_its_own_remediation_runs() -> None:
    failed = _alert(kind=apb.EVENT_KIND_FAILED)
    assert policy.holds_node(failed, "pending", None)
    assert not policy.holds_node(failed, "ok", None)
    opened = _alert(kind=apb.EVENT_KIND_OPENED)
    assert policy.holds_node(opened, "ok", None)
    assert not policy.holds_node(opened, "pending", _alert(state=apb.ALERT_STATE_CLEARED))


def test_only_a_snapshot_done_of_a_move_takes_the_node_out() -> None:
    alert = _alert()
    assert policy.ack_answer(alert, apb.ACK_ACTION_SNAPSHOT_DONE, 60.0, fell=False) is None
    waiting = policy.ack_answer(alert, apb.ACK_ACTION_RECEIVED, 60.0, fell=False)
    assert waiting == "noted; node-a is drained after SNAPSHOT_DONE or in 60 s"
    fell = policy.ack_answer(alert, apb.ACK_ACTION_SNAPSHOT_DONE, 60.0, fell=True)
    assert fell is not None
    assert "risk fell back" in fell
    only = _alert(action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    stays = policy.ack_answer(only, apb.ACK_ACTION_SNAPSHOT_DONE, 60.0, fell=False)
    assert stays == "noted; alert 7 recommends RECOMMENDED_ACTION_SNAPSHOT_ONLY: node-a stays in service"


def test_the_remediation_names_the_alert_and_the_job() -> None:
    # The newest event (id 9) of alert 7: the remediation is the alert's, by its first event's id.
    r = policy.remediation_for(
        _alert(id=9, mode=apb.FAILURE_MODE_HBM_WEAR), "job-1", requeue=False, checkpoint_uri="file:///c"
    )
    assert (r.alert_id, r.node, r.gpu, r.job_id, r.requeue, r.checkpoint_uri) == (
        7,
        "node-a",
        1,
        "job-1",
        False,
        "file:///c",
    )
    assert r.mode == "hbm_wear"


def test_what_the_job_is_told_when_its_remediation_is_queued() -> None:
    assert policy.queued_answer("slurm", _remediation()) == "slurm: drain node-a and requeue job job-1"
    replaced = policy.queued_answer("slurm", _remediation(requeue=False))
    assert replaced == "slurm: drain node-a; job job-1 replaces the node itself"
    handed = policy.queued_answer("slurm", _remediation(requeue=False, handover_to="s1"))
    assert handed == "slurm: drain node-a and hand job job-1 over to standby s1"


def test_a_repeated_acknowledgement_hears_the_first_decision() -> None:
    again = policy.answer_again(7, "pending", "", _remediation(), "slurm")
    assert again == "slurm: drain node-a and requeue job job-1 (alert 7 is being remediated)"
    handed = policy.answer_again(7, "ok", "", _remediation(requeue=False, handover_to="s1"), "slurm")
    assert handed.endswith("over to standby s1 (alert 7 is already remediated)")
    assert policy.answer_again(7, "ok", "", None, "slurm") == "alert 7 is already remediated"
    refused = policy.answer_again(7, "refused", "paused", None, "slurm")
    assert refused == "refused: paused; alert 7 is not remediated; the operator decides"


# -- the circuit breaker -------------------------------------------------------------------------


def test_a_pause_refuses_before_the_breaker_counts() -> None:
    breaker = CircuitBreaker(max_nodes=1, window_s=100.0)
    assert policy.refusal("alice", breaker, "a", 0.0) == "remediation paused by alice; a left in service"
    assert breaker.admissions(0.0) == []
    assert policy.refusal(None, breaker, "a", 0.0) is None
    refused = policy.refusal(None, breaker, "b", 1.0)
    assert refused == "circuit breaker: 1 nodes already taken out in 100 s; b left in service"


def test_the_breaker_would_admit_a_node_it_counted_already() -> None:
    breaker = CircuitBreaker(max_nodes=1, window_s=100.0)
    assert policy.would_admit(breaker, "b", 0.0)
    assert policy.refusal(None, breaker, "a", 0.0) is None
    assert policy.would_admit(breaker, "a", 1.0)
    assert not policy.would_admit(breaker, "b", 1.0)
    assert breaker.admissions(1.0) == [(0.0, "a")]  # asking counted nothing


def test_the_breakers_window_goes_to_disk_in_wall_clock_time_and_comes_back() -> None:
    saved = policy.window_on_disk([(90.0, "a")], now=100.0, wall=1_000_000.0)
    assert saved == [[999_990.0, "a"]]
    assert policy.window_from_disk(saved, now=5.0, wall=1_000_030.0) == [(-35.0, "a")]


def test_a_wall_clock_set_back_makes_an_admission_count_from_now() -> None:
    assert policy.window_from_disk([[1_000_000.0, "a"]], now=5.0, wall=999_000.0) == [(5.0, "a")]


def test_unreadable_admissions_are_skipped() -> None:
    saved = [[1.0, "a"], ["x", "b"], [2.0], "c"]
    assert policy.window_from_disk(saved, now=10.0, wall=10.0) == [(1.0, "a")]
    assert policy.window_from_disk({"a": 1}, now=10.0, wall=10.0) == []


# -- attempts --------------------------------------------------------------------------------------


def test_an_attempt_that_works_is_ok_and_says_which_attempt_it_was() -> None:
    assert policy.attempt_verdict(True, "drained", 1, 3) == policy.Verdict("ok", "drained")
    assert policy.attempt_verdict(True, "drained", 2, 3) == policy.Verdict("ok", "drained (on attempt 2)")


def test_a_failed_attempt_is_retried_until_the_last() -> None:
    assert policy.attempt_verdict(False, "busy", 2, 3) == policy.Verdict("retry", "busy")
    assert policy.attempt_verdict(False, "busy", 3, 3) == policy.Verdict(
        "failed", "busy; gave up after 3 attempts"
    )
    assert policy.attempt_verdict(False, "busy", 1, 1).detail == "busy; gave up after 1 attempt"


def test_a_remediation_cut_off_after_its_last_attempt_is_given_up_at_a_start() -> None:
    assert policy.given_up(1, 3, "busy") is None
    assert policy.given_up(3, 3, "busy") == "busy; gave up after 3 attempts (the last cut off by a restart)"
    assert policy.given_up(3, 3, "") == (
        "no outcome stored; gave up after 3 attempts (the last cut off by a restart)"
    )
