"""`faultcast serve` as a real process, for the tests that kill, freeze or signal it: started on an
address of its choosing (or a fixed one, so a collector's target stays valid across a restart),
with its /metrics on a free port and its output in a log file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from faultcast.collector.spool import Spool

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
WAIT_S = 60.0


class ServeProcess:
    """One `faultcast serve --insecure` process (no clock-skew or sample-age limits: twin data
    comes from the past); `flags` are added to its command line."""

    def __init__(self, model: Path, state: Path, log: Path, *flags: str, listen: str = "127.0.0.1:0") -> None:
        self.log_path = log
        self.port_file = state / "port"
        self.port_file.unlink(missing_ok=True)
        metrics_port_file = state / "metrics-port"
        metrics_port_file.unlink(missing_ok=True)
        self.log = log.open("ab")
        self.process = subprocess.Popen(
            [
                FAULTCAST,
                "serve",
                "--model",
                str(model),
                "--state-dir",
                str(state),
                "--listen",
                listen,
                "--port-file",
                str(self.port_file),
                "--prometheus-port",
                "0",
                "--metrics-port-file",
                str(metrics_port_file),
                "--max-clock-skew",
                "0",
                "--max-sample-age",
                "0",
                "--insecure",
                *flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.until(lambda: self.port_file.is_file() and self.port_file.read_text().strip() != "")
        self.port = int(self.port_file.read_text())
        self.metrics_port = int(metrics_port_file.read_text())  # written before the gRPC port file
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def until(self, ready: Callable[[], bool]) -> None:
        """Wait for a condition this process brings about (polling is the only way to see it)."""
        end = time.monotonic() + WAIT_S
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"faultcast serve exited with {self.process.returncode}:\n{self.tail()}")
            if time.monotonic() > end:
                raise AssertionError(f"not within {WAIT_S} s\n{self.tail()}")
            time.sleep(0.02)

    def exposition(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            text: str = reply.read().decode()
        return text

    def metric(self, series: str) -> float | None:
        """The value of the series written exactly as `series` (name and labels), or None when the
        service does not export it (yet)."""
        for line in self.exposition().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)  # no finally, no atexit: what is on disk is all there is
        self.process.wait()

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-3000:]

    def close(self) -> None:
        self.channel.close()
        if self.process.poll() is None:
            self.kill()
        self.log.close()


def spool_waits(spool: Spool, predicate: Callable[[], bool], what: str) -> None:
    """Wait on the spool's own condition (notified on every append, ack and stream end)."""
    if not spool.wait(predicate, WAIT_S):
        raise AssertionError(f"not within {WAIT_S} s: {what}")


@contextmanager
def serve_processes() -> Iterator[list[ServeProcess]]:
    """A list to put started `faultcast serve` processes in; each is closed (killed if running) at
    the end."""
    started: list[ServeProcess] = []
    try:
        yield started
    finally:
        for service in started:
            service.close()
