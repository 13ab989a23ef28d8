"""A real Prometheus server for tests: starting one, its HTTP API, and polling it until a condition holds."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from faultcast.testing.system import AddressInUseError, require_binary, start_on_free_ports

START_TIMEOUT_S = 60.0


@contextmanager
def running_prometheus(config: Path, where: Path) -> Iterator[int]:
    """A real Prometheus on 127.0.0.1 with this configuration, its TSDB and log (prometheus.log) in
    `where`; yields its port once it answers ready. Prometheus takes a port number and cannot report
    one it chose: it gets one free a moment ago, and another when that was taken in between."""
    binary = require_binary("prometheus")
    proc, port = start_on_free_ports(lambda ports: _start(binary, config, where, ports[0]))
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _start(binary: str, config: Path, where: Path, port: int) -> tuple[subprocess.Popen[bytes], int]:
    log = where / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={where / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            if "address already in use" in text:
                raise AddressInUseError(f"prometheus on port {port}: {text[-500:]}")
            raise AssertionError(f"prometheus exited with {proc.returncode}:\n{text[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as response:
                if response.status == 200:
                    return proc, port
        except OSError:  # URLError and HTTPError (503) included
            pass  # not listening yet, or listening but still starting
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"prometheus not ready within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.1)  # polling a real server's state: it has no other way to say it is ready


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
