"""Attack: a restart of the service while a spare is readied. The scheduler keeps the standby
running, but the prescheduler held its spares in memory only: after the restart the standby heard
"no spare was asked for job ..." and exited, its node spent for nothing, and the job's snapshot found
no standby to hand over to. The spares are now kept in the state store; a restart takes them back,
the standby asks again with the same claim and is handed the job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareSetting, SpareState
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.test_spares import JOBS, RecordingProvider, _alert, _claim

JOB, NODE = "job-1", "node-a"
STANDBY = "standby-7"  # the job id the provider's standby runs under (its handle)
URI = "file:///ckpt/step-000000035"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore.in_dir(tmp_path)
    yield opened
    opened.close()


def _started(store: StateStore, provider: RecordingProvider) -> Prescheduler:
    """A prescheduler as a service starts one: its spares kept in the store's settings."""
    prescheduler = Prescheduler(
        provider, lambda: JOBS, ServiceMetrics(), give_back_after_s=0.0, kept=SpareSetting(store.settings)
    )
    prescheduler.note_job(JOB, stands_by=True)
    prescheduler.start()
    return prescheduler


def test_a_spare_readied_before_a_restart_is_handed_the_job_after_it(store: StateStore) -> None:
    provider = RecordingProvider()
    first = _started(store, provider)
    first.on_alerts([_alert(7, NODE)])
    first.drain_calls()
    claim = _claim(first, JOB)
    assert (
        first.await_hand_over(JOB, STANDBY, "node-z", 0.0, claim=claim).state == apb.HAND_OVER_STATE_WAITING
    )
    first.drain_calls()
    first.stop()  # the service restarts: the scheduler keeps the standby running

    second = _started(store, provider)
    try:
        spare = second.spare_of(JOB)
        assert spare is not None
        assert (spare.request.alert_id, spare.handle, spare.state) == (7, STANDBY, SpareState.ASKED)
        second.on_alerts([_alert(7, NODE)])  # the alert, taken back open, asks for no second spare
        second.drain_calls()
        assert len(provider.prepared) == 1
        held = second.arrive(JOB, STANDBY, "node-z", claim=claim)  # the standby asks again: held
        assert held is spare
        assert spare.state == SpareState.READY
        handed = second.hand_over(JOB, 7, 35, URI)  # the job's snapshot: a standby is waiting
        assert handed is spare
        assert second.leave(spare).state == apb.HAND_OVER_STATE_GO
        second.drain_calls()
    finally:
        second.stop()

    third = _started(store, provider)  # told to go just before another restart: it hears it again
    try:
        reply = third.await_hand_over(JOB, STANDBY, "node-z", 0.0, claim=claim)
        assert (reply.state, reply.step, reply.checkpoint_uri) == (apb.HAND_OVER_STATE_GO, 35, URI)
    finally:
        third.stop()


def test_a_released_spare_is_not_taken_back_and_a_wrong_claim_is_still_refused(store: StateStore) -> None:
    provider = RecordingProvider()
    first = _started(store, provider)
    first.on_alerts([_alert(7, NODE), _alert(8, "node-c")])
    first.drain_calls()
    claim = _claim(first, JOB)
    first.on_alerts([_alert(8, "node-c", state=apb.ALERT_STATE_CLEARED, reason=apb.CLEAR_REASON_RISK_FELL)])
    first.drain_calls()
    first.stop()

    second = _started(store, provider)
    try:
        assert second.spare_of("job-2") is None  # released: over
        reply = second.await_hand_over(JOB, STANDBY, "node-z", 0.0, claim=claim)
        assert reply.state == apb.HAND_OVER_STATE_WAITING
        with pytest.raises(Exception, match="claim"):
            second.await_hand_over(JOB, STANDBY, "node-z", 0.0, claim="forged")
    finally:
        second.stop()


def test_unreadable_kept_spares_start_the_service_without_them(store: StateStore) -> None:
    store.settings.save(SpareSetting.KEY, '[{"request": 1}]')
    prescheduler = _started(store, RecordingProvider())
    try:
        assert prescheduler.spare_of(JOB) is None
    finally:
        prescheduler.stop()
