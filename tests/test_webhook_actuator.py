"""The webhook actuator against a real HTTP server: what it posts, and failures as outcomes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from faultcast.service.remediation import Remediation, WebhookActuator
from tests.conftest import free_port

REMEDIATION = Remediation(
    alert_id=42, node="gpu-17", gpu=3, mode="hbm_wear", risk=0.61, job_id="1234", requeue=True,
    checkpoint_uri="s3://ckpt/step-900",
)  # fmt: skip


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, dict[str, object], str]]] = []
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, json.loads(body), self.headers["Content-Type"]))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Receiver.received, _Receiver.status = [], 200
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
    outcome = WebhookActuator(f"http://127.0.0.1:{free_port()}/", timeout_s=2).remediate(REMEDIATION)
    assert not outcome.ok
    assert "refused" in outcome.detail.lower()
    with pytest.raises(ValueError, match="http"):
        WebhookActuator("file:///etc/passwd")
