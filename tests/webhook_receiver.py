"""A real local HTTP server receiving a webhook's JSON events, for the tests of the webhook spares
and of what a spare's receiver is handed (tests/test_webhook_spares.py,
tests/attacks/test_standby_identity.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast


@dataclass
class Receiver:
    """What the receiver got, and what it answers (status, body) in turn, then `status`/`body`."""

    received: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    answers: list[tuple[int, bytes]] = field(default_factory=list)
    status: int = 200
    body: bytes = b""
    # Notified on every event received (waiting for one takes no polling).
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, wanted: Any, timeout_s: float) -> dict[str, Any]:
        """The newest event `wanted(event)` holds for, waiting up to `timeout_s` for one."""

        def found() -> list[dict[str, Any]]:
            return [body for _, body, _ in self.received if wanted(body)]

        with self.arrived:
            if not self.arrived.wait_for(found, timeout_s):
                raise AssertionError(f"no such event within {timeout_s} s: {self.received}")
            return found()[-1]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        receiver: Receiver = cast(Any, self.server).receiver
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        with receiver.arrived:
            receiver.received.append((self.path, json.loads(raw), dict(self.headers.items())))
            receiver.arrived.notify_all()
        code, body = receiver.answers.pop(0) if receiver.answers else (receiver.status, receiver.body)
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def receiving(path: str = "/spares") -> Iterator[tuple[Receiver, str]]:
    """A started receiver and its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    state = Receiver()
    cast(Any, httpd).receiver = state
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}{path}"
    finally:
        httpd.shutdown()
        httpd.server_close()
