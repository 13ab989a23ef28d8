"""A full state disk must not silence alerting. The probe filled the state
directory: the cursor thread died, alerts raised meanwhile were lost although their samples had been
acknowledged, and after space came back cursors were never saved again. Here the state directory is
a real 4 MiB tmpfs filled to the last byte."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.victim import NAME, STEPS_BEFORE, WAIT_S, Subscriber, push_victim, serving
from tests.disk import fill


class _HealthWatch:
    """The server's health as a Watch stream reports it, statuses queued as they come."""

    def __init__(self, channel: grpc.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        self._stream = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        self.statuses: queue.Queue[int] = queue.Queue()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            for response in self._stream:
                self.statuses.put(int(response.status))
        except grpc.RpcError:
            pass  # cancelled at the end

    def wait_for(self, status: int) -> None:
        while True:
            try:
                if self.statuses.get(timeout=WAIT_S) == status:
                    return
            except queue.Empty:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                raise AssertionError(f"health never became {name} within {WAIT_S} s") from None

    def close(self) -> None:
        self._stream.cancel()


def _full_with_an_alert_held(channel: grpc.Channel, disk: Path) -> tuple[_HealthWatch, Subscriber, Path]:
    """Fill the disk, then push the victim's samples: its alert's write is refused and held, and
    health turns NOT_SERVING. Returns the health watch, the victim's subscriber and the filler."""
    health = _HealthWatch(channel)
    health.wait_for(health_pb2.HealthCheckResponse.SERVING)
    subscriber = Subscriber(channel)
    filler = fill(disk)
    acks = push_victim(channel)
    assert acks[-1].acked_through == STEPS_BEFORE  # taken into memory, held until it can be stored
    health.wait_for(health_pb2.HealthCheckResponse.NOT_SERVING)  # the alert's write failed
    return health, subscriber, filler


def _eventually(done: Callable[[], bool]) -> bool:
    """Whether `done()` holds within WAIT_S: for what a service thread writes once a second, which
    only reading it shows."""
    poll = threading.Event()
    for _ in range(int(WAIT_S / 0.2)):
        if done():
            return True
        poll.wait(0.2)
    return done()


def test_alerts_raised_while_the_state_disk_is_full_are_kept_and_delivered_when_space_returns(
    service_model: Path, small_disk: Path, tmp_path: Path
) -> None:
    state = small_disk / "state"
    with serving(service_model, state, tmp_path) as (service, channel):
        health, subscriber, filler = _full_with_an_alert_held(channel, small_disk)
        # The health check may have turned on another write (a cursor's): wait for the alert's own.
        assert _eventually(lambda: service.metrics.state_write_failures.labels("alerts")._value.get() >= 1)
        assert service.metrics.state_writable._value.get() == 0
        assert subscriber.alerts.empty()  # nothing is published before it is durable
        filler.unlink()
        alert = subscriber.next_alert()  # the alert held meanwhile, stored and delivered
        assert alert.node == NAME
        assert alert.state == apb.ALERT_STATE_OPEN
        health.wait_for(health_pb2.HealthCheckResponse.SERVING)
        assert service.metrics.state_writable._value.get() == 1
        # The cursor thread survived the full disk: it saves again by itself.
        assert _eventually(lambda: service.store.cursors.load().get((NAME, 1)) == STEPS_BEFORE)
        subscriber.close()
        health.close()
    reopened = StateStore.in_dir(state)
    assert reopened.alerts.get(alert.id) is not None
    reopened.close()


def test_while_the_state_disk_is_full_admins_are_answered_and_writes_say_unavailable(
    service_model: Path, small_disk: Path, tmp_path: Path
) -> None:
    """Review of the fix: the alert book retried its write holding the lock a model reload needs,
    so ReloadModel and then every admin call hung; refused writes answered UNKNOWN with a traceback,
    and a pause answered UNKNOWN while it was in force."""
    state = small_disk / "state"
    with serving(service_model, state, tmp_path) as (service, channel):
        health, subscriber, filler = _full_with_an_alert_held(channel, small_disk)
        admin = apb_grpc.AdminStub(channel)
        reload = admin.ReloadModel(apb.ReloadModelRequest(), timeout=WAIT_S)
        assert not reload.loaded
        assert "refuses writes" in reload.error
        paused = admin.SetRemediation(apb.SetRemediationRequest(paused=True), timeout=WAIT_S)
        assert paused.paused  # in force at once, though not yet on disk
        assert service.remediator.paused_by is not None
        with pytest.raises(grpc.RpcError) as refused:
            apb_grpc.AlertsStub(channel).RegisterJob(
                apb.RegisterJobRequest(job_id="job-x", nodes=["node-0003"]), timeout=WAIT_S
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "retry" in str(refused.value.details())
        filler.unlink()
        assert subscriber.next_alert().node == NAME
        health.wait_for(health_pb2.HealthCheckResponse.SERVING)
        # The cursor thread stores the pause once the disk takes it.
        assert _eventually(lambda: service.store.settings.get("remediation_paused_by") is not None)
        assert service.store.settings.get("remediation_paused_by") == service.remediator.paused_by
        subscriber.close()
        health.close()
