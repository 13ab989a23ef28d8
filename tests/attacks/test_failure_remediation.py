"""Attacks on what the service does once a failure has happened: one failure drained and requeued its
node three times (the Xid's FAILED event, the silence that followed, the grace timer of the alert
that foresaw it); a drain requeued only the alphabetically first job on the node; a job that
replaces its own nodes was requeued after a restart; the circuit breaker refused failures with
hardware evidence; a FAILED event stored just before a kill was never drained.

In-process: a Remediator over a state database, with a monotonic and a wall clock the test moves,
and a new Remediator over the same file where a restart is the point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from faultcast.model.importers.slurm_events import Reading, ReasonRules, Verdict
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import (
    CircuitBreaker,
    NoopActuator,
    Outcome,
    Remediation,
    RetryPolicy,
)
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clocks, migrate_alert, remediator_on

GRACE_S = 300.0


def _remediator(
    path: Path, clocks: Clocks, *, breaker: CircuitBreaker | None = None
) -> tuple[Remediator, NoopActuator, StateStore]:
    return remediator_on(path, clocks, GRACE_S, breaker=breaker)


def _failed(
    store: StateStore,
    node: str,
    clocks: Clocks,
    *,
    evidence: apb.FailureEvidence.ValueType = apb.FAILURE_EVIDENCE_XID,
    gpu: int = 1,
    foreseen_by: Sequence[int] = (),
) -> apb.Alert:
    """A stored FAILED event that drains its node, as the alert book writes one."""
    event = apb.Alert(
        node=node,
        gpu=gpu if evidence != apb.FAILURE_EVIDENCE_NODE_SILENT else -1,
        mode=apb.FAILURE_MODE_DETACHMENT,
        kind=apb.EVENT_KIND_FAILED,
        state=apb.ALERT_STATE_FAILED,
        time_unix_nano=int(clocks.wall() * 1e9),
        failure=apb.Failure(
            evidence=evidence,
            xid=79 if evidence == apb.FAILURE_EVIDENCE_XID else 0,
            drains_node=True,
            foreseen_by=list(foreseen_by),
        ),
    )
    return store.alerts.append([event])[0]


def _drained(actuator: NoopActuator) -> list[tuple[int, str, str]]:
    """(alert, node, job) of every drain the actuator was asked for."""
    return [(r.alert_id, r.node, r.job_id) for r in actuator.seen]


def test_one_failure_is_one_drain_across_its_events_and_the_alert_that_foresaw_it(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("j1", ["a"])
    foreseeing = migrate_alert(store, "a")
    remediator.on_alerts([foreseeing])  # its grace timer starts: due in 300 s
    clocks.advance(60.0)
    xid = _failed(store, "a", clocks, foreseen_by=[foreseeing.id])
    remediator.on_alerts([xid])
    remediator.run_once()
    assert _drained(actuator) == [(xid.id, "a", "j1")]
    clocks.advance(20.0)  # the node reboots: its collector falls silent
    silent = _failed(store, "a", clocks, evidence=apb.FAILURE_EVIDENCE_NODE_SILENT)
    remediator.on_alerts([silent])
    remediator.run_once()
    clocks.advance(GRACE_S)  # the foreseeing alert's grace ends
    remediator.run_once()
    assert _drained(actuator) == [(xid.id, "a", "j1")]  # once, not three times
    outcome, detail = store.remediations.of(silent.id) or ("", "")
    assert outcome == "joined"
    assert f"alert {xid.id}" in detail
    assert store.remediations.of(foreseeing.id) is None  # settled by the failure's drain


def test_a_node_taken_out_an_incident_ago_is_drained_again_for_a_new_failure(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("j1", ["a"])
    first = _failed(store, "a", clocks)
    remediator.on_alerts([first])
    remediator.run_once()
    clocks.advance(remediator.incident_s + 1.0)  # repaired and back in service meanwhile
    second = _failed(store, "a", clocks, gpu=2)
    remediator.on_alerts([second])
    remediator.run_once()
    assert [alert for alert, *_ in _drained(actuator)] == [first.id, second.id]


def test_a_failure_requeues_every_job_on_the_node_each_by_its_own_policy(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("a-first", ["n1", "n2"])
    store.jobs.register("b-replaces", ["n1"], replaces_nodes=True)
    remediator.note_job("b-replaces", replaces_nodes=True)
    store.jobs.register("c-third", ["n1", "n3"])
    store.jobs.register("d-elsewhere", ["n2"])
    failed = _failed(store, "n1", clocks)
    remediator.on_alerts([failed])
    remediator.run_once()
    (r,) = actuator.seen
    assert r.requeued == ["a-first", "c-third"]  # b replaces n1 itself; d is not on it
    stored = remediator.records.stored_request(failed.id)
    assert stored == r  # a restart carries on the same request


def test_the_first_job_replacing_its_nodes_still_lets_the_others_be_requeued(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("a-replaces", ["n1"], replaces_nodes=True)
    remediator.note_job("a-replaces", replaces_nodes=True)
    store.jobs.register("v", ["n1"])
    remediator.on_alerts([_failed(store, "n1", clocks)])
    remediator.run_once()
    assert [r.requeued for r in actuator.seen] == [["v"]]


def test_a_prediction_still_moves_only_the_job_that_acknowledged(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("a", ["n1"])
    store.jobs.register("b", ["n1"])
    alert = migrate_alert(store, "n1")
    remediator.on_alerts([alert])
    clocks.advance(GRACE_S + 1)
    remediator.run_once()
    assert [r.requeued for r in actuator.seen] == [["a"]]


def test_a_job_that_replaces_its_nodes_is_not_requeued_after_a_restart(tmp_path: Path) -> None:
    clocks = Clocks()
    first, _, store = _remediator(tmp_path, clocks)
    store.jobs.register("v", ["n1"], replaces_nodes=True)
    first.note_job("v", replaces_nodes=True)
    store.close()
    clocks.advance(10.0)
    second, actuator, store = _remediator(tmp_path, clocks)  # the service restarted
    second.on_alerts([_failed(store, "n1", clocks)])
    second.run_once()
    (r,) = actuator.seen
    assert (r.job_id, r.requeue, r.requeued) == ("v", False, [])
    assert store.jobs.flags()["v"].replaces_nodes


def test_the_circuit_breaker_lets_gpu_failures_through_and_holds_silences_and_predictions(
    tmp_path: Path,
) -> None:
    clocks = Clocks()
    breaker = CircuitBreaker(max_nodes=1, window_s=3600.0)
    remediator, actuator, store = _remediator(tmp_path, clocks, breaker=breaker)
    nodes = [f"s{i}" for i in range(5)]
    for node in nodes:
        store.jobs.register(f"job-{node}", [node])
    xids = [_failed(store, node, clocks) for node in nodes[:3]]
    remediator.on_alerts(xids)
    remediator.run_once()
    assert sorted(node for _, node, *_ in _drained(actuator)) == ["s0", "s1", "s2"]  # facts: none refused
    assert breaker.admissions(clocks.mono()) == []  # and none counted
    silent = [_failed(store, node, clocks, evidence=apb.FAILURE_EVIDENCE_NODE_SILENT) for node in nodes[3:]]
    remediator.on_alerts(silent)
    remediator.run_once()
    outcomes = sorted((store.remediations.of(s.id) or ("", ""))[0] for s in silent)
    assert outcomes == ["ok", "refused"]  # a burst of silences is what a partition looks like


def test_a_pause_holds_back_even_a_hardware_failure(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("j1", ["a"])
    remediator.set_paused("admin")
    failed = _failed(store, "a", clocks)
    remediator.on_alerts([failed])
    remediator.run_once()
    assert actuator.seen == []
    assert (store.remediations.of(failed.id) or ("", ""))[0] == "refused"


def test_a_failure_stored_just_before_a_kill_is_drained_at_the_next_start(tmp_path: Path) -> None:
    clocks = Clocks()
    _, _, store = _remediator(tmp_path, clocks)
    store.jobs.register("j1", ["a"])
    failed = _failed(store, "a", clocks)  # stored; the kill came before any listener heard of it
    store.close()
    clocks.advance(30.0)
    second, actuator, _ = _remediator(tmp_path, clocks)
    second.resume()
    second.run_once()
    assert [alert for alert, *_ in _drained(actuator)] == [failed.id]


def test_an_old_failure_never_remediated_is_left_to_the_operator_at_a_start(tmp_path: Path) -> None:
    clocks = Clocks()
    _, _, store = _remediator(tmp_path, clocks)
    store.jobs.register("j1", ["a"])
    _failed(store, "a", clocks)
    store.close()
    clocks.advance(2 * 3600.0)  # down for two hours: the node was dealt with by hand
    second, actuator, _ = _remediator(tmp_path, clocks)
    second.resume()
    second.run_once()
    assert actuator.seen == []


def test_a_failure_drain_reads_back_as_a_failure_in_the_slurm_events_import() -> None:
    failed = Remediation(7, "n1", 3, "detachment", 0.0, "42", requeue=True, evidence="xid 79")
    silent = Remediation(8, "n1", -1, "host", 0.0, "42", requeue=True, evidence="node_silent")
    predicted = Remediation(9, "n1", 3, "hbm_wear", 0.91, "42", requeue=True)
    rules = ReasonRules()
    assert rules.read(failed.reason) == Reading(Verdict.FAILURE, "detachment", 79)
    assert rules.read(silent.reason).verdict == Verdict.UNEXPLAINED  # a crashed collector looks the same
    assert rules.read(predicted.reason).verdict == Verdict.PREDICTION


def test_ports_down_across_the_fabric_are_held_by_the_circuit_breaker(tmp_path: Path) -> None:
    # A subnet manager's failover takes every port of the fabric out of ACTIVE at once: a fact on
    # each node, but one cause, and draining the cluster for it is what the breaker is for.
    clocks = Clocks()
    breaker = CircuitBreaker(max_nodes=2, window_s=3600.0)
    remediator, actuator, store = _remediator(tmp_path, clocks, breaker=breaker)
    nodes = [f"p{i}" for i in range(8)]
    for node in nodes:
        store.jobs.register(f"job-{node}", [node])
    for evidence in (apb.FAILURE_EVIDENCE_IB_PORT_DOWN, apb.FAILURE_EVIDENCE_NVML_UNREACHABLE):
        remediator.on_alerts([_failed(store, node, clocks, evidence=evidence) for node in nodes[:4]])
        remediator.run_once()
        nodes = nodes[4:]
    assert len(actuator.seen) == 2


class _FailsFor(NoopActuator):
    """Fails every attempt at the remediations of the alerts in `failing`."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing

    def remediate(self, remediation: Remediation) -> Outcome:
        if remediation.alert_id in self.failing:
            return Outcome(False, "the scheduler refused")
        return super().remediate(remediation)


def test_a_failure_during_a_drain_that_then_fails_is_drained_not_joined(tmp_path: Path) -> None:
    clocks = Clocks()
    store = StateStore.in_dir(tmp_path)
    store.jobs.register("j1", ["a"])
    alert = migrate_alert(store, "a")
    actuator = _FailsFor({alert.id})
    retry = RetryPolicy(initial_s=5.0, max_attempts=2, jitter=0.0)
    remediator = Remediator(
        store, actuator, ServiceMetrics(), grace_s=GRACE_S, retry=retry, clock=clocks.mono, wall=clocks.wall
    )
    remediator.on_alerts([alert])
    clocks.advance(GRACE_S)
    remediator.run_once()  # the prediction's first attempt fails: pending, retried in 5 s
    xid = _failed(store, "a", clocks)
    remediator.on_alerts([xid])
    remediator.run_once()  # the failure waits for the drain under way
    assert store.remediations.of(xid.id) is None
    for _ in range(3):
        clocks.advance(6.0)
        remediator.run_once()
    assert (store.remediations.of(alert.id) or ("", ""))[0] == "failed"
    assert [r.alert_id for r in actuator.seen] == [xid.id]  # drained for the failure after all
    store.close()


def test_a_failure_after_a_predictions_drain_requeues_the_jobs_it_did_not_move(tmp_path: Path) -> None:
    clocks = Clocks()
    remediator, actuator, store = _remediator(tmp_path, clocks)
    store.jobs.register("job-a", ["n1"])
    store.jobs.register("job-b", ["n1"])
    alert = migrate_alert(store, "n1")
    remediator.on_alerts([alert])
    clocks.advance(GRACE_S + 1)
    remediator.run_once()  # the prediction moves job-a alone
    clocks.advance(600.0)
    xid = _failed(store, "n1", clocks)
    remediator.on_alerts([xid])
    remediator.run_once()
    assert [(r.alert_id, r.requeued) for r in actuator.seen] == [(alert.id, ["job-a"]), (xid.id, ["job-b"])]
    silent = _failed(store, "n1", clocks, evidence=apb.FAILURE_EVIDENCE_NODE_SILENT)
    remediator.on_alerts([silent])
    remediator.run_once()  # every job moved now: one incident
    assert (store.remediations.of(silent.id) or ("", ""))[0] == "joined"
    assert len(actuator.seen) == 2


def test_a_failure_decided_on_without_a_job_is_not_drained_by_a_later_start(tmp_path: Path) -> None:
    # No job ran on the node when it failed, so nothing was remediated; a job registered there
    # since. A restart drained the node for the old failure, which the live service never would.
    clocks = Clocks()
    first, _, store = _remediator(tmp_path, clocks)
    failed = _failed(store, "n2", clocks)
    first.on_alerts([failed])
    first.run_once()
    clocks.advance(20 * 60.0)
    store.jobs.register("job-new", ["n2"])
    store.close()
    clocks.advance(10 * 60.0)
    second, actuator, _ = _remediator(tmp_path, clocks)
    second.resume()
    second.run_once()
    assert actuator.seen == []
