"""Reading a real Prometheus server from tests: its HTTP API, and polling it until a condition holds."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any


def api(port: int, path: str, **params: str) -> Any:
    """The `data` of GET /api/v1/PATH on the Prometheus listening on `port`."""
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


def until(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll an observable condition of the real servers until it holds; its value."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # a poll interval of a real server's state, not a synchronisation
