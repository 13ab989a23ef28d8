"""`faultcast serve` as operators run it: killed with SIGKILL and restarted on the same state
directory, a subscriber resumes after its last alert id with no gap, the collector's replay is not
taken twice, SIGHUP reloads the model, SIGTERM stops it cleanly."""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import grpc
import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.serve_process import ServeProcess

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU, FAIL_S = 1, 6, 8 * 3600.0
NAME = FLEET.node_name(NODE)
BEFORE = int((FAIL_S - 5 * 60) / FLEET.cadence_s)
WAIT_S = 60.0


def _cursor(state: Path) -> int:
    with closing(sqlite3.connect(f"file:{state / 'faultcast-service.sqlite'}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT MAX(last_sequence) FROM cursors WHERE node = ?", (NAME,)).fetchone()
    return int(row[0] or 0)


def _subscribe(channel: grpc.Channel, resume_after: int) -> queue.Queue[apb.Alert]:
    """The job's alert events after `resume_after`; without a cursor, the whole log's."""
    out: queue.Queue[apb.Alert] = queue.Queue()
    start = apb.START_FROM_HISTORY if resume_after == 0 else apb.START_FROM_UNSPECIFIED
    stream = apb_grpc.AlertsStub(channel).Subscribe(
        apb.SubscribeRequest(job_id="job-r", resume_after=resume_after, start=start)
    )

    def listen() -> None:
        try:
            for event in stream:
                if event.HasField("alert"):
                    out.put(event.alert)
        except grpc.RpcError:
            pass  # cancelled, or the service was killed

    threading.Thread(target=listen, daemon=True).start()
    return out


def _get(alerts: queue.Queue[apb.Alert]) -> apb.Alert:
    try:
        return alerts.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError(f"no alert within {WAIT_S} s") from None


@pytest.fixture
def served(service_model: Path, tmp_path: Path) -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for s in started:
        s.close()


def test_a_killed_service_restarts_and_subscribers_resume_with_no_gap(
    service_model: Path, tmp_path: Path, served: list[ServeProcess]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = ServeProcess(service_model, state, tmp_path / "serve.log")
    served.append(first)
    assert "INSECURE" in (tmp_path / "serve.log").read_text()  # --insecure says so at start
    apb_grpc.AlertsStub(first.channel).RegisterJob(apb.RegisterJobRequest(job_id="job-r", nodes=[NAME]))
    alerts = _subscribe(first.channel, 0)
    source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
    sent = list(twin_snapshots(source, NAME, BEFORE))
    push(first.channel, NAME, sent)
    opened = _get(alerts)
    assert (opened.state, opened.node, opened.gpu) == (apb.ALERT_STATE_OPEN, NAME, GPU)
    first.until(lambda: _cursor(state) == BEFORE)
    seen = opened.id
    while not alerts.empty():
        seen = alerts.get_nowait().id  # escalations of the same alert, if any
    first.kill()

    second = ServeProcess(service_model, state, tmp_path / "serve.log")
    served.append(second)
    resumed = _subscribe(second.channel, seen)
    replay = sent[-2:]  # the collector resends what it had not seen acked
    after = list(twin_snapshots(source, NAME, 15, first_sequence=BEFORE + 1))
    acks = push(second.channel, NAME, replay + after)
    assert acks[-1].acked_through == BEFORE + 15
    assert not any(a.rejections for a in acks)
    cleared = _get(resumed)
    while cleared.state != apb.ALERT_STATE_CLEARED:
        assert cleared.id > seen
        cleared = _get(resumed)
    assert cleared.id > seen
    assert cleared.opened_id == opened.id
    assert cleared.cleared_reason == "gpu dark"
    duplicates = second.metric("faultcast_ingest_duplicates_total")
    assert duplicates == 2.0

    from_start = _subscribe(second.channel, 0)
    assert _get(from_start).id == opened.id  # the log survived the kill

    second.process.send_signal(signal.SIGHUP)
    second.until(lambda: second.metric('faultcast_model_reloads_total{outcome="ok"}') == 1.0)
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=WAIT_S) == 0
    if os.environ.get("FAULTCAST_KEEP_LOGS"):
        print((tmp_path / "serve.log").read_text())
