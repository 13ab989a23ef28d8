"""The service's parts one by one: the alert state machine online against offline, hysteresis, the
alert book's updates (mode, action, time to failure) and silent nodes, the durable log, sample
checks, and when remediation happens."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest

from faultcast.catalogue import Scope, index_of
from faultcast.demo.feed import twin_snapshots
from faultcast.model.alert_content import ActionPolicy, describe, ttf_quantiles
from faultcast.model.artifact import FaultModel, load
from faultcast.model.evaluation.outcomes import ScoredPeriod, incidents
from faultcast.model.incidents import AlertPolicy, CloseReason, IncidentTracker
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.readings import NodeSnapshot
from faultcast.service.alert_book import AlertBook
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import (
    CircuitBreaker,
    NoopActuator,
    Outcome,
    Remediation,
    RetryPolicy,
)
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.rpc.validation import Limits, SampleRejected, check
from faultcast.service.scoring import ScoredStep, Scorer
from faultcast.service.state.acks import Ack
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clock, migrate_alert

# -- the alert state machine, online = offline ------------------------------------------------

MODES = ("hbm_wear", "power", "infiniband")  # infiniband is node-level


@pytest.fixture(scope="module")
def model(service_model: Path) -> FaultModel:
    return load(service_model)


def _scored(
    model: FaultModel,
    node: str,
    step: int,
    risk: Sequence[float] | np.ndarray,
    modes: Sequence[str] | np.ndarray,
    present: Sequence[bool] | np.ndarray | None = None,
    ttf_s: float = 600.0,
) -> ScoredStep:
    g = model.feature_config.gpus_per_node
    features = np.zeros((g, len(model.feature_names)))
    shown = np.ones(g, dtype=bool) if present is None else np.asarray(present, dtype=bool)
    return ScoredStep(
        node,
        step,
        step * 60.0,
        0.0,
        shown,
        features,
        tuple(f"{node}-GPU-{i}" for i in range(g)),
        np.where(shown, np.asarray(risk, dtype=float), np.nan),
        list(modes),
        np.full(g, ttf_s),
    )


def _migrate_within_s(model: FaultModel) -> float:
    """A `migrate_within_s` between a near failure (300 s) and the median time to failure the model's
    head gives the all-zero feature row these steps carry (what an alert opens with): the tests below
    are about the alert book's escalation, whatever that head says."""
    (content,) = describe(model, np.zeros((1, len(model.feature_names))), risk=np.array([model.threshold]))
    assert content.ttf_s is not None
    p50 = content.ttf_s[1]
    assert p50 > 320.0, f"the model's head puts the all-zero row's failure {p50:.0f} s away"
    return (300.0 + p50) / 2


def _step(
    model: FaultModel, node: str, step: int, risk: list[float], mode: str, ttf_s: float = 600.0
) -> ScoredStep:
    return _scored(model, node, step, risk, [mode] * model.feature_config.gpus_per_node, ttf_s=ttf_s)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_service_raises_and_clears_exactly_the_incidents_the_offline_evaluation_counts(
    model: FaultModel, tmp_path: Path, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    g = model.feature_config.gpus_per_node
    nodes, steps = 2, 500
    served = dataclasses.replace(model, threshold=0.7)
    # Risk in slow waves, so that runs above, between the levels and below all happen; GPUs drop out.
    walk = np.cumsum(rng.normal(0, 0.3, (steps, nodes * g)), axis=0)
    risk = np.clip(0.5 + 0.5 * np.sin(walk), 0, 1)
    present = rng.random((steps, nodes * g)) > 0.05
    present[150:160, g : 2 * g] = False  # a whole node dark for a while
    modes = np.asarray(MODES, dtype=object)[rng.integers(0, len(MODES), (steps, nodes * g))]
    period = ScoredPeriod(
        times_s=np.arange(steps) * 60.0,
        nodes=tuple(range(nodes)),
        gpus_per_node=g,
        present=present,
        scores={"model": np.where(present, risk, np.nan)},
        labels=np.zeros_like(present),
        modes=modes,
    )
    offline = incidents(period, "model", [0.7], served.policy, NODE_LEVEL_MODES)[0]

    store = StateStore.in_dir(tmp_path)
    book = AlertBook(served, store, ServiceMetrics())
    for t in range(steps):
        for n in range(nodes):  # each node fed on its own, as the service does
            cols = slice(n * g, (n + 1) * g)
            book.observe([_scored(served, f"n{n}", t, risk[t, cols], modes[t, cols], present[t, cols])])
    events = store.alerts.read_after(0, limit=100_000)
    store.close()
    opened = [
        (int(e.time_unix_nano // 60_000_000_000), e.node, e.gpu)
        for e in events
        if e.kind == apb.EVENT_KIND_OPENED
    ]
    cleared = sorted(
        (int(e.time_unix_nano // 60_000_000_000), e.node, e.gpu, e.cleared_reason)
        for e in events
        if e.kind == apb.EVENT_KIND_CLEARED
    )
    assert len(offline) > 20
    assert sorted(opened) == sorted((i.opened_step, f"n{i.node}", i.gpu) for i in offline)
    assert cleared == sorted(
        (i.closed_step, f"n{i.node}", i.gpu, i.reason.value) for i in offline if i.reason is not None
    )
    assert {i.gpu for i in offline} & {-1}
    assert {i.gpu for i in offline} - {-1}
    assert {e.cleared_reason for e in events if e.kind == apb.EVENT_KIND_CLEARED} == {
        CloseReason.RISK_FELL.value,
        CloseReason.GPU_DARK.value,
    }


def test_hysteresis_holds_an_alert_between_the_levels_and_a_single_spike_opens_nothing() -> None:
    policy = AlertPolicy(k=2, clear_steps=3, hold_ratio=0.5, dark_steps=2)
    tracker = IncidentTracker(policy, [0.6], 2, NODE_LEVEL_MODES)
    slots, both = np.array([0, 1]), np.ones(2, dtype=bool)
    modes = ["hbm_wear", "hbm_wear"]
    trace = [(0.9, 0.9), (0.1, 0.9), (0.1, 0.5), (0.1, 0.4), (0.1, 0.35), (0.1, 0.2), (0.1, 0.2), (0.1, 0.2)]
    log: list[tuple[int, str, int]] = []
    for t, (a, b) in enumerate(trace):
        (changes,) = tracker.update(t, slots, np.array([a, b]), both, modes)
        log += [(t, "open", i.gpu) for i in changes.opened] + [(t, "close", i.gpu) for i in changes.closed]
    # GPU 0: one spike (k=2): nothing. GPU 1: opens at its second score, holds at 0.5, 0.4 and 0.35
    # (above the hold level 0.3, under the threshold), clears after three scores under the hold level.
    assert log == [(1, "open", 1), (7, "close", 1)]


def test_a_gpu_goes_dark_only_after_dark_steps_absent_steps() -> None:
    tracker = IncidentTracker(AlertPolicy(k=1, clear_steps=3, dark_steps=2), [0.5], 2, NODE_LEVEL_MODES)
    slots, modes = np.array([0, 1]), ["power", "power"]
    tracker.update(0, slots, np.array([0.9, 0.1]), np.ones(2, dtype=bool), modes)
    (gone_once,) = tracker.update(1, slots, np.array([np.nan, 0.1]), np.array([False, True]), modes)
    (back,) = tracker.update(2, slots, np.array([0.9, 0.1]), np.ones(2, dtype=bool), modes)
    assert gone_once.closed == ()
    assert back.opened == ()
    tracker.update(3, slots, np.array([np.nan, 0.1]), np.array([False, True]), modes)
    (gone,) = tracker.update(4, slots, np.array([np.nan, 0.1]), np.array([False, True]), modes)
    assert [(i.gpu, i.reason) for i in gone.closed] == [(0, CloseReason.GPU_DARK)]


# -- the alert book -------------------------------------------------------------------------


def test_one_alert_per_gpu_escalates_then_clears_and_the_log_keeps_it(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(
        model, store, ServiceMetrics(), actions=ActionPolicy(_migrate_within_s(model), migrate_risk=0.9)
    )
    hot = model.threshold + (1 - model.threshold) / 4
    low, g = model.policy.hold(model.threshold) / 10, model.feature_config.gpus_per_node
    events: list[apb.Alert] = []
    for t in range(6):  # GPU 5 above the threshold, failure further than 10 minutes away
        events += book.observe(
            [_step(model, "n1", 100 + t, [low] * 5 + [hot] + [low] * (g - 6), "hbm_wear", 1500.0)]
        )
    assert [(e.kind, e.gpu, e.action) for e in events] == [
        (apb.EVENT_KIND_OPENED, 5, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    ]
    first = events[0]
    assert first.id == first.opened_id > 0
    assert first.HasField("time_to_failure")
    assert first.HasField("model")
    ttf = first.time_to_failure
    assert ttf.reference_time_unix_nano == first.time_unix_nano
    assert 0 <= ttf.p10_seconds <= ttf.p50_seconds <= ttf.p90_seconds <= model.horizon_s
    assert [w.seconds for w in ttf.risk_within] == [300.0, 900.0, 1800.0]
    assert first.model.threshold == model.threshold
    assert first.model.hold_threshold == pytest.approx(model.policy.hold(model.threshold))
    events = book.observe([_step(model, "n1", 106, [low] * 5 + [hot] + [low] * (g - 6), "hbm_wear", 300.0)])
    assert [(e.kind, e.state, e.opened_id, e.action) for e in events] == [
        (apb.EVENT_KIND_UPDATED, apb.ALERT_STATE_OPEN, first.id, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE)
    ]
    assert [a.id for a in book.active()] == [events[0].id]
    for t in range(model.policy.clear_steps):
        events = book.observe([_step(model, "n1", 107 + t, [low] * g, "hbm_wear")])
    assert [(e.kind, e.opened_id, e.clear_reason) for e in events] == [
        (apb.EVENT_KIND_CLEARED, first.id, apb.CLEAR_REASON_RISK_FELL)
    ]
    assert book.active() == []
    assert [a.id for a in store.alerts.read_after(0)] == [first.id, first.id + 1, first.id + 2]
    store.close()


def test_a_long_precursor_with_a_change_of_mode_is_one_alert_with_updates_and_one_drain(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    store.jobs.register("job-1", ["n5"])
    metrics = ServiceMetrics()
    book = AlertBook(model, store, metrics, actions=ActionPolicy(migrate_within_s=900, migrate_risk=0.99))
    actuator = NoopActuator()
    clock = Clock()
    remediator = Remediator(store, actuator, metrics, grace_s=60.0, clock=clock)
    book.listen(remediator.on_alerts)
    g = model.feature_config.gpus_per_node
    hot = [0.0] * 3 + [min(0.98, model.threshold * 3)] + [0.0] * (g - 4)
    events: list[apb.Alert] = []
    # Three hours above the threshold (six model horizons): power first, then NVLink; the failure
    # draws nearer (30 -> 10 -> 3 min), so the action escalates to snapshot-and-migrate.
    for t in range(180):
        mode = "power" if t < 60 else "nvlink"
        ttf = 1700.0 if t < 100 else 600.0 if t < 170 else 200.0
        events += book.observe([_step(model, "n5", 1000 + t, hot, mode, ttf)])
        remediator.run_once()
        clock.now += 60.0
    kinds = [e.kind for e in events]
    assert kinds.count(apb.EVENT_KIND_OPENED) == 1
    assert apb.EVENT_KIND_CLEARED not in kinds
    assert {e.opened_id for e in events} == {events[0].id}
    modes = [e.mode for e in events]
    assert modes[0] == apb.FAILURE_MODE_POWER
    assert modes[-1] == apb.FAILURE_MODE_NVLINK
    assert len(events) <= 6  # mode change, escalation and nearer bands: a handful, not one per score
    ack = remediator.on_ack(Ack(events[-1].id, "job-1", apb.ACK_ACTION_SNAPSHOT_DONE, 7, "file:///s"))
    assert "already" in ack  # the grace period passed long ago: it was drained once, then
    remediator.run_once()
    assert [(r.node, r.alert_id) for r in actuator.seen] == [("n5", events[0].id)]
    (active,) = [s for s in metrics.registry.collect() if s.name == "faultcast_active_alerts"]
    by_mode = {x.labels["mode"]: x.value for x in active.samples}
    assert by_mode.get("nvlink") == 1
    assert by_mode.get("power", 0) == 0
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
    assert list(events[0].gpus) == list(range(g))
    store.close()


def test_open_alerts_survive_a_restart_and_ids_keep_increasing(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "n3", 50 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
    opened = store.alerts.open_now()
    store.close()
    reopened = StateStore.in_dir(tmp_path)
    book = AlertBook(model, reopened, ServiceMetrics())
    assert [a.id for a in book.active()] == [a.id for a in opened]
    events: list[apb.Alert] = []
    for t in range(model.policy.dark_steps):
        dark = replace(_step(model, "n3", 53 + t, [0.0] * g, "hbm_wear"), present=np.zeros(g, dtype=bool))
        events += book.observe([dark])
    assert [(e.kind, e.opened_id, e.clear_reason) for e in events] == [
        (apb.EVENT_KIND_CLEARED, opened[0].id, apb.CLEAR_REASON_GPU_DARK)
    ]
    assert events[0].id > opened[0].id
    reopened.close()


def test_the_time_to_failure_quantiles_come_from_the_buckets() -> None:
    risk = np.array([0.5, 0.5, 0.5])
    within = np.array([[0.4, 0.45, 0.5], [0.0, 0.25, 0.5], [0.0, 0.0, 0.5]])  # 5/15/30 minutes
    p10, p50, p90 = ttf_quantiles(risk, within, 1800.0).T
    assert p50[0] < 300 < p50[1] <= 900 < p50[2] <= 1800
    assert p50[1] == pytest.approx(900.0)
    assert (p10 <= p50).all()
    assert (p50 <= p90).all()
    assert p10[0] == pytest.approx(37.5)  # 10% of the conditional mass, 80% of it in the first 300 s
    assert p90[2] == pytest.approx(900.0 + 0.9 * 900.0)
    # The last bucket reaches the model's horizon, whatever it is; a missing risk has no estimate.
    hour = ttf_quantiles(np.array([0.5, np.nan]), np.array([[0.0, 0.0, 0.5], [0.1, 0.2, 0.3]]), 3600.0)
    assert hour[0].tolist() == pytest.approx([900.0 + 0.1 * 2700, 900.0 + 0.5 * 2700, 900.0 + 0.9 * 2700])
    assert np.isnan(hour[1]).all()
    short = ttf_quantiles(np.array([0.5]), np.array([[0.0, 0.0, 0.5]]), 600.0)
    assert (short <= 600.0).all()


def test_a_node_sending_is_never_silent_and_one_whose_clock_stands_still_is(
    model: FaultModel, tmp_path: Path
) -> None:
    # Any sample counts as speaking (a step of 60 scrapes completes once a minute), but only one that
    # moves the node's event time on: a frozen clock sends nothing new.
    store = StateStore.in_dir(tmp_path)
    clock = Clock()
    book = AlertBook(model, store, ServiceMetrics(), silent_after_steps=1, clock=clock)
    g = model.feature_config.gpus_per_node
    quiet = [0.0] * g
    for name in ("scraping", "frozen", "calm"):
        book.observe([_step(model, name, 300, quiet, "hbm_wear")])
    for second in range(1, 181):  # three minutes: "calm" completes a step each minute
        clock.now += 1.0
        book.arrived("scraping", 300 * 60.0 + second)  # a scrape a second, no step completed
        book.arrived("frozen", 300 * 60.0 + 1.0)  # the same stamp each time
        if second % 60 == 0:
            book.observe([_step(model, "calm", 300 + second // 60, quiet, "hbm_wear")])
        book.check_silence()
    assert book.silent_nodes() == {"frozen": False}
    store.close()


def test_the_scorer_keeps_the_cursors_of_a_nodes_newest_spools_only(model: FaultModel) -> None:
    scorer = Scorer(model)
    (snapshot,) = twin_snapshots(
        TwinSource(FleetConfig(nodes=2, days=1.0, seed=3, acceleration=1.0), 1), "n", 1
    )
    for spool in range(1, 13):  # a collector restarted twelve times, a spool each
        scorer.add(
            replace(snapshot, spool_id=spool, sequence=1, time_unix_nano=snapshot.time_unix_nano + spool), 0.0
        )
    assert sorted(spool for _, spool in scorer.cursors()) == list(range(5, 13))


def test_a_node_that_falls_silent_clears_its_alerts_and_is_counted_across_a_restart(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    metrics = ServiceMetrics()
    clock = Clock()
    book = AlertBook(model, store, metrics, silent_after_steps=5, clock=clock)
    g = model.feature_config.gpus_per_node
    quiet = [0.0] * g
    for t in range(3):
        book.observe([_step(model, "sick", 200 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
        book.observe([_step(model, "calm", 200 + t, quiet, "hbm_wear")])
        clock.now += 60.0
    (alert,) = book.active()
    for t in range(3, 7):  # "sick" stops sending after step 202; "calm" goes on
        book.observe([_step(model, "calm", 200 + t, quiet, "hbm_wear")])
        assert book.check_silence() == []
        clock.now += 60.0
    book.observe([_step(model, "calm", 207, quiet, "hbm_wear")])  # 5 minutes after "sick" was last heard
    (cleared,) = book.check_silence()
    assert (cleared.kind, cleared.opened_id, cleared.clear_reason) == (
        apb.EVENT_KIND_CLEARED,
        alert.id,
        apb.CLEAR_REASON_NODE_SILENT,
    )
    assert "may be the predicted failure" in cleared.cleared_reason
    assert book.active() == []
    assert book.silent_nodes() == {"sick": True}
    text = generate_latest(metrics.registry).decode()
    assert 'faultcast_node_silent{during_incident="true",node="sick"} 1.0' in text
    assert "faultcast_silent_nodes 1.0" in text
    assert 'faultcast_failure_risk{gpu="0",node="sick"}' not in text  # no frozen risk
    assert 'faultcast_failure_risk{gpu="0",node="calm"}' in text
    # A restart remembers the silent node (its page must not resolve itself) ...
    restarted_metrics = ServiceMetrics()
    restarted = AlertBook(model, store, restarted_metrics, silent_after_steps=5, clock=clock)
    assert restarted.silent_nodes() == {"sick": True}
    assert 'during_incident="true",node="sick"} 1.0' in generate_latest(restarted_metrics.registry).decode()
    # ... until it speaks again.
    restarted.observe([_step(model, "sick", 208, quiet, "hbm_wear")])
    assert restarted.silent_nodes() == {}
    assert "faultcast_silent_nodes 0.0" in generate_latest(restarted_metrics.registry).decode()
    assert AlertBook(model, store, ServiceMetrics()).silent_nodes() == {}
    # The whole fleet quiet at once: the service is the one cut off, no node is marked silent.
    clock.now += 3600.0
    assert restarted.check_silence() == []
    assert restarted.silent_nodes() == {}
    store.close()


def test_a_node_whose_samples_come_late_is_not_silent(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    clock = Clock()
    book = AlertBook(model, store, ServiceMetrics(), silent_after_steps=5, clock=clock)
    g = model.feature_config.gpus_per_node
    opened: list[apb.Alert] = []
    for t in range(30):  # "slow" replays its spool (or its clock is behind): 10 steps behind "fast"
        opened += book.observe([_step(model, "slow", 100 + t, [0.5] + [0.0] * (g - 1), "hbm_wear")])
        book.observe([_step(model, "fast", 110 + t, [0.0] * g, "hbm_wear")])
        clock.now += 60.0
        assert book.check_silence() == []
    assert [e.kind for e in opened] == [apb.EVENT_KIND_OPENED]  # one alert, held throughout
    assert book.silent_nodes() == {}
    store.close()


def test_an_alert_left_open_by_a_run_whose_node_never_returns_clears_as_silent(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "gone", 300 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
        book.observe([_step(model, "back", 300 + t, [0.95] * 2 + [0.0] * (g - 2), "hbm_wear")])
    store.close()
    reopened = StateStore.in_dir(tmp_path)
    clock = Clock()
    book = AlertBook(model, reopened, ServiceMetrics(), silent_after_steps=5, clock=clock)
    assert len(book.active()) == 3
    for t in range(5):  # "back" returns at once and keeps its two alerts; "gone" never does
        events = book.observe([_step(model, "back", 400 + t, [0.95] * 2 + [0.0] * (g - 2), "hbm_wear")])
        assert [e for e in events if e.kind != apb.EVENT_KIND_UPDATED] == []  # the same two alerts
        assert book.check_silence() == []
        clock.now += 60.0
    (cleared,) = book.check_silence()
    assert (cleared.node, cleared.clear_reason) == ("gone", apb.CLEAR_REASON_NODE_SILENT)
    assert {a.node for a in book.active()} == {"back"}
    assert {a.node for a in reopened.alerts.open_now()} == {"back"}
    reopened.close()


def test_a_restart_restores_overlapping_alerts_without_orphans(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    g = model.feature_config.gpus_per_node
    # A node-level alert and a GPU alert on the same node, as a previous run left them (the node-level
    # one's GPU list stale: it names GPU 1, which the GPU alert holds).
    node_alert, gpu_alert, duplicate = store.alerts.append(
        [
            apb.Alert(
                node="n9",
                gpu=-1,
                mode=apb.FAILURE_MODE_NETWORK,
                state=apb.ALERT_STATE_OPEN,
                kind=apb.EVENT_KIND_OPENED,
                time_unix_nano=600 * 60 * 10**9,
                gpus=[0, 1],
            ),
            apb.Alert(
                node="n9",
                gpu=1,
                mode=apb.FAILURE_MODE_HBM_WEAR,
                state=apb.ALERT_STATE_OPEN,
                kind=apb.EVENT_KIND_OPENED,
                time_unix_nano=600 * 60 * 10**9,
                gpus=[1],
            ),
            # A second alert on GPU 1 (a state an earlier bug could leave): it has no GPU of its own left.
            apb.Alert(
                node="n9",
                gpu=1,
                mode=apb.FAILURE_MODE_POWER,
                state=apb.ALERT_STATE_OPEN,
                kind=apb.EVENT_KIND_OPENED,
                time_unix_nano=600 * 60 * 10**9,
                gpus=[1],
            ),
        ]
    )
    metrics = ServiceMetrics()
    book = AlertBook(model, store, metrics)
    events: list[apb.Alert] = []
    for t in range(model.policy.clear_steps + 1):
        events += book.observe([_step(model, "n9", 601 + t, [0.0] * g, "hbm_wear")])
    assert sorted((e.opened_id, e.clear_reason) for e in events) == [
        (node_alert.id, apb.CLEAR_REASON_RISK_FELL),
        (gpu_alert.id, apb.CLEAR_REASON_RISK_FELL),
        (duplicate.id, apb.CLEAR_REASON_SUPERSEDED),
    ]
    assert book.active() == []
    assert store.alerts.open_now() == []
    (active,) = [m for m in metrics.registry.collect() if m.name == "faultcast_active_alerts"]
    assert all(sample.value == 0 for sample in active.samples)
    store.close()


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


class _Raising:
    name = "raising"

    def remediate(self, remediation: Remediation) -> Outcome:
        raise RuntimeError("scheduler exploded")


def _remediator(store: StateStore, clock: Clock, **kw: object) -> tuple[Remediator, NoopActuator]:
    actuator = NoopActuator()
    remediator = Remediator(store, actuator, ServiceMetrics(), grace_s=60.0, clock=clock, **kw)  # type: ignore[arg-type]
    return remediator, actuator


def test_without_snapshot_done_the_node_is_drained_after_the_grace_period(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), Clock()
    store.jobs.register("j1", ["a", "b"])
    remediator, actuator = _remediator(store, clock)
    migrate = migrate_alert(store, "a")
    declined = migrate_alert(store, "b")
    no_job = migrate_alert(store, "c")
    snapshot_only = migrate_alert(store, "b", action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
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
    assert store.remediations.of(migrate.id) == ("ok", "noop: would drain a")
    store.close()


def test_the_circuit_breaker_caps_nodes_taken_out_and_an_actuator_bug_is_contained(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), Clock()
    nodes = [f"n{i}" for i in range(4)]
    store.jobs.register("big", nodes)
    remediator, _actuator = _remediator(store, clock, breaker=CircuitBreaker(max_nodes=2, window_s=600))
    answers = []
    for node in nodes:
        alert = migrate_alert(store, node)
        answers.append(remediator.on_ack(Ack(alert.id, "big", apb.ACK_ACTION_SNAPSHOT_DONE, 1, "")))
    remediator.run_once()
    outcomes = {r.node: (outcome, detail) for r, outcome, detail in remediator.done}
    assert {node: outcome for node, (outcome, _) in outcomes.items()} == {
        "n0": "ok",
        "n1": "ok",
        "n2": "refused",
        "n3": "refused",
    }
    assert "circuit breaker" in outcomes["n2"][1]
    # Each job heard what was decided: drained, or refused by the breaker (decided at its ack).
    assert [a.split(":")[0] for a in answers] == ["noop", "noop", "refused", "refused"]
    assert remediator.breaker.is_open(clock.now)
    clock.now += 601
    assert not remediator.breaker.is_open(clock.now)
    # No retries here (tests/test_remediation_retry.py has them): the one failure is final.
    broken = Remediator(store, _Raising(), ServiceMetrics(), clock=clock, retry=RetryPolicy(max_attempts=1))
    store.jobs.register("big", [*nodes, "n4"])
    alert = migrate_alert(store, "n4")  # n0..n1 are out already
    broken.on_ack(Ack(alert.id, "big", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    broken.run_once()
    assert broken.done[0][1:] == ("failed", "RuntimeError: scheduler exploded; gave up after 1 attempt")
    store.close()


def test_a_reload_that_restarts_the_features_keeps_open_alerts_for_the_new_model_to_judge(
    model: FaultModel, tmp_path: Path
) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics())
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "n4", 70 + t, [0.95] + [0.0] * (g - 1), "hbm_wear")])
    (opened,) = book.active()
    book.swap_model(model, carried_over=False)
    assert book.observe([_step(model, "n4", 73, [0.95] + [0.0] * (g - 1), "hbm_wear")]) == []
    assert [a.opened_id for a in book.active()] == [opened.id]  # the same alert, not a new one
    events: list[apb.Alert] = []
    for t in range(model.policy.clear_steps):
        events += book.observe([_step(model, "n4", 74 + t, [0.0] * g, "hbm_wear")])
    assert [(e.opened_id, e.clear_reason) for e in events] == [(opened.id, apb.CLEAR_REASON_RISK_FELL)]
    assert book.active() == []
    store.close()


def test_two_alerts_on_one_node_drain_it_once_in_one_process_and_across_a_restart(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), Clock()
    store.jobs.register("j1", ["a"])
    remediator, actuator = _remediator(store, clock)
    first = migrate_alert(store, "a")
    second = migrate_alert(store, "a")
    remediator.on_alerts([first, second])  # both grace timers fall due in the same pass
    clock.now += 61
    remediator.run_once()
    assert [r.alert_id for r in actuator.seen] == [first.id]
    # Both acknowledged before the worker wakes: still once.
    store2, clock2 = StateStore.in_dir(tmp_path / "two"), Clock()
    store2.jobs.register("j1", ["a"])
    remediator2, actuator2 = _remediator(store2, clock2)
    one, two = (migrate_alert(store2, "a") for _ in range(2))
    assert "noop: drain a" in remediator2.on_ack(Ack(one.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    assert "not drained twice" in remediator2.on_ack(Ack(two.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    remediator2.run_once()
    assert [r.alert_id for r in actuator2.seen] == [one.id]
    # A new process (a restart) with the first alert still open: the node is not drained again.
    restarted, after = _remediator(store, clock)
    third = migrate_alert(store, "a")
    assert "not drained twice" in restarted.on_ack(Ack(third.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    restarted.run_once()
    assert after.seen == []
    store.close()
    store2.close()


def test_a_grace_timer_survives_an_earlier_snapshot_and_a_restart(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), Clock()
    store.jobs.register("j1", ["a", "b"])
    remediator, actuator = _remediator(store, clock)
    # SNAPSHOT_DONE while the alert only asked for a snapshot; then it escalates and the job hangs.
    snapshot = migrate_alert(store, "a", action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY)
    remediator.on_ack(Ack(snapshot.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 3, "file:///s"))
    escalated = apb.Alert()
    escalated.CopyFrom(snapshot)
    escalated.id, escalated.kind, escalated.action = (
        0,
        apb.EVENT_KIND_UPDATED,
        apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
    )
    (escalated,) = store.alerts.append([escalated])
    remediator.on_alerts([escalated])
    clock.now += 61
    remediator.run_once()
    assert [r.alert_id for r in actuator.seen] == [snapshot.id]
    # A restart in the middle of a grace period: the timer is armed again.
    waiting = migrate_alert(store, "b")
    remediator.on_alerts([waiting])
    restarted, after = _remediator(store, clock)
    restarted.resume()
    clock.now += 61
    restarted.run_once()
    assert [r.alert_id for r in after.seen] == [waiting.id]
    store.close()


def test_only_a_score_at_the_threshold_escalates_an_alert(model: FaultModel, tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(
        model, store, ServiceMetrics(), actions=ActionPolicy(_migrate_within_s(model), migrate_risk=0.99)
    )
    g = model.feature_config.gpus_per_node
    hot, held = model.threshold * 1.5, model.threshold * 0.8  # above the threshold; between the levels
    events: list[apb.Alert] = []
    for t in range(3):
        events += book.observe([_step(model, "n7", 500 + t, [hot] + [0.0] * (g - 1), "hbm_wear", 1500.0)])
    for t in range(3, 6):  # the failure looks near, but the score is under the threshold
        events += book.observe([_step(model, "n7", 500 + t, [held] + [0.0] * (g - 1), "hbm_wear", 200.0)])
    assert {e.action for e in events} == {apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY}
    events = book.observe([_step(model, "n7", 506, [hot] + [0.0] * (g - 1), "hbm_wear", 200.0)])
    assert [e.action for e in events] == [apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE]
    store.close()
