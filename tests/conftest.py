"""Shared fixtures. Real parts only: a test that needs a system binary fails in CI when it is missing."""

from __future__ import annotations

import os
import shutil
import socket
from typing import NoReturn

import pytest


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


def free_port() -> int:
    """A port that was free a moment ago, for servers that cannot bind port 0 themselves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
