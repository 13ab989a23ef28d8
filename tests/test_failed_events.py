"""Failures detected in seconds, end to end over real gRPC: a critical Xid read by a real collector
(NVML faked at the pynvml boundary) and shipped at once, a collector process killed with SIGKILL, and
a trainer's report each reach a subscribed trainer as one FAILED event; a collector that stops
cleanly, and a second report of the same death, raise none."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import grpc
import pytest

from faultcast import wire
from faultcast.client.guard import Guard
from faultcast.collector.agent import NodeCollector
from faultcast.collector.nvml.source import NvmlSource
from faultcast.collector.shipper import Shipper
from faultcast.collector.spool import Spool
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.server import Service
from faultcast.testing.fake_nvml import FakeNvml
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc

WAIT_S = 30.0
FAULTCAST = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "faultcast")
_nodes = count()


@pytest.fixture(scope="module")
def served(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    shutil.copytree(stub_model, model_dir)
    config = ServiceConfig(grace_s=3600.0, silence_grace_s=1.0)
    service = Service.open(model_dir, tmp_path_factory.mktemp("state"), config, actuator=NoopActuator())
    port = service.start("127.0.0.1:0")
    yield service, f"127.0.0.1:{port}"
    service.stop(0)


def _node() -> str:
    return f"node-f{next(_nodes)}"


def _guard(target: str, job: str, node: str) -> Guard:
    guard = Guard(target, job, [node]).start()
    assert guard.wait_caught_up(WAIT_S)
    return guard


def _until(condition: Callable[[], bool]) -> None:
    """Poll a condition another thread makes true (the server's stream bookkeeping)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_critical_xid_reaches_the_trainer_as_one_failed_event(
    served: tuple[Service, str], tmp_path: Path
) -> None:
    service, target = served
    node = _node()
    guard = _guard(target, "job-xid", node)
    fake = FakeNvml(gpus=service.model.feature_config.gpus_per_node)
    spool = Spool(tmp_path / "spool.sqlite")
    window_ns = 60 * 10**9
    now = time.time_ns() // window_ns * window_ns
    # One scrape a second ago in the window before (its sample, shipped at the window's end, is what
    # the service compares the next with), then scrapes of the window going on now.
    times = iter([now - 10**9, now, now + 1, now + 2, now + 3])
    collector = NodeCollector(
        node, [NvmlSource(fake)], spool=spool, ship_step_s=60.0, wall_clock_ns=lambda: next(times)
    )
    shipper = Shipper(target, spool, node)
    shipper.start()
    try:
        collector.scrape()
        collector.scrape()  # in the next window: the first window's sample ships
        _until(lambda: spool.acked_through >= 1)
        fake.inject_xid(1, 79)
        collector.scrape()  # shows the Xid: its window so far ships at once, mid-step
        failed = guard.wait_failed(WAIT_S)
        assert failed is not None
        assert (failed.kind, failed.state, failed.node, failed.gpu) == (
            apb.EVENT_KIND_FAILED,
            apb.ALERT_STATE_FAILED,
            node,
            1,
        )
        assert failed.opened_id == failed.id
        assert (failed.failure.evidence, failed.failure.xid) == (apb.FAILURE_EVIDENCE_XID, 79)
        assert failed.mode == apb.FAILURE_MODE_DETACHMENT
        assert failed.failure.drains_node
        assert list(failed.failure.foreseen_by) == []
        fake.lose_gpu(1)
        collector.scrape()  # the same failure, seen again: folded into the event already sent
        collector.flush()
        _until(lambda: spool.acked_through >= spool.last_sequence)
        service.score_now()
        assert [f.id for f in guard.failures] == [failed.id]
        # It happened: the node is taken out and the job requeued at once, no grace to wait out.
        _until(lambda: (service.store.remediations.of(failed.id) or ("pending",))[0] != "pending")
        assert service.store.remediations.of(failed.id) == ("ok", f"noop: would drain {node}")
        # A second GPU failing on the node just drained is its own FAILED event, but one incident:
        # the node is not drained again and the job, requeued once already, is not requeued twice.
        fake.inject_xid(2, 79)
        collector.scrape()  # its sample comes after the step was closed: refused, its evidence kept
        _until(lambda: len(guard.failures) == 2)
        second = guard.failures[-1]
        assert second.gpu == 2
        _until(lambda: service.store.remediations.of(second.id) is not None)
        outcome, detail = service.store.remediations.of(second.id) or ("", "")
        assert (outcome, f"alert {failed.id}:" in detail) == ("joined", True)
        assert [r.alert_id for r, outcome, _ in service.remediator.done if outcome == "ok"] == [failed.id]
        assert service.failure_watch.folded >= 1
        listing = apb_grpc.AlertsStub(grpc.insecure_channel(target)).ListActiveAlerts(
            apb.ListActiveAlertsRequest(nodes=[node])
        )
        assert list(listing.alerts) == []  # a failure is no open alert
    finally:
        shipper.close()
        guard.close()
        collector.close()
        spool.close()


def test_a_collector_killed_or_hung_is_a_silent_node_and_one_that_stops_cleanly_is_not(
    served: tuple[Service, str], tmp_path: Path
) -> None:
    service, target = served
    stopped = _node()
    watch = service.failure_watch
    spool = Spool(tmp_path / "clean.sqlite")
    shipper = Shipper(target, spool, stopped)
    shipper.start()
    _until(lambda: watch.streams_open(stopped) == 1)
    shipper.close()  # a goodbye: the stream is closed, not broken
    _until(lambda: watch.streams_open(stopped) == 0)
    assert watch.next_silence_check() is None
    spool.close()
    # A client of its own that closes its side without a goodbye (the requests simply end): no failure.
    closer = _node()
    with grpc.insecure_channel(target) as channel:
        assert list(tpb_grpc.TelemetryStub(channel).Push(iter([wire.hello(closer, 7)]))) == []
    _until(lambda: watch.streams_open(closer) == 0)
    assert watch.next_silence_check() is None

    for how in (signal.SIGKILL, signal.SIGSTOP):  # a reset; a process (or node) that answers nothing
        failed = _silenced(service, target, tmp_path, how)
        assert (failed.gpu, failed.failure.evidence, failed.mode) == (
            -1,
            apb.FAILURE_EVIDENCE_NODE_SILENT,
            apb.FAILURE_MODE_HOST,
        )
    assert service.store.alerts.read_after(0, [stopped]) == []


def _silenced(service: Service, target: str, tmp_path: Path, how: signal.Signals) -> apb.Alert:
    """A real `faultcast collect` process streaming for a node of its own, then signalled `how`:
    the FAILED event its guard hears."""
    node = _node()
    guard = _guard(target, f"job-{how.name}", node)
    collector = subprocess.Popen(
        [FAULTCAST, "collect", "--source", "simulated", "--node", node, "--gpus", "1", "--service", target,
         "--insecure", "--no-prometheus", "--spool", str(tmp_path / f"{node}.sqlite")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        _until(lambda: service.failure_watch.streams_open(node) == 1 or collector.poll() is not None)
        assert collector.poll() is None, collector.communicate()[1]
        os.kill(collector.pid, how)
        failed = guard.wait_failed(WAIT_S)
        assert failed is not None
        assert failed.node == node
        return failed
    finally:
        collector.kill()
        collector.wait()
        guard.close()


def test_a_trainers_report_reaches_every_rank_once(served: tuple[Service, str]) -> None:
    _service, target = served
    node, other = _node(), _node()
    heard: list[apb.Alert] = []
    told = threading.Event()

    def on_failure(alert: apb.Alert) -> None:
        heard.append(alert)
        told.set()

    reporter = _guard(target, "job-report", node)
    listener = Guard(target, "job-report", [node], register=False, on_failure=on_failure).start()
    assert listener.wait_caught_up(WAIT_S)
    stub = apb_grpc.AlertsStub(grpc.insecure_channel(target))
    try:
        event_id = reporter.report_failure(apb.TRAINER_FAILURE_NCCL_WATCHDOG, rank=5, detail="allreduce 9")
        assert event_id > 0
        failed = listener.wait_failed(WAIT_S)
        assert failed is not None
        assert failed.id == event_id
        assert told.wait(WAIT_S)  # on_failure runs on the guard's thread, after failures is updated
        assert [a.id for a in heard] == [event_id]
        assert failed.failure.evidence == apb.FAILURE_EVIDENCE_TRAINER_REPORT
        assert (failed.failure.job_id, failed.failure.rank) == ("job-report", 5)
        assert failed.mode == apb.FAILURE_MODE_NCCL_TIMEOUT
        assert not failed.failure.drains_node  # the cause may be software: the node stays
        again = stub.ReportFailure(
            apb.ReportFailureRequest(
                job_id="job-report", node=node, what=apb.TRAINER_FAILURE_DEAD_RANK, rank=2
            )
        )
        assert (again.alert_id, again.repeated) == (event_id, True)
        refusals = {
            "unregistered": apb.ReportFailureRequest(
                job_id="nobody", node=node, what=apb.TRAINER_FAILURE_DEAD_RANK
            ),
            "another node": apb.ReportFailureRequest(
                job_id="job-report", node=other, what=apb.TRAINER_FAILURE_DEAD_RANK
            ),
            "no what": apb.ReportFailureRequest(job_id="job-report", node=node),
        }
        codes = {}
        for name, request in refusals.items():
            with pytest.raises(grpc.RpcError) as refused:
                stub.ReportFailure(request)
            codes[name] = refused.value.code()
        assert codes == {
            "unregistered": grpc.StatusCode.FAILED_PRECONDITION,
            "another node": grpc.StatusCode.PERMISSION_DENIED,
            "no what": grpc.StatusCode.INVALID_ARGUMENT,
        }
    finally:
        reporter.close()
        listener.close()


def test_a_guard_hears_failures_of_every_node_of_its_job_and_acts_on_warnings_of_its_own(
    served: tuple[Service, str],
) -> None:
    service, target = served
    mine, other = _node(), _node()
    guard = Guard(target, "job-two-nodes", [mine], job_nodes=[mine, other]).start()
    assert guard.wait_caught_up(WAIT_S)
    try:
        (warning,) = service.store.alerts.append(
            [
                apb.Alert(
                    node=other,
                    gpu=0,
                    state=apb.ALERT_STATE_OPEN,
                    kind=apb.EVENT_KIND_OPENED,
                    risk=0.9,
                    action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
                )
            ]
        )
        assert guard.wait_seen(warning.id, WAIT_S)
        assert guard.pending() is None  # the other node's own guard acts on its warning
        reported = guard.report_failure(apb.TRAINER_FAILURE_DEAD_RANK, node=other, rank=3)
        failed = guard.wait_failed(WAIT_S)
        assert failed is not None
        assert (failed.id, failed.node) == (reported, other)
    finally:
        guard.close()
