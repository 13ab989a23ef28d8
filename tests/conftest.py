"""Shared fixtures. Real parts only: a test that needs a system binary fails in CI when it is missing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

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


def free_port() -> int:
    """A port that was free a moment ago, for servers that cannot bind port 0 themselves."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
