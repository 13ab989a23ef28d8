"""The trainer's Guard against a real service: a snapshot request arrives, the acknowledgement drains
the node; an absent service never stops training and the guard connects once the service is up."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from faultcast.client import Guard
from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.scoring import model_version
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.testing.system import refused_port
from faultcast.v1 import alerts_pb2 as apb

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU, FAIL_S = 2, 3, 10 * 3600.0
NAME = FLEET.node_name(NODE)
WAIT_S = 30.0


def test_the_guard_asks_for_a_snapshot_and_its_acknowledgement_drains_the_node(
    service_model: Path, tmp_path: Path
) -> None:
    actuator = NoopActuator()
    service = Service.open(
        service_model, tmp_path, ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0)), actuator=actuator
    )  # loads the model; binds nothing until start
    with refused_port() as port:  # the guard's address: refused, and no other process can listen there
        guard = Guard(f"127.0.0.1:{port}", "job-g", [NAME], backoff_s=(0.05, 0.2)).start()
        # No service yet: training goes on, nothing to snapshot, acknowledgements are not sent.
        no_service = (guard.should_snapshot(), guard.snapshot_done(0, "file:///x"), guard.connected)
    # The port is handed on here, released and bound again at once, as a restarted service would.
    try:
        assert no_service == (False, "no alert pending", False)
        service.start(f"127.0.0.1:{port}")
        try:
            assert guard.wait_connected(WAIT_S), guard.last_error
            assert service.store.jobs.all() == {"job-g": [NAME]}  # the guard registered its job
            source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                push(channel, NAME, twin_snapshots(source, NAME, int((FAIL_S - 5 * 60) / 60)))
            service.score_now()
            # The alert may open asking for a snapshot only and escalate steps later: the guard's
            # pending request is the newest event of the alert once it has seen that event.
            (newest,) = service.store.alerts.open_now()
            assert guard.wait_seen(newest.id, WAIT_S)
            alert = guard.pending()
            assert alert is not None
            assert (alert.node, alert.gpu) == (NAME, GPU)
            assert guard.should_snapshot()
            if alert.action != apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE:
                raise AssertionError(f"5 min before the failure the alert says {alert.action}")
            reply = guard.snapshot_done(1234, "file:///ckpt/1234")
            assert f"drain {NAME}" in reply
            assert not guard.should_snapshot()
            assert service.remediator.wait_done(1, WAIT_S)
            assert actuator.seen[0].checkpoint_uri == "file:///ckpt/1234"
            assert guard.last_id >= alert.id
        finally:
            service.stop(0)
        assert guard.wait_connected(WAIT_S, connected=False)
        assert guard.last_error
    finally:
        guard.close()


def test_the_guard_starts_from_open_alerts_resumes_after_the_marker_and_survives_a_stale_cursor(
    service_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="faultcast.client.guard")
    service = Service.open(service_model, tmp_path, ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0)))
    port = service.start("127.0.0.1:0")
    store = service.store
    (stale,) = store.alerts.append([_open(apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, gpu=0)])
    store.alerts.append([apb.Alert(node=NAME, gpu=0, state=apb.ALERT_STATE_CLEARED, opened_id=stale.id)])
    (still,) = store.alerts.append([_open(apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY, gpu=1)])
    guard = Guard(f"127.0.0.1:{port}", "job-c", [NAME], backoff_s=(0.05, 0.2))
    guard.last_id = store.alerts.last_id + 1000  # a cursor from a log this service never had
    try:
        guard.start()
        assert guard.wait_caught_up(WAIT_S), guard.last_error
        # Refused (OUT_OF_RANGE), it started over from the alerts open now: not the cleared one.
        pending = guard.pending()
        assert pending is not None
        assert pending.id == still.id
        assert guard.last_id == store.alerts.last_id  # the marker's head: a reconnect resumes after it
        assert guard.model is not None
        assert guard.model.version == model_version(service.model)
        assert any(
            "caught up" in r.getMessage() and guard.model.version in r.getMessage() for r in caplog.records
        )
        assert any("refused cursor" in r.getMessage() for r in caplog.records)
    finally:
        guard.close()
        service.stop(0)


def _open(action: apb.RecommendedAction.ValueType, gpu: int) -> apb.Alert:
    return apb.Alert(node=NAME, gpu=gpu, state=apb.ALERT_STATE_OPEN, risk=0.5, action=action)


def test_an_update_asks_for_another_snapshot_only_when_it_escalates(
    service_model: Path, tmp_path: Path
) -> None:
    service = Service.open(service_model, tmp_path)
    port = service.start("127.0.0.1:0")
    guard = Guard(f"127.0.0.1:{port}", "job-u", [NAME], backoff_s=(0.05, 0.2)).start()
    try:
        assert guard.wait_connected(WAIT_S), guard.last_error
        assert guard.wait_caught_up(WAIT_S)

        def event(
            kind: apb.EventKind.ValueType, action: apb.RecommendedAction.ValueType, opened: int
        ) -> apb.Alert:
            (stored,) = service.store.alerts.append(
                [
                    apb.Alert(
                        node=NAME,
                        gpu=GPU,
                        state=apb.ALERT_STATE_OPEN,
                        kind=kind,
                        action=action,
                        opened_id=opened,
                    )
                ]
            )
            return stored

        def seen(alert: apb.Alert) -> bool:
            return guard.wait_seen(alert.id, WAIT_S)

        opened = event(apb.EVENT_KIND_OPENED, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY, 0)
        assert guard.wait_for_alert(WAIT_S) is not None
        guard.snapshot_done(10, "file:///s/10")
        # The mode or the time to failure re-estimated: nothing new to do.
        assert seen(event(apb.EVENT_KIND_UPDATED, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY, opened.id))
        assert not guard.should_snapshot()
        # Escalated to snapshot-and-migrate: one more snapshot, whose SNAPSHOT_DONE lets the drain go.
        escalated = event(apb.EVENT_KIND_UPDATED, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, opened.id)
        pending = guard.wait_for_alert(WAIT_S)
        assert pending is not None
        assert pending.id == escalated.id
        guard.snapshot_done(20, "file:///s/20")
        assert seen(event(apb.EVENT_KIND_UPDATED, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, opened.id))
        assert not guard.should_snapshot()

        # A snapshot still being written when its alert escalates (the write goes on in the
        # background) is not acknowledged for the escalation: that asks for a snapshot of its own.
        later = event(apb.EVENT_KIND_OPENED, apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY, 0)
        taken_for = guard.wait_for_alert(WAIT_S)
        assert taken_for is not None
        assert taken_for.id == later.id
        worse = event(apb.EVENT_KIND_UPDATED, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, later.id)
        assert seen(worse)
        reply = guard.snapshot_done(30, "file:///s/30", taken_for=taken_for)
        assert reply.startswith(f"not sent: alert event {worse.id}"), reply
        newer = guard.pending()
        assert newer is not None
        assert newer.id == worse.id
        # A re-estimate of the escalated alert arriving while its snapshot is written asks for no
        # more: that snapshot answers it (before, each re-estimate cost one more snapshot, and the
        # oldest alert snapshot was pruned away; seen once in CI in the end-to-end test).
        reestimate = event(apb.EVENT_KIND_UPDATED, apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, later.id)
        assert seen(reestimate)
        answered = guard.pending()
        assert answered is not None
        assert answered.id == reestimate.id
        reply = guard.snapshot_done(35, "file:///s/35", taken_for=newer)
        assert not reply.startswith("not sent"), reply
        assert not guard.should_snapshot()
    finally:
        guard.close()
        service.stop(0)


def test_a_service_that_lost_its_log_is_followed_on_its_new_log_without_a_gap(
    service_model: Path, tmp_path: Path
) -> None:
    first = Service.open(service_model, tmp_path / "a")
    port = first.start("127.0.0.1:0")  # the second service below takes the same port, as a restart would
    guard = Guard(f"127.0.0.1:{port}", "job-r", [NAME], backoff_s=(0.05, 0.2)).start()
    try:
        assert guard.wait_caught_up(WAIT_S)
        (alert,) = first.store.alerts.append(
            [
                apb.Alert(
                    node=NAME,
                    gpu=1,
                    state=apb.ALERT_STATE_OPEN,
                    kind=apb.EVENT_KIND_OPENED,
                    action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
                )
            ]
        )
        update = apb.Alert()
        update.CopyFrom(alert)
        update.id, update.kind = 0, apb.EVENT_KIND_UPDATED
        first.store.alerts.append([update])
        assert guard.wait_for_alert(WAIT_S) is not None
        guard.snapshot_done(5, "file:///s/5")
        assert guard.wait_seen(2, WAIT_S)
    finally:
        first.stop(0)
    # Another service on the same address, its state lost: its new log's ids start from the clock,
    # above every id of the old one, so the guard's cursor resumes on it and misses nothing.
    second = Service.open(service_model, tmp_path / "b")
    second.start(f"127.0.0.1:{port}")
    try:
        assert guard.wait_connected(WAIT_S), guard.last_error
        assert guard.wait_caught_up(WAIT_S)
        (fresh,) = second.store.alerts.append(
            [
                apb.Alert(
                    node=NAME,
                    gpu=5,
                    state=apb.ALERT_STATE_OPEN,
                    kind=apb.EVENT_KIND_OPENED,
                    action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
                )
            ]
        )
        assert fresh.id > alert.id
        pending = guard.wait_for_alert(WAIT_S)
        assert pending is not None
        assert pending.gpu == 5
    finally:
        guard.close()
        second.stop(0)
