"""A service killed with SIGKILL and restarted on the same state keeps the
circuit breaker's window (a crash loop cannot drain without limit) and the grace deadline of every
open snapshot-and-migrate alert (the drain comes at opened + grace, not restart + grace, and at once
when the deadline passed while the service was down).

First as the probe ran it, `faultcast serve` with a webhook actuator killed with SIGKILL; then
in-process, a Remediator abandoned without stop() and a new one over the same database file, with
a monotonic and a wall clock the test moves (the monotonic one starts again, as after a reboot)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.remediation.actuators import CircuitBreaker
from faultcast.service.remediation.remediator import BREAKER_WINDOW_KEY, GRACE_DEADLINES_KEY
from faultcast.service.state.acks import Ack
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from tests.attacks.remediation_parts import Clocks, migrate_alert, remediator_on
from tests.serve_process import ServeProcess

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
GPU, FAIL_S = 6, 8 * 3600.0
BEFORE = int((FAIL_S - 2 * 60) / FLEET.cadence_s)  # samples up to 2 min before the failure
WAIT_S = 60.0
DB = "faultcast-service.sqlite"


# -- the service as a process ---------------------------------------------------------------


class _Webhook(BaseHTTPRequestHandler):
    """The drain receiver: records (node, alert id) of every POST."""

    received: ClassVar[list[tuple[str, int]]] = []
    arrived: ClassVar[threading.Condition] = threading.Condition()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with type(self).arrived:
            type(self).received.append((str(body["node"]), int(body["alert_id"])))
            type(self).arrived.notify_all()
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass

    @classmethod
    def wait_for(cls, nodes: set[str]) -> list[tuple[str, int]]:
        """Every POST once each of `nodes` has been drained."""
        with cls.arrived:
            if not cls.arrived.wait_for(lambda: nodes <= {n for n, _ in cls.received}, WAIT_S):
                raise AssertionError(f"drains within {WAIT_S} s: {cls.received}, expected {sorted(nodes)}")
            return list(cls.received)

    @classmethod
    def nodes(cls) -> set[str]:
        with cls.arrived:
            return {node for node, _ in cls.received}


@pytest.fixture
def webhook() -> Iterator[str]:
    _Webhook.received = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/drain"
    httpd.shutdown()
    httpd.server_close()


class _Served(ServeProcess):
    """One `faultcast serve` process (with the webhook actuator among its flags)."""

    def __init__(self, model: Path, state: Path, log: Path, *flags: str) -> None:
        super().__init__(model, state, log, *flags)
        self.state = state

    def raise_alert(self, node: int) -> None:
        """Push a twin node's samples up to 5 min before an HBM failure: a snapshot-and-migrate alert."""
        name = FLEET.node_name(node)
        source = TwinSource(FLEET, node, [Scenario("hbm_wear", node, GPU, FAIL_S, 40 * 60.0)])
        push(self.channel, name, twin_snapshots(source, name, BEFORE))


@pytest.fixture
def served() -> Iterator[list[_Served]]:
    started: list[_Served] = []
    yield started
    for s in started:
        s.close()


def _finished(state: Path) -> dict[str, list[tuple[str, str]]]:
    """node -> (outcome, detail) of each of its remediations no longer pending, read as another
    process (a node may have had more than one alert)."""
    with closing(sqlite3.connect(f"file:{state / DB}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT node, outcome, detail FROM remediations WHERE outcome != 'pending' ORDER BY alert_id"
        ).fetchall()
    out: dict[str, list[tuple[str, str]]] = {}
    for node, outcome, detail in rows:
        out.setdefault(str(node), []).append((str(outcome), str(detail)))
    return out


def _deadlines(state: Path) -> dict[int, float]:
    """The grace deadlines (alert -> unix time) the service keeps on disk."""
    with closing(sqlite3.connect(f"file:{state / DB}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM settings WHERE key = ?", (GRACE_DEADLINES_KEY,)).fetchone()
    return {} if row is None else {int(k): float(v) for k, v in json.loads(row[0]).items()}


def _register(served: _Served, nodes: list[int]) -> None:
    names = [FLEET.node_name(n) for n in nodes]
    apb_grpc.AlertsStub(served.channel).RegisterJob(apb.RegisterJobRequest(job_id="job-c", nodes=names))


def test_a_crash_loop_does_not_reset_the_circuit_breaker(
    service_model: Path, tmp_path: Path, webhook: str, served: list[_Served]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    flags = (
        "--actuator",
        "webhook",
        "--webhook-url",
        webhook,
        "--max-drains",
        "2",
        "--drain-window",
        "1h",
        "--grace",
        "1ms",
    )
    first = _Served(service_model, state, tmp_path / "serve.log", *flags)
    served.append(first)
    _register(first, [0, 1, 2, 3])
    drained = {FLEET.node_name(0), FLEET.node_name(1)}
    for node in (0, 1):
        first.raise_alert(node)
    _Webhook.wait_for(drained)
    first.kill()

    second = _Served(service_model, state, tmp_path / "serve.log", *flags)
    served.append(second)
    open_at_start = second.metric("faultcast_remediation_circuit_open")
    for node in (2, 3):
        second.raise_alert(node)
    refused = {FLEET.node_name(2), FLEET.node_name(3)}
    second.until(lambda: refused <= set(_finished(state)))
    outcomes = _finished(state)
    assert _Webhook.nodes() == drained
    for name in refused:
        for outcome, detail in outcomes[name]:
            assert (outcome, "circuit breaker: 2 nodes already taken out" in detail) == ("refused", True)
    assert open_at_start == 1.0  # the window came back with the restart, before any new alert


def test_a_drain_whose_deadline_passed_while_the_service_was_down_comes_at_once_after_restart(
    service_model: Path, tmp_path: Path, webhook: str, served: list[_Served]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    name = FLEET.node_name(1)
    webhook_flags = ("--actuator", "webhook", "--webhook-url", webhook)
    first = _Served(service_model, state, tmp_path / "serve.log", *webhook_flags, "--grace", "5s")
    served.append(first)
    _register(first, [1])
    first.raise_alert(1)
    first.until(lambda: _deadlines(state) != {})
    first.kill()  # as the probe did: moments after the alert opened, its job registered
    assert _Webhook.received == [], "killed after the grace period: the test needs a less loaded machine"
    ((alert_id, due_unix),) = _deadlines(state).items()
    # Down until past the deadline (the outage itself, not a wait on something to happen).
    time.sleep(max(0.0, due_unix - time.time()) + 0.1)

    # Restarted with a grace of an hour: the drain is owed already, and comes at once.
    second = _Served(service_model, state, tmp_path / "serve.log", *webhook_flags, "--grace", "1h")
    served.append(second)
    assert _Webhook.wait_for({name}) == [(name, alert_id)]
    second.until(lambda: name in _finished(state) and _deadlines(state) == {})
    assert [outcome for outcome, _ in _finished(state)[name]] == ["ok"]
    assert _Webhook.received == [(name, alert_id)]


# -- in process: a Remediator abandoned, a new one over the same file -------------------------


GRACE_S = 60.0


def _opened(path: Path, clocks: Clocks, node: str = "a") -> apb.Alert:
    """An alert opened under a first remediator, which is then abandoned 1 s later (killed)."""
    first, _, store = remediator_on(path, clocks, GRACE_S)
    store.jobs.register("j1", ["a", "b", "c", "d"])
    alert = migrate_alert(store, node)
    first.on_alerts([alert])
    clocks.advance(1.0)
    return alert


def test_the_grace_deadline_survives_a_kill_and_fires_at_opened_plus_grace(tmp_path: Path) -> None:
    clocks = Clocks()
    alert = _opened(tmp_path, clocks)
    clocks.restart(down_s=20.0)  # back 21 s after the alert opened
    second, actuator, store = remediator_on(tmp_path, clocks, GRACE_S)
    second.resume()
    clocks.advance(GRACE_S - 22.0)
    second.run_once()
    assert actuator.seen == []  # 59 s after it opened
    clocks.advance(2.0)
    second.run_once()  # 61 s after it opened, not 60 s after the restart
    assert [r.alert_id for r in actuator.seen] == [alert.id]
    assert store.settings.get(GRACE_DEADLINES_KEY) is None  # fired: nothing left on disk
    clocks.advance(3600.0)
    assert second.run_once() == 0


def test_a_deadline_that_passed_while_the_service_was_down_fires_at_once(tmp_path: Path) -> None:
    clocks = Clocks()
    alert = _opened(tmp_path, clocks)
    clocks.restart(down_s=600.0)
    second, actuator, _ = remediator_on(tmp_path, clocks, GRACE_S)
    second.resume()
    assert second.run_once() == 1
    assert [r.alert_id for r in actuator.seen] == [alert.id]


def test_a_wall_clock_set_back_never_stretches_a_deadline_past_a_full_grace(tmp_path: Path) -> None:
    clocks = Clocks()
    alert = _opened(tmp_path, clocks)
    clocks.restart(down_s=-3600.0)  # the wall clock went back an hour meanwhile
    second, actuator, _ = remediator_on(tmp_path, clocks, GRACE_S)
    second.resume()
    clocks.advance(GRACE_S + 1)
    second.run_once()
    assert [r.alert_id for r in actuator.seen] == [alert.id]


def test_the_deadline_of_an_alert_whose_risk_fell_is_dropped_and_not_fired_after_restart(
    tmp_path: Path,
) -> None:
    clocks = Clocks()
    first, _, store = remediator_on(tmp_path, clocks, GRACE_S)
    store.jobs.register("j1", ["a", "b"])
    calm, hot = migrate_alert(store, "a"), migrate_alert(store, "b")
    first.on_alerts([calm, hot])
    (cleared,) = store.alerts.append(
        [
            apb.Alert(
                node="a",
                gpu=1,
                state=apb.ALERT_STATE_CLEARED,
                kind=apb.EVENT_KIND_CLEARED,
                opened_id=calm.id,
                action=calm.action,
                clear_reason=apb.CLEAR_REASON_RISK_FELL,
            ),
        ]
    )
    first.on_alerts([cleared])
    assert set(json.loads(store.settings.get(GRACE_DEADLINES_KEY) or "{}")) == {str(hot.id)}  # kept small
    clocks.restart(down_s=600.0)
    second, actuator, _ = remediator_on(tmp_path, clocks, GRACE_S)
    second.resume()
    second.run_once()
    assert [r.node for r in actuator.seen] == ["b"]


def test_the_breaker_window_survives_a_kill_and_ends_on_the_wall_clock(tmp_path: Path) -> None:
    clocks = Clocks()
    first, _, store = remediator_on(
        tmp_path, clocks, GRACE_S, breaker=CircuitBreaker(max_nodes=2, window_s=600.0)
    )
    store.jobs.register("j1", ["a", "b", "c", "d"])
    for node in ("a", "b"):
        first.on_ack(Ack(migrate_alert(store, node).id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    first.run_once()
    assert [outcome for _, outcome, _ in first.done] == ["ok", "ok"]

    clocks.restart(down_s=100.0)  # killed; back 100 s later, with a fresh breaker from the command line
    second, actuator, store = remediator_on(
        tmp_path, clocks, GRACE_S, breaker=CircuitBreaker(max_nodes=2, window_s=600.0)
    )
    assert second.breaker.is_open(clocks.mono())
    third = migrate_alert(store, "c")
    second.on_ack(Ack(third.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    second.run_once()
    assert actuator.seen == []
    assert store.remediations.of(third.id) == (
        "refused",
        "circuit breaker: 2 nodes already taken out in 600 s; c left in service",
    )
    clocks.advance(501.0)  # the first two were taken out 601 s ago by the wall clock
    assert not second.breaker.is_open(clocks.mono())
    second.on_ack(Ack(migrate_alert(store, "d").id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 1, ""))
    second.run_once()
    assert [r.node for r in actuator.seen] == ["d"]
    # Only admissions within the window stay on disk.
    assert [node for _, node in json.loads(store.settings.get(BREAKER_WINDOW_KEY) or "[]")] == ["d"]
