"""The remediator and the prescheduler together: the hand-over is claimed on disk before
the standby is told to go, a repeated acknowledgement hears the same decision (so the job holds
again), the grace timer and a restart find the hand-over and never requeue beside the standby, and
a paused remediation hands nothing over. The standby's long poll runs on a real thread; the
provider records (the scheduler's side is tested on real Slurm)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import NoopActuator, Remediation
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.remediation.spares.prescheduler import HandOverReply, Prescheduler, SpareState
from faultcast.service.state.acks import Ack
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clock, migrate_alert
from tests.test_spares import WAIT_S, RecordingProvider, _claim, _until

URI = "file:///ckpt/step-000000035"


@dataclass
class Parts:
    store: StateStore
    clock: Clock
    provider: RecordingProvider
    prescheduler: Prescheduler
    actuator: NoopActuator
    remediator: Remediator


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    store, clock, provider = StateStore.in_dir(tmp_path), Clock(), RecordingProvider(standby_job="s1")
    store.jobs.register("j1", ["a"])
    metrics = ServiceMetrics()
    prescheduler = Prescheduler(provider, store.jobs.all, metrics, give_back_after_s=0.0)
    prescheduler.note_job("j1", stands_by=True)
    prescheduler.start()
    actuator = NoopActuator()
    remediator = Remediator(store, actuator, metrics, grace_s=60.0, clock=clock, prescheduler=prescheduler)
    yield Parts(store, clock, provider, prescheduler, actuator, remediator)
    prescheduler.stop()
    store.close()


def _warned(parts: Parts) -> tuple[apb.Alert, threading.Thread, list[HandOverReply]]:
    """A snapshot-and-migrate alert on the job's node, its spare asked for, its standby waiting."""
    alert = migrate_alert(parts.store, "a")
    parts.prescheduler.on_alerts([alert])
    parts.remediator.on_alerts([alert])
    parts.prescheduler.drain_calls()
    answers: list[HandOverReply] = []
    standby = threading.Thread(
        target=lambda: answers.append(
            parts.prescheduler.await_hand_over(
                "j1", "s1", "c", WAIT_S, claim=_claim(parts.prescheduler, "j1")
            )
        )
    )
    standby.start()
    _until(
        "the standby to wait", lambda: (s := parts.prescheduler.spare_of("j1")) is not None and s.waiting == 1
    )
    return alert, standby, answers


def _done(alert: apb.Alert) -> Ack:
    return Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 35, URI)


def test_the_hand_over_is_on_disk_before_the_standby_goes_and_a_repeat_hears_it_again(parts: Parts) -> None:
    alert, standby, answers = _warned(parts)

    reply = parts.remediator.on_ack(_done(alert))
    standby.join(WAIT_S)

    assert reply == "noop: drain a and hand job j1 over to standby s1"
    assert answers == [HandOverReply(apb.HAND_OVER_STATE_GO, alert.id, 35, URI)]
    stored = Remediation(**json.loads(parts.store.remediations.request_of(alert.id)))
    assert (stored.handover_to, stored.requeue, stored.checkpoint_uri) == ("s1", False, URI)
    # The job asks again (its first answer was lost): it must hold again, not train on.
    again = parts.remediator.on_ack(_done(alert))
    assert again.startswith("noop: drain a and hand job j1 over to standby s1")
    parts.remediator.run_once()
    assert [(r.node, r.handover_to, r.requeue) for r in parts.actuator.seen] == [("a", "s1", False)]
    # The grace period passes: nothing more (the alert is claimed; no requeue beside the standby).
    parts.clock.now += 61
    parts.remediator.run_once()
    assert len(parts.actuator.seen) == 1


def test_a_restart_after_the_hand_over_carries_it_on_and_never_requeues(parts: Parts, tmp_path: Path) -> None:
    alert, standby, _ = _warned(parts)
    parts.remediator.on_ack(_done(alert))
    standby.join(WAIT_S)
    # The service dies before the worker ran the actuator; the next one resumes from the store.
    actuator = NoopActuator()
    restarted = Remediator(parts.store, actuator, ServiceMetrics(), grace_s=60.0, clock=parts.clock)
    assert restarted.resume() == 1
    restarted.run_once()
    parts.clock.now += 61
    restarted.run_once()
    assert [(r.handover_to, r.requeue) for r in actuator.seen] == [("s1", False)]


def test_paused_remediation_hands_nothing_over_and_releases_the_spare(parts: Parts) -> None:
    alert, standby, answers = _warned(parts)
    parts.remediator.set_paused("operator")

    reply = parts.remediator.on_ack(_done(alert))
    standby.join(WAIT_S)
    parts.prescheduler.drain_calls()

    assert "hand" not in reply
    assert answers[0].state == apb.HAND_OVER_STATE_RELEASED
    assert parts.provider.released == [
        (f"standby-{alert.id}", "remediation is paused or the circuit breaker is open")
    ]
    spare = parts.prescheduler.spare_of("j1")
    assert spare is not None
    assert spare.state == SpareState.RELEASED


def test_without_a_standby_waiting_the_job_is_requeued_as_before(parts: Parts) -> None:
    alert = migrate_alert(parts.store, "a")
    parts.prescheduler.on_alerts([alert])
    parts.remediator.on_alerts([alert])
    parts.prescheduler.drain_calls()

    reply = parts.remediator.on_ack(_done(alert))
    parts.remediator.run_once()
    parts.prescheduler.drain_calls()

    assert reply == "noop: drain a and requeue job j1"
    assert [(r.handover_to, r.requeue) for r in parts.actuator.seen] == [("", True)]
    assert parts.provider.released == [(f"standby-{alert.id}", "no standby waiting at the snapshot")]
    # A repeat is told the same, so the job holds for its requeue.
    assert parts.remediator.on_ack(_done(alert)).startswith("noop: drain a and requeue job j1")
