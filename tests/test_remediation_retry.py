"""A failing actuator is retried with backoff and surfaced: real Remediator and StateStore, a clock
the test moves, an actuator that fails a set number of times; and a remediation cut off by a kill
is carried on at the next start."""

from __future__ import annotations

import logging
import random
import select
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import CircuitBreaker, Outcome, Remediation, RetryPolicy
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.acks import Ack
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clock, migrate_alert

START_S = Clock().now  # where the test's clock stands until moved
NO_JITTER = RetryPolicy(initial_s=5.0, multiplier=2.0, max_s=15.0, max_attempts=6, jitter=0.0)


class _Flaky:
    """Fails the first `failures[node]` calls for a node, then succeeds. Failures alternate between
    an exception (odd calls) and a not-ok outcome (even calls), each naming its call number."""

    name = "flaky"

    def __init__(self, clock: Clock, failures: dict[str, int]) -> None:
        self.clock, self.failures = clock, failures
        self.calls: list[tuple[str, float]] = []  # (node, clock time) of every call

    def remediate(self, remediation: Remediation) -> Outcome:
        self.calls.append((remediation.node, self.clock()))
        call = sum(1 for node, _ in self.calls if node == remediation.node)
        if call > self.failures.get(remediation.node, 0):
            return Outcome(True, f"drained {remediation.node}")
        if call % 2:
            raise RuntimeError(f"scheduler down (call {call})")
        return Outcome(False, f"HTTP 503 (call {call})")


class _Killed(BaseException):
    """Stands in for SIGKILL inside the actuator call: nothing after it runs."""


class _Dying:
    name = "dying"

    def remediate(self, remediation: Remediation) -> Outcome:
        raise _Killed


def _snapshot_done(remediator: Remediator, alert: apb.Alert) -> str:
    return remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 9, f"s3://ckpt/{alert.id}"))


def _advance(remediator: Remediator, clock: Clock, to_s: float) -> None:
    """Move the clock a second at a time to `to_s`, running the remediator at each tick."""
    while clock.now < to_s:
        clock.now += 1.0
        remediator.run_once()


def _value(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    store = StateStore.in_dir(tmp_path)
    store.jobs.register("j1", ["a", "b", "c"])
    return store


def test_a_failing_actuator_is_retried_with_exponential_backoff_and_remediated_once(
    store: StateStore,
) -> None:
    clock, metrics = Clock(), ServiceMetrics()
    actuator = _Flaky(clock, {"a": 4})
    remediator = Remediator(store, actuator, metrics, clock=clock, retry=NO_JITTER)
    alert = migrate_alert(store, "a")
    _snapshot_done(remediator, alert)
    assert remediator.run_once() == 1
    assert store.remediations.of(alert.id) == ("pending", "RuntimeError: scheduler down (call 1)")
    assert _value(metrics, "faultcast_remediation_retries_pending") == 1
    assert "being remediated" in _snapshot_done(remediator, alert)

    _advance(remediator, clock, START_S + 600)
    waits = [b - a for (_, a), (_, b) in zip(actuator.calls, actuator.calls[1:], strict=False)]
    assert waits == [5.0, 10.0, 15.0, 15.0]  # doubling from 5 s, capped at 15 s
    [(remediation, outcome, detail)] = remediator.done
    assert (remediation.alert_id, outcome) == (alert.id, "ok")
    assert detail == "drained a (on attempt 5)"
    assert store.remediations.of(alert.id) == ("ok", detail)
    assert _value(metrics, "faultcast_remediation_retries_total") == len(actuator.calls) - 1
    assert _value(metrics, "faultcast_remediation_retries_pending") == 0
    assert _value(metrics, "faultcast_remediations_total", actuator="flaky", outcome="ok") == 1
    assert _value(metrics, "faultcast_remediations_total", actuator="flaky", outcome="failed") == 0
    assert "already remediated" in _snapshot_done(remediator, alert)
    _advance(remediator, clock, clock.now + 600)
    assert len(actuator.calls) == 5
    store.close()


def test_after_the_last_attempt_the_remediation_fails_with_the_last_error(
    store: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    clock, metrics = Clock(), ServiceMetrics()
    actuator = _Flaky(clock, {"a": 100})
    policy = RetryPolicy(initial_s=5.0, multiplier=2.0, max_s=300.0, max_attempts=3, jitter=0.0)
    remediator = Remediator(store, actuator, metrics, clock=clock, retry=policy)
    alert = migrate_alert(store, "a")
    _snapshot_done(remediator, alert)
    with caplog.at_level(logging.WARNING, logger="faultcast.service.remediation.remediator"):
        remediator.run_once()
        _advance(remediator, clock, START_S + 3600)
    assert [t - START_S for _, t in actuator.calls] == [0.0, 5.0, 15.0]
    [(_, outcome, detail)] = remediator.done
    assert outcome == "failed"
    assert detail == "RuntimeError: scheduler down (call 3); gave up after 3 attempts"
    assert store.remediations.of(alert.id) == ("failed", detail)
    assert _value(metrics, "faultcast_remediations_total", actuator="flaky", outcome="failed") == 1
    assert _value(metrics, "faultcast_remediation_retries_total") == 2
    assert _value(metrics, "faultcast_remediation_retries_pending") == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"remediation of alert {alert.id} on a: failed ({detail})"]
    store.close()


def test_a_retry_waits_in_backoff_without_holding_up_other_remediations(store: StateStore) -> None:
    clock = Clock()
    actuator = _Flaky(clock, {"a": 1})
    remediator = Remediator(store, actuator, ServiceMetrics(), clock=clock, retry=NO_JITTER)
    first, second = migrate_alert(store, "a"), migrate_alert(store, "b")
    _snapshot_done(remediator, first)
    _snapshot_done(remediator, second)
    assert remediator.run_once() == 2
    # One pass tried each once: node a's retry is a timer, not a wait in line before node b.
    assert actuator.calls == [("a", START_S), ("b", START_S)]
    assert [(r.node, outcome) for r, outcome, _ in remediator.done] == [("b", "ok")]
    clock.now += 4.0
    assert remediator.run_once() == 0
    clock.now += 1.0
    assert remediator.run_once() == 1
    assert [(r.node, outcome) for r, outcome, _ in remediator.done] == [("b", "ok"), ("a", "ok")]
    store.close()


def test_the_circuit_breaker_counts_a_retried_node_once(store: StateStore) -> None:
    clock = Clock()
    actuator = _Flaky(clock, {"a": 1})
    policy = RetryPolicy(initial_s=15.0, multiplier=2.0, max_s=300.0, max_attempts=3, jitter=0.0)
    breaker = CircuitBreaker(max_nodes=1, window_s=10.0)
    remediator = Remediator(store, actuator, ServiceMetrics(), clock=clock, retry=policy, breaker=breaker)
    _snapshot_done(remediator, migrate_alert(store, "a"))
    remediator.run_once()  # node a admitted, its drain fails
    clock.now = START_S + 11  # the window has moved past node a
    _snapshot_done(remediator, migrate_alert(store, "b"))
    remediator.run_once()  # node b fills the breaker
    _advance(remediator, clock, START_S + 15)  # node a's retry: no new node, so not refused
    clock.now += 1
    _snapshot_done(remediator, migrate_alert(store, "c"))
    remediator.run_once()
    assert [(r.node, outcome) for r, outcome, _ in remediator.done] == [
        ("b", "ok"),
        ("a", "ok"),
        ("c", "refused"),
    ]
    assert breaker.tripped == 1
    store.close()


def test_a_job_is_told_the_truth_when_the_breaker_or_a_pause_refuses_its_remediation(
    store: StateStore,
) -> None:
    clock = Clock()
    actuator = _Flaky(clock, {})
    breaker = CircuitBreaker(max_nodes=1, window_s=600.0)
    remediator = Remediator(store, actuator, ServiceMetrics(), clock=clock, breaker=breaker)
    assert _snapshot_done(remediator, migrate_alert(store, "a")) == "flaky: drain a and requeue job j1"
    remediator.run_once()

    full = migrate_alert(store, "b")
    answer = _snapshot_done(remediator, full)  # the breaker is full: b stays, and the job hears so
    assert answer.startswith("refused: circuit breaker: 1 nodes already taken out in 600 s")
    assert "drain b" not in answer
    assert "requeue job j1" not in answer.replace("not requeued", "")
    outcome, detail = store.remediations.of(full.id) or ("", "")
    assert (outcome, detail) == (
        "refused",
        "circuit breaker: 1 nodes already taken out in 600 s; b left in service",
    )
    assert _snapshot_done(remediator, full).startswith(f"refused: {detail}")  # asked again: the same

    remediator.set_paused("admin 'alice'")
    clock.now += 601  # the breaker's window is over; the pause is not
    paused = migrate_alert(store, "c")
    assert _snapshot_done(remediator, paused).startswith("refused: remediation paused by admin 'alice'")
    remediator.run_once()
    assert [node for node, _ in actuator.calls] == ["a"]  # b and c were never touched
    store.close()


def test_the_backoff_is_capped_and_jitter_only_shortens_it() -> None:
    policy = RetryPolicy(initial_s=5.0, multiplier=3.0, max_s=100.0, max_attempts=50, jitter=0.25)
    assert [policy.delay_s(n, 0.0) for n in (1, 2, 3, 4, 5, 49)] == [5.0, 15.0, 45.0, 100.0, 100.0, 100.0]
    assert policy.delay_s(2, 0.5) == pytest.approx(15.0 * 0.875)
    rng = random.Random(4)
    delays = {policy.delay_s(3, rng.random()) for _ in range(100)}
    assert min(delays) >= 45.0 * 0.75
    assert max(delays) <= 45.0
    assert len(delays) > 50  # spread out, so failures that came together do not retry together
    for bad in (
        {"max_attempts": 0},
        {"initial_s": 0.0},
        {"max_s": 1.0},
        {"multiplier": 0.5},
        {"jitter": 1.0},
    ):
        with pytest.raises(ValueError, match="retry policy"):
            RetryPolicy(**bad)


def test_the_remediator_draws_its_jitter_from_the_policy(store: StateStore) -> None:
    clock = Clock()
    actuator = _Flaky(clock, {"a": 1})
    policy = RetryPolicy(initial_s=8.0, multiplier=2.0, max_s=300.0, max_attempts=3, jitter=0.5)
    rng = random.Random(11)
    expected = policy.delay_s(1, random.Random(11).random())
    assert expected < 8.0
    remediator = Remediator(store, actuator, ServiceMetrics(), clock=clock, retry=policy, rng=rng)
    _snapshot_done(remediator, migrate_alert(store, "a"))
    remediator.run_once()
    clock.now = START_S + expected - 0.001
    assert remediator.run_once() == 0
    clock.now = START_S + expected
    assert remediator.run_once() == 1
    assert [outcome for _, outcome, _ in remediator.done] == ["ok"]
    store.close()


# -- restarts -------------------------------------------------------------------------------------

_KILLED_IN_THE_ACTUATOR = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from faultcast.service.metrics import ServiceMetrics
    from faultcast.service.remediation.actuators import Outcome, Remediation
    from faultcast.service.remediation.remediator import Remediator
    from faultcast.service.state.store import StateStore
    from faultcast.service.state.acks import Ack
    from faultcast.v1 import alerts_pb2 as apb

    class Hang:
        name = "hang"
        def remediate(self, remediation: Remediation) -> Outcome:
            print("acting", remediation.alert_id, flush=True)
            threading.Event().wait()  # until the parent kills the process
            raise AssertionError("not reached")

    store = StateStore.in_dir(Path(sys.argv[1]))
    store.jobs.register("j1", ["a"])
    alert = store.alerts.append([apb.Alert(
        node="a", gpu=2, mode=apb.FAILURE_MODE_NVLINK, risk=0.8,
        action=apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE, state=apb.ALERT_STATE_OPEN,
    )])[0]
    remediator = Remediator(store, Hang(), ServiceMetrics())
    remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 9, "s3://ckpt/9"))
    remediator.run_once()
    """
)


def test_a_remediation_cut_off_by_sigkill_is_carried_on_at_the_next_start(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_IN_THE_ACTUATOR, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready, "the child never reached the actuator"
        line = child.stdout.readline()
        assert line.startswith("acting "), child.stderr.read() if child.stderr else ""
        alert_id = int(line.split()[1])
    finally:
        child.kill()  # SIGKILL: no finally, no atexit, the claim stays as it was
        child.communicate(timeout=60)

    clock, metrics = Clock(), ServiceMetrics()
    store = StateStore.in_dir(tmp_path)
    assert store.remediations.of(alert_id) == ("pending", "")
    actuator = _Flaky(clock, {})
    remediator = Remediator(store, actuator, metrics, clock=clock, retry=NO_JITTER)
    assert remediator.run_once() == 0  # nothing queued in this process yet
    assert remediator.resume() == 1
    assert remediator.resume() == 0  # once: a second call must not drain twice
    assert remediator.run_once() == 1
    [(remediation, outcome, detail)] = remediator.done
    assert (remediation.alert_id, remediation.node, remediation.job_id) == (alert_id, "a", "j1")
    assert remediation.checkpoint_uri == "s3://ckpt/9"
    assert (outcome, detail) == ("ok", "drained a (on attempt 2)")  # the cut-off attempt counts
    assert store.remediations.of(alert_id) == ("ok", detail)
    assert _value(metrics, "faultcast_remediation_retries_total") == 1
    store.close()
    again = StateStore.in_dir(tmp_path)
    assert Remediator(again, actuator, ServiceMetrics()).resume() == 0
    assert len(actuator.calls) == 1
    again.close()


def test_a_retry_waiting_at_shutdown_is_carried_on_with_its_attempts_counted(tmp_path: Path) -> None:
    policy = RetryPolicy(initial_s=5.0, multiplier=2.0, max_s=300.0, max_attempts=3, jitter=0.0)
    store, clock = StateStore.in_dir(tmp_path), Clock()
    store.jobs.register("j1", ["a"])
    first = Remediator(store, _Flaky(clock, {"a": 100}), ServiceMetrics(), clock=clock, retry=policy)
    alert = migrate_alert(store, "a")
    _snapshot_done(first, alert)
    first.run_once()  # attempt 1 fails; the service stops while its retry waits
    store.close()

    store = StateStore.in_dir(tmp_path)
    actuator = _Flaky(clock, {"a": 100})
    second = Remediator(store, actuator, ServiceMetrics(), clock=clock, retry=policy)
    assert second.resume() == 1
    second.run_once()
    _advance(second, clock, START_S + 3600)
    assert len(actuator.calls) == 2  # attempts 2 and 3
    [(_, outcome, detail)] = second.done
    assert (outcome, detail) == ("failed", "HTTP 503 (call 2); gave up after 3 attempts")
    assert store.remediations.pending() == []
    store.close()


def test_an_actuator_that_kills_the_service_is_not_retried_forever(tmp_path: Path) -> None:
    policy = RetryPolicy(initial_s=5.0, multiplier=2.0, max_s=300.0, max_attempts=3, jitter=0.0)
    store = StateStore.in_dir(tmp_path)
    store.jobs.register("j1", ["a"])
    dying = Remediator(store, _Dying(), ServiceMetrics(), retry=policy)
    _snapshot_done(dying, migrate_alert(store, "a"))
    kills = 0
    for _ in range(2 * policy.max_attempts):  # each attempt ends in a "kill", each restart carries on
        with pytest.raises(_Killed):
            dying.run_once()
        kills += 1
        dying = Remediator(store, _Dying(), ServiceMetrics(), retry=policy)
        if dying.resume() == 0:
            break
    assert kills == policy.max_attempts
    [(_, outcome, detail)] = dying.done
    assert outcome == "failed"
    assert detail == "no outcome stored; gave up after 3 attempts (the last cut off by a restart)"
    assert store.remediations.pending() == []
    store.close()


def test_a_remediation_left_pending_by_an_older_version_is_surfaced_as_failed(tmp_path: Path) -> None:
    path = tmp_path / "faultcast-service.sqlite"
    with sqlite3.connect(path) as db:  # the remediations table as it was before retries
        db.execute(
            "CREATE TABLE alerts (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, gpu INTEGER NOT NULL, "
            "state INTEGER NOT NULL, opened_id INTEGER NOT NULL, payload BLOB NOT NULL)"
        )
        db.execute(
            "CREATE TABLE remediations (alert_id INTEGER PRIMARY KEY, node TEXT NOT NULL, "
            "actuator TEXT NOT NULL, outcome TEXT NOT NULL, detail TEXT NOT NULL, at_unix REAL NOT NULL)"
        )
        db.execute("INSERT INTO remediations VALUES (7, 'a', 'slurm', 'pending', '', 0)")
    db.close()
    store = StateStore.in_dir(tmp_path)
    actuator = _Flaky(Clock(), {})
    remediator = Remediator(store, actuator, ServiceMetrics())
    assert remediator.resume() == 0
    assert actuator.calls == []
    outcome, detail = store.remediations.of(7) or ("", "")
    assert outcome == "failed"
    assert "drain a by hand" in detail
    store.close()
