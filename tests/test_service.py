"""The prediction service end to end over real gRPC: twin samples in, alerts out, acknowledgements,
remediation, hot reload, health, reflection, and bad input that is refused without harm.

The first tests are one story, in order, on one running service: a GPU's HBM wears out, the alert
comes, the job acknowledges its snapshot, the node is drained, the GPU fails and the alert clears."""

from __future__ import annotations

import math
import queue
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultcast import wire
from faultcast.catalogue import Scope, index_of
from faultcast.demo.feed import push, twin_snapshots
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.scoring import model_version
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
FAIL_UNIX = FLEET.start_unix_s + FAIL_S
STEPS_BEFORE = int((FAIL_S - 5 * 60) / FLEET.cadence_s)  # up to 5 minutes before the failure
WAIT_S = 30.0  # deadline for anything the service does on its threads


@dataclass
class Running:
    service: Service
    channel: grpc.Channel
    actuator: NoopActuator
    alerts: queue.Queue[apb.Alert]
    source: TwinSource
    model_dir: Path


@pytest.fixture(scope="module")
def running(service_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    shutil.copytree(service_model, model_dir)
    actuator = NoopActuator()
    service = Service.open(
        model_dir,
        tmp_path_factory.mktemp("state"),
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0),
        actuator=actuator,
    )
    port = service.start("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = apb_grpc.AlertsStub(channel)
    stub.RegisterJob(apb.RegisterJobRequest(job_id="job-7", nodes=[NAME]))
    received: queue.Queue[apb.Alert] = queue.Queue()
    stream = stub.Subscribe(apb.SubscribeRequest(job_id="job-7"))

    def listen() -> None:
        try:
            for event in stream:
                if event.HasField("alert"):
                    received.put(event.alert)
        except grpc.RpcError:
            pass  # cancelled at teardown

    threading.Thread(target=listen, daemon=True).start()
    source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
    yield Running(service, channel, actuator, received, source, model_dir)
    stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
    channel.close()
    service.stop(0)


def _next(alerts: queue.Queue[apb.Alert]) -> apb.Alert:
    try:
        return alerts.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError(f"no alert within {WAIT_S} s") from None


def test_an_approaching_failure_raises_one_alert_with_lead_mode_and_reasons(running: Running) -> None:
    acks = push(running.channel, NAME, twin_snapshots(running.source, NAME, STEPS_BEFORE))
    assert acks[-1].acked_through == STEPS_BEFORE
    assert not any(a.rejections for a in acks)
    alert = _next(running.alerts)
    model = running.service.model
    assert alert.state == apb.ALERT_STATE_OPEN
    assert alert.opened_id == alert.id
    assert (alert.node, alert.gpu, alert.mode) == (NAME, GPU, apb.FAILURE_MODE_HBM_WEAR)
    lead_min = (FAIL_UNIX - alert.time_unix_nano / 1e9) / 60
    assert 5 <= lead_min <= 30
    assert alert.risk >= model.threshold
    assert 0 < alert.time_to_failure_seconds <= model.horizon_s
    assert alert.gpu_uuid.startswith("GPU-")
    assert alert.model_version == model_version(model)
    assert len(alert.top_features) == 5
    assert {f.feature for f in alert.top_features} <= set(model.feature_names)
    contributions = [f.contribution for f in alert.top_features]
    assert contributions == sorted(contributions, reverse=True)
    # One alert per GPU: nothing else opened on this healthy node.
    assert running.alerts.empty() or _updates_only(running.alerts, alert.id)
    active = apb_grpc.AlertsStub(running.channel).ListActiveAlerts(
        apb.ListActiveAlertsRequest(job_id="job-7")
    )
    assert [a.opened_id for a in active.alerts] == [alert.id]


def _updates_only(alerts: queue.Queue[apb.Alert], opened_id: int) -> bool:
    """What follows the first alert before the failure may only be updates of it (escalation)."""
    while not alerts.empty():
        update = alerts.get_nowait()
        if update.opened_id != opened_id or update.state != apb.ALERT_STATE_OPEN:
            return False
        assert update.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
    return True


def test_snapshot_done_drains_the_node_through_the_actuator_once(running: Running) -> None:
    stub = apb_grpc.AlertsStub(running.channel)
    alert = stub.ListActiveAlerts(apb.ListActiveAlertsRequest(nodes=[NAME])).alerts[0]
    ack = apb.AcknowledgeRequest(
        alert_id=alert.id,
        job_id="job-7",
        action=apb.ACK_ACTION_SNAPSHOT_DONE,
        step=1200,
        checkpoint_uri="file:///ckpt/1200",
    )
    if alert.action != apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE:
        reply = stub.Acknowledge(ack)
        assert "stays in service" in reply.remediation
        pytest.fail(
            f"the alert 5 minutes before the failure recommends {apb.RecommendedAction.Name(alert.action)}"
        )
    reply = stub.Acknowledge(ack)
    assert reply.accepted
    assert f"drain {NAME}" in reply.remediation
    assert "job-7" in reply.remediation
    assert running.service.remediator.wait_done(1, WAIT_S)
    remediation, outcome, _ = running.service.remediator.done[0]
    assert outcome == "ok"
    assert (remediation.node, remediation.job_id, remediation.alert_id) == (NAME, "job-7", alert.opened_id)
    assert remediation.checkpoint_uri == "file:///ckpt/1200"
    assert remediation.requeue
    assert f"faultcast alert {alert.opened_id}" in remediation.reason
    again = stub.Acknowledge(ack)
    assert "already remediated" in again.remediation
    assert len(running.actuator.seen) == 1


def test_the_failure_clears_the_alert_as_the_gpu_goes_dark(running: Running) -> None:
    push(running.channel, NAME, twin_snapshots(running.source, NAME, 15, first_sequence=STEPS_BEFORE + 1))
    while True:
        event = _next(running.alerts)
        if event.state == apb.ALERT_STATE_CLEARED:
            break
    assert event.cleared_reason == "gpu dark"
    assert event.node == NAME
    assert event.gpu == GPU
    stub = apb_grpc.AlertsStub(running.channel)
    assert stub.ListActiveAlerts(apb.ListActiveAlertsRequest(nodes=[NAME])).alerts == []


def test_a_late_subscriber_resumes_after_its_last_id_with_no_gap(running: Running) -> None:
    stub = apb_grpc.AlertsStub(running.channel)
    last = running.service.store.alerts.last_id
    everything = _read_log(stub, 0, last)
    assert [a.id for a in everything] == sorted(a.id for a in everything)
    assert len(everything) >= 2
    tail = _read_log(stub, everything[0].id, last)
    assert [a.id for a in tail] == [a.id for a in everything[1:]]


def _read_log(stub: apb_grpc.AlertsStub, after: int, last: int) -> list[apb.Alert]:
    """Every stored event after `after`, read through Subscribe up to the log's end."""
    out: list[apb.Alert] = []
    # Without a cursor, history (a new subscriber would get only the alerts open now).
    start = apb.START_FROM_HISTORY if after == 0 else apb.START_FROM_UNSPECIFIED
    request = apb.SubscribeRequest(nodes=[NAME], resume_after=after, start=start)
    stream = stub.Subscribe(request, timeout=WAIT_S)
    for event in stream:
        if not event.HasField("alert"):
            continue
        alert = event.alert
        out.append(alert)
        if alert.id >= last:
            stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
            break
    return out


def test_the_risk_metric_and_counters_are_exported(running: Running) -> None:
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(running.service.metrics.registry).decode())
    }
    risks = {(s.labels["node"], s.labels["gpu"]) for s in families["faultcast_failure_risk"].samples}
    assert {(NAME, str(g)) for g in range(8) if g != GPU} <= risks
    samples = {s.name: s.value for f in families.values() for s in f.samples}
    assert samples["faultcast_ingest_gpu_samples_total"] >= 8 * STEPS_BEFORE - 8
    assert samples["faultcast_scoring_latency_seconds_count"] > 0
    alerts_by_mode = {
        s.labels["mode"]: s.value for s in families["faultcast_alerts"].samples if s.name.endswith("_total")
    }
    assert alerts_by_mode["hbm_wear"] == 1


def test_health_and_reflection_name_the_services(running: Running) -> None:
    health = health_pb2_grpc.HealthStub(running.channel)
    for service in ("", "faultcast.v1.Telemetry", "faultcast.v1.Alerts", "faultcast.v1.Admin"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(running.channel)
    responses = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {
        "faultcast.v1.Telemetry",
        "faultcast.v1.Alerts",
        "faultcast.v1.Admin",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    } <= names
    # The service answers reflection v1 too (the v1 messages are v1alpha's bytes).
    v1 = running.channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (answer,) = list(
        v1(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="faultcast.v1.Alerts")]))
    )
    assert answer.file_descriptor_response.file_descriptor_proto


def test_a_corrupt_model_is_refused_on_reload_and_the_old_one_keeps_serving(
    running: Running, tmp_path: Path
) -> None:
    admin = apb_grpc.AdminStub(running.channel)
    before = model_version(running.service.model)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(running.model_dir, corrupt)
    (corrupt / "model.txt").write_text("tree\nnot a model\n")
    reply = admin.ReloadModel(apb.ReloadModelRequest(path=str(corrupt)))
    assert not reply.loaded
    assert "corrupt" in reply.error
    assert reply.model_version == before
    assert running.service.model.threshold == load(running.model_dir).threshold
    reply = admin.ReloadModel(apb.ReloadModelRequest(path=str(tmp_path / "missing")))
    assert not reply.loaded
    assert "manifest.json is missing" in reply.error
    reply = admin.ReloadModel(apb.ReloadModelRequest())
    assert reply.loaded
    assert reply.error == ""
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(running.service.metrics.registry).decode())
    }
    reloads = {
        s.labels["outcome"]: s.value
        for s in families["faultcast_model_reloads"].samples
        if s.name.endswith("_total")
    }
    assert reloads == {"ok": 1.0, "rejected": 2.0}


# -- bad input ------------------------------------------------------------------------------


def _sample(node: str, t_s: float, sequence: int) -> NodeSnapshot:
    source = TwinSource(FLEET, 0)
    reading = source.read()
    snapshot = NodeSnapshot.merge(node, int(t_s * 1e9), [replace(reading, time_unix_nano=None)], {})
    return replace(snapshot, sequence=sequence)


def test_bad_values_are_blanked_and_counted_and_the_rest_of_the_sample_kept(running: Running) -> None:
    node = "node-bad-values"
    base = _sample(node, FLEET.start_unix_s + 3600, 1)
    temp, sbe = index_of(Scope.GPU)["gpu_temp"], index_of(Scope.GPU)["ecc_sbe_volatile"]
    gpus = list(base.gpus)
    values = list(gpus[0].values)
    values[temp], values[sbe] = math.inf, -5.0
    gpus[0] = replace(gpus[0], values=tuple(values))
    before = dict(running.service.telemetry.blanked)
    acks = push(running.channel, node, [replace(base, gpus=tuple(gpus))])
    assert acks[0].acked_through == 1
    assert not acks[0].rejections
    blanked = running.service.telemetry.blanked
    assert blanked["non_finite_value"] == before.get("non_finite_value", 0) + 1
    assert blanked["negative_counter"] == before.get("negative_counter", 0) + 1
    assert node in running.service.scorer.nodes()


def test_late_and_malformed_samples_are_refused_with_a_reason_and_acked(running: Running) -> None:
    node = "node-late"
    t0 = FLEET.start_unix_s + 7200
    samples = [_sample(node, t0, 1), _sample(node, t0 + 180, 2), _sample(node, t0 + 10, 3)]
    acks = push(running.channel, node, samples)
    reasons = [r.reason for a in acks for r in a.rejections]
    assert acks[-1].acked_through == 3
    assert len(reasons) == 1
    assert "arrived after step" in reasons[0]
    assert running.service.telemetry.rejects["late"] >= 1
    malformed = wire.to_proto(_sample(node, t0 + 240, 4))
    del malformed.gpus[0].values[3:]

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello(node, 1)
        yield tpb.PushRequest(sample=malformed)

    from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc

    acks = list(tpb_grpc.TelemetryStub(running.channel).Push(requests()))
    assert acks[0].acked_through == 4
    assert "values" in acks[0].rejections[0].reason


def test_an_oversized_message_gets_a_status_and_the_service_keeps_serving(running: Running) -> None:
    node = "node-huge"
    huge = wire.to_proto(_sample(node, FLEET.start_unix_s + 3600, 1))
    huge.node = "x" * (2 << 20)

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello(node, 1)
        yield tpb.PushRequest(sample=huge)

    from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc

    with pytest.raises(grpc.RpcError) as caught:
        list(tpb_grpc.TelemetryStub(running.channel).Push(requests()))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    health = health_pb2_grpc.HealthStub(running.channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
