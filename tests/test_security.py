"""Transport security and authorization over real TLS: a CA and certificates made by openssl,
a service that takes mTLS identities (SPIFFE IDs) and bearer tokens, and callers who try what
their role does not allow: a rogue collector, a rogue trainer, a stolen or revoked token."""

from __future__ import annotations

import json
import queue
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from faultcast import wire
from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Remediation
from faultcast.service.rpc.auth import AccessPolicy, AuthError, Role, TokenBook, digest
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.service.state.acks import Ack
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.tls import ServerTLS, channel_credentials
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc
from tests.pki import Authority, Pair

FLEET = FleetConfig(nodes=2, days=1.0, seed=5, acceleration=1.0)
FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
WAIT_S = 30.0
T = TypeVar("T")


@dataclass
class Secured:
    service: Service
    port: int
    ca: Path
    pki: Authority
    certs: dict[str, Pair]
    tokens: Path
    token: dict[str, str]  # name -> the bearer token

    def channel(self, who: str = "fleet", token: str | None = None) -> grpc.Channel:
        pair = self.certs[who]
        credentials = channel_credentials(self.ca, pair.cert, pair.key, token)
        return grpc.secure_channel(f"localhost:{self.port}", credentials)

    def denied(self, reason: str) -> float:
        value = self.service.metrics.registry.get_sample_value(
            "faultcast_auth_denied_total", {"reason": reason}
        )
        return value or 0.0


def _token_line(token: str, role: str, name: str) -> str:
    return f"sha256:{digest(token)} {role} {name}\n"


@pytest.fixture(scope="module")
def secured(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("pki")
    pki = Authority(directory, "fleet")
    server = pki.server()
    certs = {
        "node-a": pki.client("collector", "node-a"),
        "job-1": pki.client("trainer", "job-1"),
        "alice": pki.client("admin", "alice"),
        "stranger": pki.client("collector", "node-a", domain="elsewhere"),
        # A fleet-wide certificate with no SPIFFE ID: it gets through the handshake, a token says who.
        "fleet": pki.issue("fleet", "DNS:fleet.faultcast"),
    }
    tokens = directory / "tokens"
    token = {"node-b": "collector-b-secret", "job-2": "trainer-2-secret"}
    tokens.write_text(
        "# faultcast tokens\n"
        + _token_line(token["node-b"], "collector", "node-b")
        + _token_line(token["job-2"], "trainer", "job-2")
    )
    model_dir = tmp_path_factory.mktemp("serving") / "model"
    shutil.copytree(stub_model, model_dir)
    metrics = ServiceMetrics()  # the policy counts refusals on the service's registry, as `serve` does
    service = Service.open(
        model_dir,
        tmp_path_factory.mktemp("state"),
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0)),
        metrics=metrics,
        policy=AccessPolicy(tokens=TokenBook(tokens), trust_domain="faultcast", metrics=metrics),
    )
    tls = ServerTLS(server.cert, server.key, client_ca=pki.ca.cert)
    port = service.start("127.0.0.1:0", tls=tls)
    yield Secured(service, port, pki.ca.cert, pki, certs, tokens, token)
    service.stop(0)


def _first(stream: Iterable[T]) -> T:
    return next(iter(stream))


def _code(call: object) -> grpc.StatusCode:
    """The status a refused call ended with."""
    with pytest.raises(grpc.RpcError) as refused:
        call()  # type: ignore[operator]
    code: grpc.StatusCode = refused.value.code()
    return code


def test_plaintext_or_no_client_certificate_gets_no_answer_from_an_mtls_service(secured: Secured) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{secured.port}") as channel:
        stub = apb_grpc.AlertsStub(channel)
        plaintext = _code(lambda: stub.ListActiveAlerts(apb.ListActiveAlertsRequest(), timeout=5))
    with grpc.secure_channel(f"localhost:{secured.port}", channel_credentials(secured.ca)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        no_certificate = _code(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5))
    assert plaintext == grpc.StatusCode.UNAVAILABLE
    assert no_certificate == grpc.StatusCode.UNAVAILABLE


def test_a_collector_pushes_for_its_own_node_and_no_other(secured: Secured) -> None:
    before = secured.denied("wrong_node")
    with secured.channel("node-a") as channel:
        acks = push(channel, "node-a", twin_snapshots(TwinSource(FLEET, 0, []), "node-a", 3))
        assert acks[-1].acked_through == 3
        assert not any(a.rejections for a in acks)
        code = _code(lambda: push(channel, "node-b", twin_snapshots(TwinSource(FLEET, 1, []), "node-b", 1)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert secured.denied("wrong_node") == before + 1
    assert ("node-b", 1) not in secured.service.telemetry.cursors()


def test_a_collector_may_not_read_alerts_register_jobs_or_reload_the_model(secured: Secured) -> None:
    before = secured.denied("role")
    with secured.channel("node-a") as channel:
        alerts = apb_grpc.AlertsStub(channel)
        admin = apb_grpc.AdminStub(channel)
        codes = {
            _code(lambda: _first(alerts.Subscribe(apb.SubscribeRequest(nodes=["node-a"]), timeout=5))),
            _code(lambda: alerts.RegisterJob(apb.RegisterJobRequest(job_id="x", nodes=["node-a"]))),
            _code(lambda: admin.ReloadModel(apb.ReloadModelRequest())),
        }
    assert codes == {grpc.StatusCode.PERMISSION_DENIED}
    assert secured.denied("role") == before + 3


def test_a_trainer_reads_and_acknowledges_only_its_own_jobs_alerts(secured: Secured) -> None:
    store = secured.service.store
    mine, theirs = store.alerts.append(
        [
            apb.Alert(
                node=node,
                gpu=1,
                state=apb.ALERT_STATE_OPEN,
                risk=0.9,
                action=apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY,
            )
            for node in ("node-a", "node-b")
        ]
    )
    with secured.channel("job-1") as channel:
        stub = apb_grpc.AlertsStub(channel)
        stub.RegisterJob(apb.RegisterJobRequest(job_id="job-1", nodes=["node-a"]))
        stream = stub.Subscribe(
            apb.SubscribeRequest(job_id="job-1", resume_after=mine.id - 1), timeout=WAIT_S
        )
        assert _first(stream).alert.id == mine.id  # the alert on its own node, not the one on node-b after it
        stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leave cancel untyped
        ack = stub.Acknowledge(
            apb.AcknowledgeRequest(alert_id=mine.id, job_id="job-1", action=apb.ACK_ACTION_RECEIVED)
        )
        assert ack.accepted
        refused = [
            # another job's registration, reading or acknowledging
            lambda: stub.RegisterJob(apb.RegisterJobRequest(job_id="job-2", nodes=["node-b"])),
            lambda: _first(stub.Subscribe(apb.SubscribeRequest(job_id="job-2"), timeout=5)),
            lambda: stub.ListActiveAlerts(apb.ListActiveAlertsRequest()),
            # its own job, but a node the job is not registered on
            lambda: _first(stub.Subscribe(apb.SubscribeRequest(job_id="job-1", nodes=["node-b"]), timeout=5)),
            lambda: stub.Acknowledge(
                apb.AcknowledgeRequest(
                    alert_id=theirs.id, job_id="job-1", action=apb.ACK_ACTION_SNAPSHOT_DONE
                )
            ),
            lambda: apb_grpc.AdminStub(channel).ReloadModel(apb.ReloadModelRequest()),
        ]
        codes = [_code(call) for call in refused]
    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * len(refused)
    assert [a.job_id for a in store.acks.of(theirs.id)] == []  # the rogue acknowledgement left no trace
    assert [a.job_id for a in store.acks.of(mine.id)] == ["job-1"]


def test_a_standby_that_took_a_job_over_speaks_for_itself_with_that_jobs_token(secured: Secured) -> None:
    # The standby runs the job's own command, so it holds job-2's token, under a job id of its own
    # (its Slurm job, which the actuator acts on from now on). The remediator claims the hand-over
    # before the standby is told to go; here the claim is made as it makes it.
    handed = Remediation(9001, "node-b", 1, "hbm_wear", 0.9, "job-2", requeue=False, handover_to="job-2-s")
    secured.service.store.remediations.claim(9001, "node-b", "slurm", json.dumps(asdict(handed)))
    again = Remediation(9002, "node-c", 1, "hbm_wear", 0.9, "job-2-s", requeue=False, handover_to="job-2-t")
    secured.service.store.remediations.claim(9002, "node-c", "slurm", json.dumps(asdict(again)))
    with secured.channel(token=secured.token["job-2"]) as channel:
        stub = apb_grpc.AlertsStub(channel)
        for standby, node in (("job-2-s", "node-c"), ("job-2-t", "node-d")):  # and its own standby's
            stub.RegisterJob(apb.RegisterJobRequest(job_id=standby, nodes=[node]))  # not refused
            stub.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id=standby))  # nor this
        assert secured.service.store.jobs.all()["job-2-t"] == ["node-d"]
        # A job nothing was handed over to is still another job.
        refused = _code(lambda: stub.RegisterJob(apb.RegisterJobRequest(job_id="job-9", nodes=["node-e"])))
    assert refused == grpc.StatusCode.PERMISSION_DENIED
    with secured.channel("job-1") as channel:  # another job's identity does not carry job-2's standby
        stub = apb_grpc.AlertsStub(channel)
        refused = _code(lambda: stub.RegisterJob(apb.RegisterJobRequest(job_id="job-2-s", nodes=["node-c"])))
    assert refused == grpc.StatusCode.PERMISSION_DENIED


def test_only_admins_register_jobs_when_the_scheduler_does_it() -> None:
    policy = AccessPolicy(trainers_register=False)
    trainer = policy._from_spiffe("spiffe://faultcast/trainer/job-1")
    with pytest.raises(AuthError) as refused:
        policy.check_job(trainer, "job-1", registering=True)
    assert refused.value.reason == "registration"
    policy.check_job(trainer, "job-1")  # reading its own job stays allowed
    policy.check_job(policy._from_spiffe("spiffe://faultcast/admin/slurm"), "job-1", registering=True)


def test_an_admin_reloads_the_model_and_registers_any_job(secured: Secured) -> None:
    with secured.channel("alice") as channel:
        reply = apb_grpc.AdminStub(channel).ReloadModel(apb.ReloadModelRequest())
        apb_grpc.AlertsStub(channel).RegisterJob(apb.RegisterJobRequest(job_id="job-9", nodes=["node-c"]))
    assert reply.loaded
    assert secured.service.store.jobs.all()["job-9"] == ["node-c"]


def test_an_admin_pauses_remediation_and_resizes_the_breaker_and_a_trainer_may_not(secured: Secured) -> None:
    with secured.channel("job-1") as channel:
        code = _code(
            lambda: apb_grpc.AdminStub(channel).SetRemediation(apb.SetRemediationRequest(paused=False))
        )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    remediator, store = secured.service.remediator, secured.service.store
    with secured.channel("alice") as channel:
        admin = apb_grpc.AdminStub(channel)
        paused = admin.SetRemediation(apb.SetRemediationRequest(paused=True, max_drains=2))
        store.jobs.register("job-p", ["node-p"])
        (alert,) = store.alerts.append(
            [
                apb.Alert(
                    node="node-p",
                    gpu=0,
                    state=apb.ALERT_STATE_OPEN,
                    risk=0.9,
                    action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
                )
            ]
        )
        done = len(remediator.done)
        remediator.on_ack(Ack(alert.id, "job-p", apb.ACK_ACTION_SNAPSHOT_DONE, 10, "file:///ckpt"))
        assert remediator.wait_done(done + 1, WAIT_S)
        bad = _code(lambda: admin.SetRemediation(apb.SetRemediationRequest(drain_window_seconds=-1)))
        resumed = admin.SetRemediation(apb.SetRemediationRequest(paused=False))
    assert (paused.paused, paused.max_drains) == (True, 2)
    assert "alice" in paused.changed_by
    _, outcome, detail = remediator.done[done]
    assert outcome == "refused"
    assert "paused by admin 'alice'" in detail
    assert bad == grpc.StatusCode.INVALID_ARGUMENT
    assert (resumed.paused, resumed.max_drains) == (False, 2)  # unset fields keep their value
    assert store.settings.get("remediation_paused_by") is None


def test_bearer_tokens_identify_callers_and_a_revoked_token_ends_its_open_stream(secured: Secured) -> None:
    with secured.channel(token="not-a-token") as channel:  # noqa: S106 (a test's fake token)
        stub = apb_grpc.AlertsStub(channel)
        assert _code(lambda: stub.ListActiveAlerts(apb.ListActiveAlertsRequest(job_id="job-2"))) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
    with secured.channel(token=secured.token["job-2"]) as channel:
        apb_grpc.AlertsStub(channel).RegisterJob(apb.RegisterJobRequest(job_id="job-2", nodes=["node-b"]))
    requests: queue.Queue[tpb.PushRequest | None] = queue.Queue()

    def stream() -> Iterator[tpb.PushRequest]:
        while (request := requests.get()) is not None:
            yield request

    snapshots = list(twin_snapshots(TwinSource(FLEET, 1, []), "node-b", 2))
    with secured.channel(token=secured.token["node-b"]) as channel:
        acks = tpb_grpc.TelemetryStub(channel).Push(stream(), timeout=WAIT_S)
        requests.put(wire.hello("node-b", 7))
        requests.put(tpb.PushRequest(sample=wire.to_proto(snapshots[0])))
        assert _first(acks).acked_through == 1
        # The operator removes the stolen token's line and reloads (SIGHUP in `faultcast serve`).
        secured.tokens.write_text(_token_line(secured.token["job-2"], "trainer", "job-2"))
        secured.service.policy.tokens.reload()  # type: ignore[union-attr]
        requests.put(tpb.PushRequest(sample=wire.to_proto(snapshots[1])))
        code = _code(lambda: _first(acks))
        requests.put(None)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert secured.service.telemetry.cursors()[("node-b", 7)] == 1  # nothing taken after revocation


def test_certificates_of_another_ca_or_trust_domain_are_refused(secured: Secured, tmp_path: Path) -> None:
    rogue = Authority(tmp_path, "rogue").client("collector", "node-a")
    credentials = channel_credentials(secured.ca, rogue.cert, rogue.key)
    with grpc.secure_channel(f"localhost:{secured.port}", credentials) as channel:
        code = _code(lambda: push(channel, "node-a", twin_snapshots(TwinSource(FLEET, 0, []), "node-a", 1)))
    assert code == grpc.StatusCode.UNAVAILABLE  # the handshake fails: no identity at all
    before = secured.denied("foreign_domain")
    with secured.channel("stranger") as channel:
        code = _code(lambda: push(channel, "node-a", twin_snapshots(TwinSource(FLEET, 0, []), "node-a", 1)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert secured.denied("foreign_domain") == before + 1


def test_health_answers_anyone_and_reflection_needs_an_identity(secured: Secured) -> None:
    with secured.channel("fleet") as channel:  # a certificate that names no one, and no token
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        code = _code(
            lambda: _first(
                reflection.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")])
                )
            )
        )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert code == grpc.StatusCode.UNAUTHENTICATED
    with secured.channel("job-1") as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        reply = _first(
            reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        )
    assert "faultcast.v1.Telemetry" in {s.name for s in reply.list_services_response.service}


def test_a_tokens_file_with_a_bad_line_is_refused_with_its_line_number(tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text(_token_line("t", "collector", "n1") + "sha256:abc collector n2\n")
    with pytest.raises(ValueError, match=r"tokens:2: expected"):
        TokenBook(bad)
    bad.write_text(_token_line("t", "janitor", "n1"))
    with pytest.raises(ValueError, match="role 'janitor'"):
        TokenBook(bad)
    assert Role("trainer") is Role.TRAINER


# -- the commands, as the README's secure deployment runs them ---------------------------------


def test_serve_refuses_to_start_without_tls_or_an_explicit_insecure(stub_model: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [FAULTCAST, "serve", "--model", str(stub_model), "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--insecure" in done.stderr
    mixed = subprocess.run(
        [
            FAULTCAST,
            "collect",
            "--source",
            "simulated",
            "--service",
            "localhost:1",
            "--insecure",
            "--token-file",
            str(tmp_path / "t"),
            "--duration",
            "1s",
            "--no-prometheus",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert mixed.returncode == 2
    assert "contradicts" in mixed.stderr


def test_serve_with_tls_and_tokens_takes_every_sample_a_collector_ships(
    secured: Secured, stub_model: Path, tmp_path: Path
) -> None:
    pki = secured.pki
    server = pki.server()
    tokens = tmp_path / "tokens"
    made = subprocess.run(
        [FAULTCAST, "token", "--role", "collector", "--name", "node-t", "--tokens-file", str(tokens)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token_file = tmp_path / "node-t.token"
    token_file.write_text(made.stdout)
    assert made.stdout.strip() not in tokens.read_text()  # the file keeps the digest only
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [
            FAULTCAST,
            "serve",
            "--model",
            str(stub_model),
            "--state-dir",
            str(tmp_path / "state"),
            "--listen",
            "127.0.0.1:0",
            "--no-prometheus",
            "--max-clock-skew",
            "0",
            "--max-sample-age",
            "0",
            "--port-file",
            str(tmp_path / "port"),
            "--tls-cert",
            str(server.cert),
            "--tls-key",
            str(server.key),
            "--tokens-file",
            str(tokens),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = _bound_port(tmp_path / "port", serve)
        collect = subprocess.run(
            [
                FAULTCAST,
                "collect",
                "--source",
                "simulated",
                "--gpus",
                "2",
                "--node",
                "node-t",
                "--no-prometheus",
                "--interval",
                "100ms",
                "--ship-step",
                "0",  # every scrape, counted below
                "--duration",
                "3s",
                "--spool",
                str(tmp_path / "spool"),
                "--service",
                f"localhost:{port}",
                "--tls-ca",
                str(pki.ca.cert),
                "--token-file",
                str(token_file),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert collect.returncode == 0, collect.stderr
    finally:
        serve.terminate()  # a clean stop saves the ingest cursors
        stopped = serve.wait(timeout=WAIT_S)
        log.close()
    assert stopped == 0, (tmp_path / "serve.log").read_text()[-3000:]
    scrapes = int(collect.stdout.split("scrapes ")[1].split()[0])
    assert _cursor(tmp_path / "state", "node-t") == scrapes  # every scrape taken, over TLS with a token
    assert "INSECURE" not in (tmp_path / "serve.log").read_text()


def _bound_port(port_file: Path, serve: subprocess.Popen[bytes]) -> int:
    """The gRPC port `faultcast serve --listen ...:0` bound, once it writes it (polling the file is
    the only way to see it)."""
    deadline = time.monotonic() + WAIT_S
    while not (port_file.is_file() and port_file.read_text().strip()):
        if serve.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"faultcast serve never wrote its port (exit {serve.returncode})")
        time.sleep(0.05)
    return int(port_file.read_text())


def _cursor(state: Path, node: str) -> int:
    with closing(sqlite3.connect(f"file:{state / 'faultcast-service.sqlite'}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT MAX(last_sequence) FROM cursors WHERE node = ?", (node,)).fetchone()
    return int(row[0] or 0)


def test_every_rpc_names_the_roles_that_may_call_it() -> None:
    """An RPC missing from METHOD_ROLES is refused to everyone under TLS, admins too: the label log's
    and the registry's calls once were."""
    from faultcast.service.rpc.auth import METHOD_ROLES
    from faultcast.v1 import alerts_pb2, telemetry_pb2

    methods = {
        f"/{service.full_name}/{method.name}"
        for descriptor in (alerts_pb2.DESCRIPTOR, telemetry_pb2.DESCRIPTOR)
        for service in descriptor.services_by_name.values()
        for method in service.methods
    }
    assert methods == set(METHOD_ROLES)
