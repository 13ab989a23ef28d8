"""A background thread that dies is restarted, logged and counted: the probe's
cursor thread died on one bad value and the service stayed SERVING without it for good."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import grpc
import pytest

from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from tests.attacks.victim import NAME, WAIT_S, push_victim


def test_a_cursor_thread_that_dies_is_restarted_counted_and_saves_again(
    stub_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(stub_model, model_dir)
    service = Service.open(
        model_dir, tmp_path / "state", ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))
    )
    save = service.store.cursors.save
    calls = 0
    saved_again = threading.Event()

    def dies_once(cursors: dict[tuple[str, int], int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the cursor thread")
        save(cursors)
        saved_again.set()

    service.store.cursors.save = dies_once  # type: ignore[method-assign]
    port = service.start("127.0.0.1:0")
    try:
        with caplog.at_level(logging.ERROR, logger="faultcast.service.supervise"):
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert push_victim(channel, steps=10)[-1].acked_through == 10
            assert saved_again.wait(WAIT_S), "the cursor thread never saved again after it died"
        assert service.store.cursors.load()[(NAME, 1)] == 10
        assert service.metrics.thread_restarts.labels("cursors")._value.get() == 1
        assert any("the cursors thread died" in r.getMessage() for r in caplog.records)
    finally:
        service.stop(0)
