"""The service's parts one by one: the online alert policy against the offline one, the alert book's
dedupe and escalation, the durable log, sample checks, and when remediation happens."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from faultcast.catalogue import Scope, index_of
from faultcast.model.alerting import AlertPolicy, AlertTracker, alert_starts
from faultcast.model.artifact import FaultModel, load
from faultcast.readings import NodeSnapshot
from faultcast.service.alerting import ActionPolicy, AlertBook
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation import CircuitBreaker, NoopActuator, Outcome, Remediation, RetryPolicy
from faultcast.service.remediator import Remediator
from faultcast.service.scoring import ScoredStep, estimated_ttf_s
from faultcast.service.state import Ack, StateStore
from faultcast.service.validation import Limits, SampleRejected, check
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb

# -- the alert policy, online = offline ---------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_online_tracker_opens_exactly_where_the_offline_policy_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps, slots = 600, 16
    # Risk in slow waves so that runs above and below the threshold, and expiries, all happen.
    risk = np.clip(0.5 + 0.5 * np.sin(np.cumsum(rng.normal(0, 0.3, (steps, slots)), axis=0)), 0, 1)
    risk[rng.random((steps, slots)) < 0.02] = np.nan
    present = rng.random((steps, slots)) > 0.03
    policy = AlertPolicy(k=2, clear_steps=5, horizon_s=1800.0)
    offline_steps, offline_slots = alert_starts(risk, present, [0.7], policy, 60.0)[0]
    tracker = AlertTracker(policy, 60.0, 0.7)
    online: list[tuple[int, int]] = []
    halves = (np.arange(0, 8), np.arange(8, 16))  # two nodes, fed separately as the service does
    for t in range(steps):
        for part in halves:
            opened, _, _ = tracker.update(1000 + t, part, risk[t, part], present[t, part])
            online += [(t, int(s)) for s in opened]
    assert len(offline_steps) > 20
    assert sorted(online) == sorted(zip(offline_steps.tolist(), offline_slots.tolist(), strict=True))


def test_the_tracker_says_why_an_alert_closed() -> None:
    tracker = AlertTracker(AlertPolicy(k=1, clear_steps=2, horizon_s=300.0), 60.0, 0.5)
    slots = np.array([0, 1, 2])
    high, yes = np.array([0.9, 0.9, 0.9]), np.ones(3, dtype=bool)
    opened, _, _ = tracker.update(0, slots, high, yes)
    assert opened.tolist() == [0, 1, 2]
    reasons: dict[int, int] = {}
    risks = {1: [0.9, 0.1, 0.9], 2: [0.9, 0.1, 0.9], 3: [0.9, 0.1, 0.9]}
    for t in (1, 2, 3):
        present = np.array([True, True, t < 3])
        _, closed, why = tracker.update(t, slots, np.array(risks[t]), present)
        reasons.update(zip(closed.tolist(), why.tolist(), strict=True))
    assert reasons == {1: 0, 2: 2}  # slot 1: risk low for 2 scores; slot 2: went dark
    for t in (4, 5):
        _, closed, why = tracker.update(t, slots[:1], np.array([0.9]), np.array([True]))
        reasons.update(zip(closed.tolist(), why.tolist(), strict=True))
    assert reasons[0] == 1  # slot 0: the horizon (5 steps) passed


# -- the alert book -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(service_model: Path) -> FaultModel:
    return load(service_model)


def _step(
    model: FaultModel, node: str, step: int, risk: list[float], mode: str, ttf_s: float = 600.0
) -> ScoredStep:
    g = model.feature_config.gpus_per_node
    features = np.zeros((g, len(model.feature_names)))
    return ScoredStep(
        node, step, step * 60.0, 0.0, np.ones(g, dtype=bool), features, tuple(f"GPU-{i}" for i in range(g)),
        np.array(risk, dtype=float), [mode] * g, np.full(g, ttf_s),
    )  # fmt: skip


def test_one_alert_per_gpu_escalates_then_clears_and_the_log_keeps_it(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(
        model, store, ServiceMetrics(), actions=ActionPolicy(migrate_within_s=600, migrate_risk=0.9)
    )
    hot = model.threshold + (1 - model.threshold) / 4
    low, g = model.threshold / 10, model.feature_config.gpus_per_node
    events: list[apb.Alert] = []
    for t in range(6):  # GPU 5 above the threshold, failure further than 10 minutes away
        events += book.observe(
            [_step(model, "n1", 100 + t, [low] * 5 + [hot] + [low] * (g - 6), "hbm_wear", 1500.0)]
        )
    assert [(e.state, e.gpu, e.action) for e in events] == [
        (apb.ALERT_STATE_OPEN, 5, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    ]
    first = events[0]
    assert first.id == first.opened_id == 1
    events = book.observe([_step(model, "n1", 106, [low] * 5 + [hot] + [low] * (g - 6), "hbm_wear", 300.0)])
    assert [(e.state, e.opened_id, e.action) for e in events] == [
        (apb.ALERT_STATE_OPEN, first.id, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    ]
    assert [a.id for a in book.active()] == [events[0].id]
    for t in range(model.policy.clear_steps):
        events = book.observe([_step(model, "n1", 107 + t, [low] * g, "hbm_wear")])
    assert [(e.state, e.opened_id, e.cleared_reason) for e in events] == [
        (apb.ALERT_STATE_CLEARED, first.id, "risk below threshold")
    ]
    assert book.active() == []
    assert [a.id for a in store.read_after(0)] == [1, 2, 3]
    store.close()


def test_a_node_level_mode_makes_one_alert_for_the_node(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    events: list[apb.Alert] = []
    for t in range(3):
        events += book.observe([_step(model, "n2", 10 + t, [0.95] * g, "infiniband")])
    assert [(e.gpu, e.mode) for e in events] == [(-1, apb.FAILURE_MODE_NETWORK)]
    assert events[0].gpu_uuid == ""
    store.close()


def test_open_alerts_survive_a_restart_and_ids_keep_increasing(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "n3", 50 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
    opened = store.open_alerts()
    store.close()
    reopened = StateStore.in_dir(tmp_path)
    book = AlertBook(model, reopened, ServiceMetrics())
    assert [a.id for a in book.active()] == [a.id for a in opened]
    dark = replace(_step(model, "n3", 53, [0.0] * g, "hbm_wear"), present=np.zeros(g, dtype=bool))
    events = book.observe([dark])
    assert [(e.state, e.opened_id, e.cleared_reason) for e in events] == [
        (apb.ALERT_STATE_CLEARED, opened[0].id, "gpu dark")
    ]
    assert events[0].id > opened[0].id
    reopened.close()


def test_the_time_to_failure_is_the_median_of_the_buckets() -> None:
    risk = np.array([0.5, 0.5, 0.5])
    within = np.array([[0.4, 0.45, 0.5], [0.0, 0.25, 0.5], [0.0, 0.0, 0.5]])  # 5/15/30 minutes
    ttf = estimated_ttf_s(risk, within)
    assert ttf[0] < 300 < ttf[1] <= 900 < ttf[2] <= 1800
    assert ttf[1] == pytest.approx(900.0)


# -- sample checks ---------------------------------------------------------------------------


def _snapshot(t_s: float) -> NodeSnapshot:
    reading = replace(TwinSource(FleetConfig(nodes=1, days=1.0), 0).read(), time_unix_nano=None)
    return NodeSnapshot.merge("node-a", int(t_s * 1e9), [reading], {})


def test_the_clock_checks_refuse_samples_from_the_future_and_the_distant_past() -> None:
    limits = Limits(max_future_s=300, max_age_s=3600)
    now = 2_000_000_000.0
    check(_snapshot(now + 200), now, limits)
    with pytest.raises(SampleRejected, match="ahead of the service's clock") as ahead:
        check(_snapshot(now + 400), now, limits)
    assert ahead.value.reason == "future_timestamp"
    with pytest.raises(SampleRejected) as old:
        check(_snapshot(now - 7200), now, limits)
    assert old.value.reason == "stale_timestamp"
    check(_snapshot(now + 10**6), now, Limits(max_future_s=0, max_age_s=0))  # the checks can be off


def test_with_an_inventory_only_its_nodes_are_taken() -> None:
    inventory = Limits(max_future_s=0, max_age_s=0, nodes=frozenset({"node-a", "node-b"}))
    check(_snapshot(1e9), 1e9, inventory)
    with pytest.raises(SampleRejected, match="inventory") as unknown:
        check(replace(_snapshot(1e9), node="node-z"), 1e9, inventory)
    assert unknown.value.reason == "unknown_node"


def test_bad_values_and_gpus_are_dropped_one_by_one() -> None:
    snapshot = _snapshot(1e9)
    temp, sbe = index_of(Scope.GPU)["gpu_temp"], index_of(Scope.GPU)["ecc_sbe_volatile"]
    values = list(snapshot.gpus[1].values)
    values[temp], values[sbe] = -math.inf, -1.0
    gpus = list(snapshot.gpus)
    gpus[1] = replace(gpus[1], values=tuple(values))
    gpus.append(replace(gpus[0], index=9))
    gpus.append(gpus[2])
    cleaned, issues = check(replace(snapshot, gpus=tuple(gpus)), 1e9, Limits(gpus_per_node=8))
    assert issues == {
        "non_finite_value": 1,
        "negative_counter": 1,
        "gpu_index_out_of_range": 1,
        "duplicate_gpu_index": 1,
    }
    assert [g.index for g in cleaned.gpus] == list(range(8))
    assert math.isnan(cleaned.gpus[1].values[temp])
    assert math.isnan(cleaned.gpus[1].values[sbe])
    assert cleaned.gpus[1].values[:temp] == snapshot.gpus[1].values[:temp]
    with pytest.raises(SampleRejected) as bad:
        check(replace(snapshot, node="two words"), 1e9, Limits())
    assert bad.value.reason == "bad_node_name"


# -- remediation ----------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Raising:
    name = "raising"

    def remediate(self, remediation: Remediation) -> Outcome:
        raise RuntimeError("scheduler exploded")


def _alert(store: StateStore, node: str, action: apb.RecommendedAction.ValueType) -> apb.Alert:
    alert = apb.Alert(
        node=node, gpu=1, mode=apb.FAILURE_MODE_NVLINK, risk=0.8, action=action, state=apb.ALERT_STATE_OPEN
    )
    return store.append([alert])[0]


def _remediator(store: StateStore, clock: _Clock, **kw: object) -> tuple[Remediator, NoopActuator]:
    actuator = NoopActuator()
    remediator = Remediator(store, actuator, ServiceMetrics(), grace_s=60.0, clock=clock, **kw)  # type: ignore[arg-type]
    return remediator, actuator


def test_without_snapshot_done_the_node_is_drained_after_the_grace_period(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), _Clock()
    store.register_job("j1", ["a", "b"])
    remediator, actuator = _remediator(store, clock)
    migrate = _alert(store, "a", apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    declined = _alert(store, "b", apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    no_job = _alert(store, "c", apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    snapshot_only = _alert(store, "b", apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    remediator.on_alerts([migrate, declined, no_job, snapshot_only])
    reply = remediator.on_ack(Ack(declined.id, "j1", apb.ACK_ACTION_DECLINED, 0, ""))
    assert "operator decides" in reply
    reply = remediator.on_ack(Ack(snapshot_only.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 5, "s3://x"))
    assert "stays in service" in reply
    clock.now += 59
    assert remediator.run_once() == 0
    clock.now += 2
    assert remediator.run_once() == 1
    assert [(r.node, r.job_id, r.alert_id) for r in actuator.seen] == [("a", "j1", migrate.id)]
    clock.now += 3600
    assert remediator.run_once() == 0  # nothing else is due, ever
    assert store.remediation(migrate.id) == ("ok", "noop: would drain a")
    store.close()


def test_the_circuit_breaker_caps_nodes_taken_out_and_an_actuator_bug_is_contained(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), _Clock()
    nodes = [f"n{i}" for i in range(4)]
    store.register_job("big", nodes)
    remediator, _actuator = _remediator(store, clock, breaker=CircuitBreaker(max_nodes=2, window_s=600))
    for node in nodes:
        alert = _alert(store, node, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
        remediator.on_ack(Ack(alert.id, "big", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    remediator.run_once()
    outcomes = [(r.node, outcome) for r, outcome, _ in remediator.done]
    assert outcomes == [("n0", "ok"), ("n1", "ok"), ("n2", "refused"), ("n3", "refused")]
    assert "circuit breaker" in remediator.done[2][2]
    assert remediator.breaker.is_open(clock.now)
    clock.now += 601
    assert not remediator.breaker.is_open(clock.now)
    # No retries here (tests/test_remediation_retry.py has them): the one failure is final.
    broken = Remediator(store, _Raising(), ServiceMetrics(), clock=clock, retry=RetryPolicy(max_attempts=1))
    alert = _alert(store, "n0", apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    broken.on_ack(Ack(alert.id, "big", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    broken.run_once()
    assert broken.done[0][1:] == ("failed", "RuntimeError: scheduler exploded; gave up after 1 attempt")
    store.close()


def test_a_reload_that_restarts_the_features_expires_open_alerts(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "n4", 70 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
    opened = book.active()
    book.swap_model(model, carried_over=False)
    events = book.observe([_step(model, "n4", 73, [0.0] * g, "hbm_wear")])
    assert [(e.opened_id, e.cleared_reason) for e in events] == [(opened[0].id, "horizon passed")]
    assert book.active() == []
    store.close()
