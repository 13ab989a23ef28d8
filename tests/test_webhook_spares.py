"""Spares through a webhook (service/remediation/spares/webhook.py) against a real local HTTP server: what is
posted, the receiver's handle, failures as results; then with the service's Prescheduler, the
receiver's handle coming back in the release of a false alarm."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareRequest
from faultcast.service.remediation.spares.webhook import WebhookSpares
from faultcast.testing.system import refused_port
from faultcast.v1 import alerts_pb2 as apb
from tests.webhook_receiver import Receiver, receiving

REQUEST = SpareRequest(
    alert_id=42, job_id="1234", node="gpu-17", gpu=3, mode="hbm_wear", risk=0.61, claim="the-claim"
)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    with receiving() as running:
        yield running


def test_prepare_posts_the_event_and_keeps_the_receivers_handle(receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.body = json.dumps({"handle": "standby-job-5678", "queued": True}).encode()

    prepared = WebhookSpares(url).prepare(REQUEST)

    assert prepared.ok, prepared.detail
    assert prepared.handle == "standby-job-5678"
    assert "HTTP 200" in prepared.detail
    [(path, body, headers)] = state.received
    assert path == "/spares"
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "event": "prepare_spare",
        "job_id": "1234",
        "node": "gpu-17",
        "alert_id": 42,
        "gpu": 3,
        "mode": "hbm_wear",
        "risk": 0.61,
        "standby_job_id": "1234-standby-42",
        "standby_env": {
            "FAULTCAST_STANDBY_FOR": "1234",
            "FAULTCAST_STANDBY_ALERT": "42",
            "FAULTCAST_STANDBY_CLAIM": REQUEST.claim,
            "FAULTCAST_JOB_ID": "1234-standby-42",
        },
    }
    assert prepared.standby_job == "1234-standby-42"  # the receiver named none: the service's name


@pytest.mark.parametrize(
    "answer",
    [b"", b"accepted", b'{"id": 7}', b'{"handle": 7}', b'{"handle": "  "}', b'["handle"]', b"\xff\xfe"],
)
def test_a_receiver_that_names_no_handle_gets_the_alerts(
    receiver: tuple[Receiver, str], answer: bytes
) -> None:
    state, url = receiver
    state.status, state.body = 202, answer

    prepared = WebhookSpares(url).prepare(REQUEST)

    assert prepared.ok, prepared.detail
    assert prepared.handle == "alert-42"


def test_release_posts_the_handle_and_why(receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.status = 204

    outcome = WebhookSpares(url, headers={"Authorization": "Bearer s3cret"}).release(
        REQUEST, "standby-job-5678", "the alert cleared: its risk fell back"
    )

    assert outcome.ok, outcome.detail
    assert "standby-job-5678" in outcome.detail
    [(_, body, headers)] = state.received
    assert body == {
        "event": "release_spare",
        "handle": "standby-job-5678",
        "job_id": "1234",
        "alert_id": 42,
        "why": "the alert cleared: its risk fell back",
    }
    assert headers["Authorization"] == "Bearer s3cret"


def test_a_refusing_or_absent_receiver_is_a_result_not_an_exception(receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.status = 503

    prepared = WebhookSpares(url).prepare(REQUEST)
    released = WebhookSpares(url).release(REQUEST, "alert-42", "false alarm")
    with refused_port() as port:
        absent = WebhookSpares(f"http://127.0.0.1:{port}/", timeout_s=2).prepare(REQUEST)

    assert not prepared.ok
    assert prepared.handle == ""
    assert "HTTP 503" in prepared.detail
    assert not released.ok
    assert "HTTP 503" in released.detail
    assert not absent.ok
    assert "refused" in absent.detail.lower()


@pytest.mark.parametrize(("url", "timeout_s"), [("file:///etc/passwd", 5.0), ("http://localhost/", 0.0)])
def test_bad_settings_are_refused(url: str, timeout_s: float) -> None:
    with pytest.raises(ValueError, match=r"."):
        WebhookSpares(url, timeout_s=timeout_s)


def test_a_false_alarm_releases_the_spare_the_receiver_named(receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    state.answers = [(201, b'{"handle": "pod/standby-1234"}')]
    prescheduler = Prescheduler(WebhookSpares(url), lambda: {"1234": ["gpu-17"]}, ServiceMetrics())
    prescheduler.note_job("1234", stands_by=True)  # its trainer registered as able to stand by
    fields: dict[str, Any] = {"node": "gpu-17", "gpu": 3, "mode": apb.FAILURE_MODE_HBM_WEAR, "risk": 0.61}
    opened = apb.Alert(id=42, opened_id=42, state=apb.ALERT_STATE_OPEN, **fields)
    cleared = apb.Alert(
        id=43, opened_id=42, state=apb.ALERT_STATE_CLEARED, clear_reason=apb.CLEAR_REASON_RISK_FELL, **fields
    )
    prescheduler.start()
    try:
        prescheduler.on_alerts([opened])
        prescheduler.drain_calls()
        prescheduler.on_alerts([cleared])
        prescheduler.drain_calls()
    finally:
        prescheduler.stop()

    assert [(body["event"], body.get("handle")) for _, body, _ in state.received] == [
        ("prepare_spare", None),
        ("release_spare", "pod/standby-1234"),
    ]
    assert state.received[1][1]["why"] == "the alert cleared: its risk fell back"
