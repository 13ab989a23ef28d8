"""The victim of the attacks: a twin node whose GPU wears out (HBM) ten hours in, pushed to a
service, with a subscriber that collects the alerts of its job. An attack passed when this node
still gets its alert."""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2 as tpb

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU = 2, 3
NAME = FLEET.node_name(NODE)
FAIL_S = 10 * 3600.0  # after the twin's start
STEPS_BEFORE = int((FAIL_S - 5 * 60) / FLEET.cadence_s)  # up to 5 minutes before the failure
WAIT_S = 60.0  # deadline for what the service does on its threads


class Subscriber:
    """A job registered on the victim node, subscribed to its alerts on a thread."""

    def __init__(self, channel: grpc.Channel, job_id: str = "job-v") -> None:
        stub = apb_grpc.AlertsStub(channel)
        stub.RegisterJob(apb.RegisterJobRequest(job_id=job_id, nodes=[NAME]))
        self.alerts: queue.Queue[apb.Alert] = queue.Queue()
        self._stream = stub.Subscribe(apb.SubscribeRequest(job_id=job_id))
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            for event in self._stream:
                if event.HasField("alert"):
                    self.alerts.put(event.alert)
        except grpc.RpcError:
            pass  # cancelled at the end

    def next_alert(self, timeout_s: float = WAIT_S) -> apb.Alert:
        try:
            return self.alerts.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no alert within {timeout_s} s") from None

    def close(self) -> None:
        self._stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped


def push_victim(channel: grpc.Channel, steps: int = STEPS_BEFORE) -> list[tpb.PushAck]:
    """The victim node's samples up to 5 minutes before its GPU fails."""
    source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
    return push(channel, NAME, twin_snapshots(source, NAME, steps))


@contextmanager
def serving(model: Path, state: Path, scratch: Path) -> Iterator[tuple[Service, grpc.Channel]]:
    """A started service on a copy of `model` (under `scratch`) with its state in `state`, without
    clock limits (twin samples are from the past), and a channel to it; stopped at the end unless
    the test stopped it."""
    model_dir = scratch / "model"
    shutil.copytree(model, model_dir)
    service = Service.open(
        model_dir, state, ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0)
    )
    port = service.start("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield service, channel
    finally:
        channel.close()
        if not service.stopping.is_set():
            service.stop(0)


def assert_victim_alerted(channel: grpc.Channel) -> apb.Alert:
    """The victim node's samples, then its alert, as its job's subscriber receives it."""
    subscriber = Subscriber(channel)
    try:
        acks = push_victim(channel)
        assert acks[-1].acked_through == STEPS_BEFORE
        alert = subscriber.next_alert()
        assert alert.node == NAME
        assert alert.state == apb.ALERT_STATE_OPEN
        return alert
    finally:
        subscriber.close()
