"""The failure path when its parts lie, hang or break (issue 41), over real gRPC where it is cheap: a
trainer's report that hid the node's hardware evidence (its going silent, an InfiniBand port going
down), a lonely silent node whose foreseeing alert stayed open, a collector's goodbye queued behind
paced samples, the failures counter's node label, and ReportFailure while the state database
refuses writes."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from faultcast import wire
from faultcast.catalogue import Scope
from faultcast.client.guard import Guard
from faultcast.collector.shipper import Shipper
from faultcast.collector.spool import Spool
from faultcast.demo.feed import twin_snapshots
from faultcast.failure_signs import Evidence, FailureSign
from faultcast.model.artifact import FaultModel, load
from faultcast.readings import DeviceReading, NodeSnapshot, pack, unpack
from faultcast.service.alert_book import AlertBook
from faultcast.service.config import ServiceConfig
from faultcast.service.failure_events import TrainerReport
from faultcast.service.metrics import FAILURE_NODE_LABELS, ServiceMetrics
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.limits import CallerLimits
from faultcast.service.rpc.telemetry import AsyncTelemetryServicer, TelemetryServicer
from faultcast.service.server import Service
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc
from tests.aio_server import aio_telemetry_server
from tests.test_service_parts import _step

WAIT_S = 30.0


def _until(condition: Callable[[], bool]) -> None:
    """Poll a condition another thread makes true (the server's stream bookkeeping)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _serve(stub_model: Path, tmp: Path) -> Iterator[tuple[Service, str]]:
    shutil.copytree(stub_model, tmp / "model")
    (tmp / "state").mkdir()
    config = ServiceConfig(grace_s=3600.0, silence_grace_s=0.5, failure_hold_s=600.0)
    service = Service.open(tmp / "model", tmp / "state", config, actuator=NoopActuator())
    port = service.start("127.0.0.1:0")
    yield service, f"127.0.0.1:{port}"
    service.stop(0)


@pytest.fixture(scope="module")
def served(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    yield from _serve(stub_model, tmp_path_factory.mktemp("served"))


@pytest.fixture
def served_alone(stub_model: Path, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    """A service of the test's own, for a test that leaves its database refusing writes."""
    yield from _serve(stub_model, tmp_path)


def test_a_trainers_report_does_not_hide_the_node_going_silent(served: tuple[Service, str]) -> None:
    """Job V registers node-v and reports a dead rank; then node-v's collector stream breaks for good.
    The silence is its own FAILED event, which drains the node (the report's hold swallowed it)."""
    service, target = served
    guard = Guard(target, "job-v", ["node-v"]).start()
    assert guard.wait_caught_up(WAIT_S)
    hold = threading.Event()

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello("node-v", 1)
        hold.wait(WAIT_S)

    channel = grpc.insecure_channel(target)
    call = tpb_grpc.TelemetryStub(channel).Push(requests())
    try:
        _until(lambda: service.failure_watch.streams_open("node-v") == 1)
        reported = guard.report_failure(apb.TRAINER_FAILURE_DEAD_RANK, rank=3)
        call.cancel()  # type: ignore[no-untyped-call]  # the node gone: the stream breaks, no goodbye
        _until(lambda: len(guard.failures) == 2)
        report, silent = guard.failures
        assert (report.id, report.failure.drains_node) == (reported, False)
        assert (silent.node, silent.failure.evidence, silent.failure.drains_node) == (
            "node-v",
            apb.FAILURE_EVIDENCE_NODE_SILENT,
            True,
        )
    finally:
        hold.set()
        channel.close()
        guard.close()


class _WatchedLock:
    """The alert book's lock, telling whether one thread (the reporter) has asked for it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.watched: threading.Thread | None = None
        self.asked = threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread() is self.watched:
            self.asked.set()
        self.lock.acquire()

    def __exit__(self, *_: object) -> None:
        self.lock.release()


@pytest.mark.slow  # the first refused write waits out SQLite's busy timeout
def test_a_report_is_refused_at_once_while_the_database_refuses_writes(
    served_alone: tuple[Service, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the state database refuses writes, the scoring thread holds the alert book waiting for
    it; a trainer's report must not queue behind that: it is refused (the RPC says UNAVAILABLE)
    without asking for the alert book, which another thread holds throughout."""
    service, _ = served_alone
    sign = FailureSign("node-w", -1, "", Evidence.TRAINER_REPORT, "rank 1 died", time.time_ns())
    report = TrainerReport("job-w", apb.TRAINER_FAILURE_DEAD_RANK, 1, "")
    locker = sqlite3.connect(service.store.path, timeout=0)
    locker.execute("BEGIN EXCLUSIVE")  # another writer holds the database: every write fails
    book_lock = _WatchedLock(service.book._lock)
    monkeypatch.setattr(service.book, "_lock", book_lock)
    book_held, done = threading.Event(), threading.Event()
    try:
        with pytest.raises(StateWriteError):
            service.report_failure(sign, report)  # the refusal is found out, and remembered
        assert not service.store.writable

        def hold_the_book() -> None:  # what the scoring thread does while it waits to store events
            with book_lock:  # the lock the scoring thread holds meanwhile
                book_held.set()
                done.wait(WAIT_S)

        holder = threading.Thread(target=hold_the_book)
        holder.start()
        assert book_held.wait(WAIT_S)
        refused: list[BaseException] = []
        answered = threading.Event()

        def report_now() -> None:
            try:
                service.report_failure(sign, report)
            except StateWriteError as exc:
                refused.append(exc)
            finally:
                answered.set()
                book_lock.asked.set()  # wakes the test either way

        reporter = threading.Thread(target=report_now)
        book_lock.watched = reporter
        reporter.start()
        assert book_lock.asked.wait(WAIT_S)
        waited = not answered.is_set()  # it asked for the book before it was answered
        done.set()
        holder.join(WAIT_S)
        reporter.join(WAIT_S)
        assert not waited, "the report waited for the alert book"
        assert len(refused) == 1
        locker.rollback()  # the database takes writes again
        # Any write that works ends a refused report's trouble (the cursors' every second): the
        # service was left refusing every report, and NOT_SERVING, until some alert was stored.
        _until(lambda: service.store.writable)
        event, known = service.report_failure(sign, report)
        assert (event > 0, known) == (True, False)
    finally:
        done.set()
        if locker.in_transaction:
            locker.rollback()
        locker.close()


def test_a_lonely_node_that_falls_silent_clears_the_alert_that_foresaw_it(
    stub_model: Path, tmp_path: Path
) -> None:
    """The only node of the fleet goes silent with an alert open: check_silence waits for some other
    node to be heard and never clears it; its NODE_SILENT FAILED event does, as NODE_SILENT."""
    model: FaultModel = load(stub_model)
    store = StateStore.in_dir(tmp_path)
    book = AlertBook(model, store, ServiceMetrics(), silent_after_steps=5)
    g = model.feature_config.gpus_per_node
    for t in range(3):
        book.observe([_step(model, "lonely", 300 + t, [0.99] + [0.0] * (g - 1), "hbm_wear")])
    (alert,) = book.active()
    silent = FailureSign("lonely", -1, "", Evidence.NODE_SILENT, "stream broke", time.time_ns())
    (failed,) = book.failed([(silent, None)])
    assert list(failed.failure.foreseen_by) == [alert.id]
    assert book.active() == []
    assert book.silent_nodes() == {"lonely": True}
    (cleared,) = store.alerts.read_after(failed.id, ["lonely"])
    assert (cleared.kind, cleared.opened_id, cleared.clear_reason) == (
        apb.EVENT_KIND_CLEARED,
        alert.id,
        apb.CLEAR_REASON_NODE_SILENT,
    )
    assert "stream broke" in cleared.cleared_reason
    store.close()


def test_the_failures_counter_names_the_node_with_bounded_cardinality() -> None:
    metrics = ServiceMetrics()
    for i in range(FAILURE_NODE_LABELS + 10):
        metrics.count_failure("xid", "false", f"n{i}")
    metrics.count_failure("trainer_report", "false", "n0")
    get = metrics.registry.get_sample_value
    assert get("faultcast_failures_total", {"evidence": "xid", "foreseen": "false", "node": "n0"}) == 1
    assert get("faultcast_failures_total", {"evidence": "xid", "foreseen": "false", "node": "other"}) == 10
    assert (
        get("faultcast_failures_total", {"evidence": "trainer_report", "foreseen": "false", "node": ""}) == 1
    )
    nodes = {
        line.split('node="')[1].split('"')[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line.startswith("faultcast_failures_total{")
    }
    assert len(nodes) == FAILURE_NODE_LABELS + 2  # the named ones, "other", and "" (trainer reports)


class _Ends:
    """A StreamWatch that records how each stream ended."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, bool]] = []
        self.changed = threading.Condition()

    def stream_opened(self, node: str) -> None:
        pass

    def stream_ended(self, node: str, *, goodbye: bool) -> None:
        with self.changed:
            self.ended.append((node, goodbye))
            self.changed.notify_all()


@pytest.mark.slow  # eight samples at four a second
def test_a_goodbye_queued_behind_paced_samples_is_a_goodbye(tmp_path: Path) -> None:
    """A collector stops while the service is still pacing the samples it sent before its goodbye
    (4 a second here): it waits while their acks come, so the stream ends as a goodbye, not broken
    (which the service takes for a dead node)."""
    ends = _Ends()
    taken: list[object] = []
    servicer = AsyncTelemetryServicer(
        TelemetryServicer(taken.append),
        limits=CallerLimits(push_samples_per_s=4.0, push_burst=1),
        streams=ends,
    )
    source = TwinSource(FleetConfig(nodes=1, days=1.0, seed=5), 0)
    spool = Spool(tmp_path / "spool.sqlite")
    with aio_telemetry_server(servicer) as port:
        for snapshot in twin_snapshots(source, "node-g", 8):
            spool.append(wire.to_proto(snapshot))
        shipper = Shipper(f"127.0.0.1:{port}", spool, "node-g")
        shipper.start()
        try:
            _until(lambda: len(taken) >= 1)
        finally:
            shipper.close(timeout=WAIT_S, flush=0.0)
        with ends.changed:
            assert ends.changed.wait_for(lambda: bool(ends.ended), WAIT_S)
    spool.close()
    assert ends.ended == [("node-g", True)]


def _port_down(snapshot: NodeSnapshot, device: str) -> NodeSnapshot:
    """The snapshot with the IB port `device` no longer ACTIVE (state 1, DOWN)."""
    ports = tuple(
        DeviceReading(
            d.scope, d.device, pack(Scope.IB_PORT, {**unpack(d.scope, d.values), "ib_port_state": 1.0})
        )
        if d.scope is Scope.IB_PORT and d.device == device
        else d
        for d in snapshot.devices
    )
    return replace(snapshot, devices=ports)


def test_a_trainers_report_does_not_hide_the_nodes_port_going_down(served: tuple[Service, str]) -> None:
    """Job P registers node-p and reports a dead rank; then node-p's collector shows an InfiniBand
    port leave ACTIVE (4 -> 1). The port is its own FAILED event (IB_PORT_DOWN), and the node is
    drained for it (the report's hold used to swallow it)."""
    service, target = served
    guard = Guard(target, "job-p", ["node-p"]).start()
    assert guard.wait_caught_up(WAIT_S)
    source = TwinSource(FleetConfig(nodes=1, days=1.0, seed=5), 0)
    now = time.time_ns()
    up, later = (
        replace(s, time_unix_nano=now + i * 10**9) for i, s in enumerate(twin_snapshots(source, "node-p", 2))
    )
    assert {d.get("ib_port_state") for d in up.devices if d.scope is Scope.IB_PORT} == {4.0}

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello("node-p", 1)
        yield tpb.PushRequest(sample=wire.to_proto(up))
        yield tpb.PushRequest(sample=wire.to_proto(_port_down(later, "mlx5_0:1")))
        yield tpb.PushRequest(goodbye=tpb.PushGoodbye())

    channel = grpc.insecure_channel(target)
    try:
        reported = guard.report_failure(apb.TRAINER_FAILURE_DEAD_RANK, rank=2)
        acks = list(tpb_grpc.TelemetryStub(channel).Push(requests()))
        assert acks[-1].acked_through == later.sequence
        _until(lambda: len(guard.failures) == 2)
        report, port = guard.failures
        assert (report.id, report.failure.drains_node) == (reported, False)
        assert (port.node, port.failure.evidence, port.failure.drains_node) == (
            "node-p",
            apb.FAILURE_EVIDENCE_IB_PORT_DOWN,
            True,
        )
        _until(lambda: (service.store.remediations.of(port.id) or ("pending",))[0] != "pending")
        assert service.store.remediations.of(port.id) == ("ok", "noop: would drain node-p")
    finally:
        channel.close()
        guard.close()
