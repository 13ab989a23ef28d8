"""Shared fixtures. Real parts only: a test that needs a system binary fails in CI when it is missing."""

from __future__ import annotations

import os
import shutil
import socket

import pytest


def require_binary(name: str) -> str:
    """Path of a system binary the test runs for real; fails in CI, skips elsewhere, when absent."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (make test installs it when run as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    """A port that was free a moment ago, for servers that cannot bind port 0 themselves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
