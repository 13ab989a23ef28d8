"""The fleet's label log: FAILED events on hardware evidence become failure labels in the same write,
harvested logs and operators add theirs (idempotently, all or none), verdicts settle alerts, the
training export merges one fault seen by several sources and censors alerts acted on that nothing
settled (never a false alarm, never a failure); end to end over a real service, a real collector (NVML
faked at the pynvml boundary) and the `faultcast labels` command."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from faultcast.collector.agent import NodeCollector
from faultcast.collector.nvml.source import NvmlSource
from faultcast.collector.shipper import Shipper
from faultcast.collector.spool import Spool
from faultcast.modes import FailureMode
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.server import Service
from faultcast.service.state.labels import FailureLabel, LabelSource, Verdict
from faultcast.service.state.store import StateStore
from faultcast.service.training_labels import training_labels, write
from faultcast.testing.fake_nvml import FakeNvml
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

FAULTCAST = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "faultcast")
HOUR_NS = 3600 * 10**9
T0 = 1_780_000_000 * 10**9  # an event time (2026)
HORIZON_S = 1800.0
WAIT_S = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore.in_dir(tmp_path)
    yield opened
    opened.close()


def _failed(
    node: str,
    gpu: int,
    evidence: apb.FailureEvidence.ValueType,
    time_ns: int,
    *,
    xid: int = 0,
    drains: bool = True,
    mode: apb.FailureMode.ValueType = apb.FAILURE_MODE_DETACHMENT,
) -> apb.Alert:
    return apb.Alert(
        node=node,
        gpu=gpu,
        mode=mode,
        kind=apb.EVENT_KIND_FAILED,
        state=apb.ALERT_STATE_FAILED,
        time_unix_nano=time_ns,
        failure=apb.Failure(evidence=evidence, xid=xid, drains_node=drains),
    )


def _opened(store: StateStore, node: str, gpu: int, time_ns: int, last_ns: int) -> int:
    """An alert as the alert book writes one: OPEN, then CLEARED at `last_ns`; its opened id."""
    (opened,) = store.alerts.append(
        [apb.Alert(node=node, gpu=gpu, mode=apb.FAILURE_MODE_NVLINK, kind=apb.EVENT_KIND_OPENED,
                   state=apb.ALERT_STATE_OPEN, time_unix_nano=time_ns)]
    )  # fmt: skip
    store.alerts.append(
        [apb.Alert(node=node, gpu=gpu, opened_id=opened.id, kind=apb.EVENT_KIND_CLEARED,
                   state=apb.ALERT_STATE_CLEARED, time_unix_nano=last_ns)]
    )  # fmt: skip
    return opened.id


def _drained(store: StateStore, alert_id: int, node: str) -> None:
    assert store.remediations.claim(alert_id, node, "noop")
    store.remediations.finish(alert_id, "ok", f"noop: would drain {node}")


def test_a_hardware_failed_event_is_a_label_and_a_software_one_is_not(store: StateStore) -> None:
    xid79, report, xid94 = store.alerts.append(
        [
            _failed("n1", 3, apb.FAILURE_EVIDENCE_XID, T0, xid=79),
            _failed("n2", -1, apb.FAILURE_EVIDENCE_TRAINER_REPORT, T0, drains=False),
            _failed(
                "n3", 0, apb.FAILURE_EVIDENCE_XID, T0, xid=94, drains=False, mode=apb.FAILURE_MODE_HBM_WEAR
            ),
        ]
    )
    (label,) = store.labels.failures()
    assert (label.node, label.gpu, label.mode, label.xid) == ("n1", 3, FailureMode.DETACHMENT, 79)
    assert (label.source, label.alert_id, label.evidence, label.time_ns) == (
        LabelSource.FAILURE_EVENT,
        xid79.id,
        "xid",
        T0,
    )
    assert report.id != label.alert_id != xid94.id


def test_importing_twice_adds_nothing_and_a_bad_row_stores_none(store: StateStore) -> None:
    rows = [
        FailureLabel("n1", 2, FailureMode.HBM_WEAR, T0, LabelSource.KERNEL_LOG, xid=48),
        FailureLabel("n2", -1, None, T0 + HOUR_NS, LabelSource.SLURM, detail="Kill task failed"),
    ]
    assert store.labels.add(rows, "ops") == (2, 0)
    assert store.labels.add(rows, "ops") == (0, 2)
    bad = [
        FailureLabel("n4", 1, None, T0, LabelSource.KERNEL_LOG),
        FailureLabel("n5", 9999, None, T0, LabelSource.SLURM),
    ]
    with pytest.raises(ValueError, match="gpu 9999"):
        store.labels.add(bad, "ops")
    assert [f.node for f in store.labels.failures()] == ["n1", "n2"]
    assert {f.recorded_by for f in store.labels.failures()} == {"ops"}


def test_one_fault_seen_by_three_sources_is_one_failure(store: StateStore) -> None:
    store.alerts.append([_failed("n1", 3, apb.FAILURE_EVIDENCE_XID, T0 + 2 * 10**9, xid=79)])
    store.labels.add(
        [
            FailureLabel("n1", 3, FailureMode.DETACHMENT, T0, LabelSource.KERNEL_LOG, xid=79),  # earliest
            FailureLabel("n1", -1, None, T0 + 60 * 10**9, LabelSource.SLURM, detail="gpu fell off"),
            # The same GPU again two hours later: a new fault (beyond the one-hour gap).
            FailureLabel("n1", 3, FailureMode.DETACHMENT, T0 + 2 * HOUR_NS, LabelSource.KERNEL_LOG, xid=79),
            # Another mode on the same GPU within the gap: another fault.
            FailureLabel("n1", 3, FailureMode.HBM_WEAR, T0 + 10**9, LabelSource.KERNEL_LOG, xid=48),
        ],
        "ops",
    )
    labels = training_labels(store, HORIZON_S)
    merged = [(f.time_ns, f.gpu, f.mode, sorted(s.value for s in sources)) for f, sources in labels.failures]
    assert merged == [
        (T0, 3, FailureMode.DETACHMENT, ["failure_event", "kernel_log", "slurm"]),
        (T0 + 10**9, 3, FailureMode.HBM_WEAR, ["kernel_log"]),
        (T0 + 2 * HOUR_NS, 3, FailureMode.DETACHMENT, ["kernel_log"]),
    ]


def test_a_silent_node_is_a_failure_only_when_another_source_says_so(store: StateStore) -> None:
    host = apb.FAILURE_MODE_HOST
    store.alerts.append(
        [
            _failed("quiet", -1, apb.FAILURE_EVIDENCE_NODE_SILENT, T0, mode=host),
            _failed("dead", -1, apb.FAILURE_EVIDENCE_NODE_SILENT, T0, mode=host),
        ]
    )
    store.labels.add(
        [FailureLabel("dead", -1, None, T0 + 10**9, LabelSource.SLURM, detail="Not responding")], "ops"
    )
    labels = training_labels(store, HORIZON_S)
    assert [(f.node, f.mode) for f, _ in labels.failures] == [("dead", FailureMode.HOST)]
    assert labels.left_out == {"a silent node no other source confirms": 1}


def test_a_drained_prediction_nothing_settled_is_censored_not_a_false_alarm(store: StateStore) -> None:
    prevented = _opened(store, "a", 1, T0, T0 + 600 * 10**9)
    came_anyway = _opened(store, "b", 2, T0, T0 + 600 * 10**9)
    judged_false = _opened(store, "c", 0, T0, T0 + 600 * 10**9)
    never_drained = _opened(store, "d", 0, T0, T0 + 600 * 10**9)
    for alert_id, node in ((prevented, "a"), (came_anyway, "b"), (judged_false, "c")):
        _drained(store, alert_id, node)
    store.labels.add(
        [FailureLabel("b", 2, FailureMode.NVLINK, T0 + 900 * 10**9, LabelSource.KERNEL_LOG)], "ops"
    )
    store.labels.judge(judged_false, Verdict.FALSE, "diag clean", "ops", None)
    labels = training_labels(store, HORIZON_S)
    (span,) = labels.censored
    assert (span.alert_id, span.node, span.gpu) == (prevented, "a", 1)
    assert span.start_ns == T0 - int(HORIZON_S * 1e9)
    assert span.end_ns == T0 + 600 * 10**9 + int(HORIZON_S * 1e9)
    assert never_drained not in {s.alert_id for s in labels.censored}
    assert [f.node for f, _ in labels.failures] == ["b"]  # neither a nor c is a failure


def test_a_true_verdict_is_a_failure_until_a_false_one_takes_it_back(
    store: StateStore, tmp_path: Path
) -> None:
    alert = _opened(store, "a", 1, T0, T0 + 600 * 10**9)
    _drained(store, alert, "a")
    store.labels.judge(
        alert,
        Verdict.TRUE,
        "dcgmi diag: NVLink failing",
        "ops",
        FailureLabel("a", 1, FailureMode.NVLINK, T0 + 600 * 10**9, LabelSource.OPERATOR, alert_id=alert),
    )
    labels = training_labels(store, HORIZON_S)
    assert [(f.node, f.gpu, f.alert_id) for f, _ in labels.failures] == [("a", 1, alert)]
    assert labels.censored == []
    failures_csv, _ = write(labels, tmp_path / "out")
    with failures_csv.open() as handle:
        (row,) = csv.DictReader(handle)
    assert (row["node"], row["gpu"], row["mode"], row["precursor_s"]) == ("a", "1", "nvlink", "")
    store.labels.judge(alert, Verdict.FALSE, "the diag was wrong", "ops", None)
    labels = training_labels(store, HORIZON_S)
    assert labels.failures == []
    assert labels.censored == []  # judged: healthy hours, not unknown ones
    assert labels.left_out == {"taken back by a FALSE verdict": 1}


# -- over a real service ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str, Path]]:
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    shutil.copytree(stub_model, model_dir)
    state = tmp_path_factory.mktemp("state")
    service = Service.open(model_dir, state, ServiceConfig(grace_s=3600.0), actuator=NoopActuator())
    port = service.start("127.0.0.1:0")
    yield service, f"127.0.0.1:{port}", state
    service.stop(0)


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FAULTCAST, "labels", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_loop_over_a_real_service_and_the_command(
    served: tuple[Service, str, Path], tmp_path: Path
) -> None:
    service, target, state = served
    node = "node-l1"
    fake = FakeNvml(gpus=service.model.feature_config.gpus_per_node)
    spool = Spool(tmp_path / "spool.sqlite")
    window_ns = 60 * 10**9
    now = time.time_ns() // window_ns * window_ns
    times = iter([now - 10**9, now, now + 1, now + 2])
    collector = NodeCollector(
        node, [NvmlSource(fake)], spool=spool, ship_step_s=60.0, wall_clock_ns=lambda: next(times)
    )
    shipper = Shipper(target, spool, node)
    shipper.start()
    try:
        collector.scrape()
        collector.scrape()
        _until(lambda: spool.acked_through >= 1)
        fake.inject_xid(1, 79)
        collector.scrape()
        _until(lambda: any(f.node == node for f in service.store.labels.failures()))
    finally:
        shipper.close()
    admin = apb_grpc.AdminStub(grpc.insecure_channel(target))
    (event_label,) = [f for f in admin.ListLabels(apb.ListLabelsRequest()).failures if f.node == node]
    assert (event_label.gpu, event_label.xid, event_label.source) == (1, 79, apb.LABEL_SOURCE_FAILURE_EVENT)
    assert event_label.evidence == apb.FAILURE_EVIDENCE_XID
    assert event_label.recorded_by == "service"

    # The kernel log of the same node, harvested: its Xid 79 line is the same fault.
    log_csv = tmp_path / "failures.csv"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((event_label.time_unix_nano - 10**9) // 10**9))
    log_csv.write_text(
        "timestamp,node,gpu,uuid,mode,xid,precursor_s,description\n"
        f"{stamp},{node},1,,detachment,79,,Xid 79 (GPU has fallen off the bus)\n"
        f"{stamp},node-l2,,,host,,,Slurm: Not responding\n"
    )
    first = _cli("import", str(log_csv), "--source", "kernel_log", "--service", target, "--insecure")
    assert first.returncode == 0, first.stderr
    assert "2 failures, 2 added" in first.stdout
    again = _cli("import", str(log_csv), "--source", "kernel_log", "--service", target, "--insecure")
    assert "0 added, 2 already" in again.stdout

    # A prediction on another node, drained, then judged false by an operator: healthy hours.
    alert = _opened(service.store, "node-l3", 0, now, now + 600 * 10**9)
    _drained(service.store, alert, "node-l3")
    listed = _cli("list", "--service", target, "--insecure")
    assert f"censored  alert {alert}" in listed.stdout
    judged = _cli("judge", str(alert), "false", "--why", "diag clean", "--service", target, "--insecure")
    assert judged.returncode == 0, judged.stderr
    assert f"alert {alert} false" in judged.stdout
    assert f"censored  alert {alert}" not in _cli("list", "--service", target, "--insecure").stdout
    missing = _cli("judge", "12345", "true", "--service", target, "--insecure")
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr

    # A failure nobody saw, added by hand; a mode faultcast does not know is refused before any call.
    added = _cli("add", "--node", "node-l4", "--gpu", "2", "--time", "2026-12-01T03:00:00Z", "--mode", "hbm_wear",
                 "--why", "RMA", "--service", target, "--insecure")  # fmt: skip
    assert added.stdout.strip() == "added", added.stderr
    wrong = _cli("add", "--node", "x", "--time", "2026-12-01T03:00:00Z", "--mode", "gremlins", "--service", target,
                 "--insecure")  # fmt: skip
    assert wrong.returncode == 1
    assert "unknown mode 'gremlins'" in wrong.stderr

    exported = subprocess.run(
        [FAULTCAST, "labels", "export", "--state-dir", str(state), "--out", str(tmp_path / "labels")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    with (tmp_path / "labels" / "failures.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    mine = [r for r in rows if r["node"] == node]
    assert len(mine) == 1  # the event and the log line: one fault
    assert mine[0]["description"].startswith("[failure_event+kernel_log]")
    assert {r["node"] for r in rows} >= {node, "node-l2", "node-l4"}
    assert "node-l3" not in {r["node"] for r in rows}
    with (tmp_path / "labels" / "censored.csv").open() as handle:
        assert str(alert) not in {r["alert_id"] for r in csv.DictReader(handle)}
