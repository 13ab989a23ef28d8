"""Shared fixtures. Real parts only: a test that needs a system binary fails in CI when it is missing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest
from hypothesis import HealthCheck, settings

T = TypeVar("T")

# -- hypothesis profiles -------------------------------------------------------------------------------
# FAULTCAST_HYPOTHESIS_PROFILE picks one; the default is "ci" when CI=true and "dev" otherwise.
# - ci:   derandomized (the same examples on every run: a red build is a real bug, and
#         FAULTCAST_HYPOTHESIS_PROFILE=ci replays it anywhere), 100 examples, no example database.
# - dev:  fresh random examples, 100 of them; a failure is saved in .hypothesis/ and replayed first.
# - fast: fresh random examples, 20 of them: the edit-run loop (`make fast`).
# In all three, no deadline and no `too_slow` health check: both time the test or its example
# generation on the wall clock, which on a shared machine (CI runners, parallel builds) measures the
# neighbours; speed is measured in bench/, never in a timed test. Every other health check stays on,
# `data_too_large` included: tests/test_fuzz.py sizes its strategies well inside hypothesis's budget.
_UNTIMED = [HealthCheck.too_slow]
settings.register_profile(
    "ci", derandomize=True, max_examples=100, database=None, deadline=None, suppress_health_check=_UNTIMED
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=_UNTIMED)
settings.register_profile("fast", max_examples=20, deadline=None, suppress_health_check=_UNTIMED)
settings.load_profile(
    os.environ.get("FAULTCAST_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)


def require_binary(name: str) -> str:
    """Path of a system binary the test runs for real; fails in CI, skips elsewhere, when absent."""
    path = shutil.which(name)
    if path is None:
        missing_part(f"{name} is not installed (make test installs it when run as root)")
    return path


def missing_part(message: str) -> NoReturn:
    """A part of the machine a test needs is not there: fail in CI, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


# -- ports ---------------------------------------------------------------------------------------------
# A port picked, closed and handed to a server is a race: anything may take it in between. In order:
# 1. A server of ours binds port 0 and tells the test what it bound: in process, read the bound
#    socket (`server.server_port`, `Service.start(...)` returns it); a `faultcast collect` process
#    prints "serving /metrics on http://ADDR:PORT/metrics", `faultcast serve --port-file` writes its
#    gRPC port.
# 2. Nothing may listen (a client's "connection refused" path): `refused_port()`.
# 3. An external daemon that takes a port number and cannot report one it chose (Prometheus,
#    slurmctld, slurmd): `start_on_free_ports()`, which starts it again on fresh ports when it could
#    not bind them.


def free_port() -> int:
    """A port that was free a moment ago. Racy on its own: use one of the three ways above."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago (all held open together while picked)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


@contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where a connection is refused at once, for as long as the block runs: a
    socket holds it bound but never listens, so no other process can start listening there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


class AddressInUseError(Exception):
    """What a start function given to `start_on_free_ports` raises when its daemon could not bind."""


def start_on_free_ports(start: Callable[[list[int]], T], count: int = 1, attempts: int = 5) -> T:
    """Start an external daemon that needs port numbers up front: `start(ports)` with `count` ports
    free a moment ago. `start` waits until the daemon serves and raises AddressInUseError (after cleaning
    up) when the daemon failed to bind one of them because another process took it in between; then
    it is tried again on fresh ports, `attempts` times in all. Any other failure propagates at once."""
    for _ in range(attempts - 1):
        try:
            return start(free_ports(count))
        except AddressInUseError:
            continue
    return start(free_ports(count))


@pytest.fixture(scope="session")
def service_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model good enough to catch a clear HBM precursor, for the service's tests: the demo model
    (faultcast.demo.model: a 32-node twin over 6 days at 200x the failure rate, few trees). For a faster
    edit-run loop, FAULTCAST_TEST_SERVICE_MODEL names a model directory trained that way to use instead
    (never set in CI)."""
    cached = os.environ.get("FAULTCAST_TEST_SERVICE_MODEL")
    if cached:
        return Path(cached)
    from faultcast.demo.model import train_demo_model

    return train_demo_model(tmp_path_factory.mktemp("service-model"), tmp_path_factory.mktemp("service-data"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs) to fill up. Mounting needs root: outside CI the tests that
    use it are skipped without; in CI (CI=true) they fail instead, so the check cannot go quiet."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}"
        missing_part(reason)
    try:
        yield where
    finally:
        # Lazily: a test that failed may still hold a spool open there.
        subprocess.run(["umount", "--lazy", str(where)], check=True)
