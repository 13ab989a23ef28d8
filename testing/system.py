"""System parts a test runs for real (fail in CI, skip elsewhere, when absent) and ports for daemons
that cannot report the one they bound."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import NoReturn, TypeVar

import pytest

T = TypeVar("T")


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
#    prints "serving /metrics on http://ADDR:PORT/metrics", `faultcast serve --port-file` and
#    `--metrics-port-file` write its gRPC and /metrics ports.
# 2. Nothing may listen (a client's "connection refused" path): `refused_port()`.
# 3. An external daemon that takes a port number and cannot report one it chose (Prometheus,
#    slurmctld, slurmd): `start_on_free_ports()`, which starts it again on fresh ports when it could
#    not bind them.


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago (all held open together while picked); racy on
    its own, for `start_on_free_ports` alone."""
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
