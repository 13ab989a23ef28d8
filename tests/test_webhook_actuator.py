"""The webhook actuator against a real HTTP server: what it posts, failures as outcomes, and a
remediator retrying through a receiver that refuses at first."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Remediation, RetryPolicy, WebhookActuator
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.acks import Ack
from faultcast.service.state.store import StateStore
from faultcast.testing.system import refused_port
from faultcast.v1 import alerts_pb2 as apb

REMEDIATION = Remediation(
    alert_id=42,
    node="gpu-17",
    gpu=3,
    mode="hbm_wear",
    risk=0.61,
    job_id="1234",
    requeue=True,
    checkpoint_uri="s3://ckpt/step-900",
)


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, dict[str, object], str]]] = []
    status: ClassVar[int] = 200
    first: ClassVar[list[int]] = []  # statuses to answer, in turn, before `status`

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, json.loads(body), self.headers["Content-Type"]))
        self.send_response(type(self).first.pop(0) if type(self).first else type(self).status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Receiver.received, _Receiver.status, _Receiver.first = [], 200, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_the_webhook_posts_the_remediation_as_json(server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}/drain"
    outcome = WebhookActuator(url).remediate(REMEDIATION)
    assert outcome.ok
    assert "HTTP 200" in outcome.detail
    path, body, content_type = _Receiver.received[0]
    assert (path, content_type) == ("/drain", "application/json")
    assert body["node"] == "gpu-17"
    assert body["alert_id"] == 42
    assert body["requeue"] is True
    assert body["reason"] == "faultcast alert 42: hbm_wear gpu 3 risk 0.61"


def test_a_refusing_or_absent_webhook_is_an_outcome_not_an_exception(server: ThreadingHTTPServer) -> None:
    _Receiver.status = 503
    outcome = WebhookActuator(f"http://127.0.0.1:{server.server_address[1]}/").remediate(REMEDIATION)
    assert not outcome.ok
    assert "HTTP 503" in outcome.detail
    with refused_port() as port:
        outcome = WebhookActuator(f"http://127.0.0.1:{port}/", timeout_s=2).remediate(REMEDIATION)
    assert not outcome.ok
    assert "refused" in outcome.detail.lower()
    with pytest.raises(ValueError, match="http"):
        WebhookActuator("file:///etc/passwd")


def test_a_remediation_through_a_webhook_that_answers_503_is_retried_until_ok(
    server: ThreadingHTTPServer, tmp_path: Path
) -> None:
    _Receiver.first = [503, 503]
    store, metrics = StateStore.in_dir(tmp_path), ServiceMetrics()
    store.jobs.register("1234", ["gpu-17"])
    opened = apb.Alert(
        node="gpu-17",
        gpu=3,
        mode=apb.FAILURE_MODE_HBM_WEAR,
        risk=0.61,
        state=apb.ALERT_STATE_OPEN,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
    )
    alert = store.alerts.append([opened])[0]
    actuator = WebhookActuator(f"http://127.0.0.1:{server.server_address[1]}/drain")
    # Real time on the worker thread: waits small enough for a test, still doubling.
    policy = RetryPolicy(initial_s=0.05, multiplier=2.0, max_s=1.0, max_attempts=4, jitter=0.0)
    remediator = Remediator(store, actuator, metrics, retry=policy)
    remediator.start()
    try:
        remediator.on_ack(Ack(alert.id, "1234", apb.ACK_ACTION_SNAPSHOT_DONE, 900, "s3://ckpt/step-900"))
        assert remediator.wait_done(1, 30.0)
    finally:
        remediator.stop()
    [(remediation, outcome, detail)] = remediator.done
    assert (remediation.alert_id, outcome) == (alert.id, "ok")
    assert detail.endswith("HTTP 200 (on attempt 3)")
    assert [body["alert_id"] for _, body, _ in _Receiver.received] == [alert.id] * 3
    assert metrics.registry.get_sample_value("faultcast_remediation_retries_total") == 2
    assert metrics.registry.get_sample_value("faultcast_remediation_retries_pending") == 0
    assert store.remediations.of(alert.id) == ("ok", detail)
    store.close()
