"""A full state disk, the remediator's part: with the state directory full, the remediator's worker
died and nothing was drained again once space came back. Now a write the store refuses is counted,
kept and retried; the worker lives on; each node is drained once, when writes work again.

First on a real full disk (a 4 MiB tmpfs filled to the last byte, where mounting is allowed); then,
to reach each write in turn and the worker thread, the store's write methods raise
sqlite3.OperationalError("database or disk is full") while the test says the disk is full, as
SQLite does on a full disk."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import Outcome, Remediation, RetryPolicy
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.acks import Ack
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clock, migrate_alert
from tests.disk import fill

WAIT_S = 30.0
WRITES = (
    "remediations.claim",
    "remediations.begin_attempt",
    "remediations.note_failed_attempt",
    "remediations.finish",
    "settings.save",
)


class _Disk:
    """Makes the named store writes fail as on a full disk, until `free()`; counts the refusals."""

    def __init__(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full: set[str] = set()
        self.refused: list[str] = []
        self._refusal = threading.Condition()
        for name in WRITES:  # "part.method" of the store
            part, method = name.split(".")
            target = getattr(store, part)
            monkeypatch.setattr(target, method, self._guard(name, getattr(target, method)))

    def _guard(self, name: str, write: Callable[..., object]) -> Callable[..., object]:
        def guarded(*args: object, **kwargs: object) -> object:
            if name in self.full:
                with self._refusal:
                    self.refused.append(name)
                    self._refusal.notify_all()
                full = sqlite3.OperationalError("database or disk is full")
                raise StateWriteError(name, full)  # what the real store raises
            return write(*args, **kwargs)

        return guarded

    def fill(self, *names: str) -> None:
        self.full = set(names or WRITES)

    def free(self) -> None:
        self.full = set()

    def wait_refused(self, name: str) -> None:
        with self._refusal:
            assert self._refusal.wait_for(lambda: name in self.refused, WAIT_S), (
                f"no {name} within {WAIT_S} s"
            )


class _Recording:
    """Drains by recording; fails the first `failures` calls with an outcome not ok."""

    name = "recording"

    def __init__(self, failures: int = 0, on_call: Callable[[], None] | None = None) -> None:
        self.seen: list[Remediation] = []
        self.failures, self.on_call = failures, on_call

    def remediate(self, remediation: Remediation) -> Outcome:
        self.seen.append(remediation)
        if self.on_call is not None:
            self.on_call()
        if len(self.seen) <= self.failures:
            return Outcome(False, f"HTTP 503 (call {len(self.seen)})")
        return Outcome(True, f"drained {remediation.node}")


def _failures(metrics: ServiceMetrics) -> float:
    return (
        metrics.registry.get_sample_value("faultcast_state_write_failures_total", {"what": "remediation"})
        or 0
    )


def _restarts(metrics: ServiceMetrics) -> float:
    return metrics.registry.get_sample_value("faultcast_thread_restarts_total", {"thread": "remediator"}) or 0


def _worker_alive() -> bool:
    return any(t.name == "faultcast-remediator" and t.is_alive() for t in threading.enumerate())


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    store = StateStore.in_dir(tmp_path)
    store.jobs.register("j1", ["a", "b"])
    return store


def test_on_a_real_full_disk_the_drain_waits_and_happens_once_space_comes_back(small_disk: Path) -> None:
    clock, metrics, actuator = Clock(), ServiceMetrics(), _Recording()
    # Wired as the service wires it: the store counts its refused writes.
    store = StateStore.in_dir(
        small_disk / "state", on_write_failed=lambda what: metrics.state_write_failures.labels(what).inc()
    )
    store.jobs.register("j1", ["a"])
    remediator = Remediator(store, actuator, metrics, clock=clock)
    alert = migrate_alert(store, "a")
    remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 3, ""))
    filler = fill(small_disk)
    for _ in range(3):
        remediator.run_once()  # the attempt is refused: nothing is drained that is not on disk
        clock.now += 1.0
    assert actuator.seen == []
    assert store.remediations.of(alert.id) == ("pending", "")  # claimed at the ack, before the disk filled
    assert _failures(metrics) >= 2
    filler.unlink()
    remediator.run_once()
    assert [r.alert_id for r in actuator.seen] == [alert.id]
    assert store.remediations.of(alert.id) == ("ok", "drained a")
    clock.now += 3600.0
    assert remediator.run_once() == 0
    store.close()


def test_the_worker_survives_a_full_disk_and_drains_once_space_comes_back(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, metrics, actuator = Clock(), ServiceMetrics(), _Recording()
    remediator = Remediator(store, actuator, metrics, grace_s=60.0, clock=clock)
    disk = _Disk(store, monkeypatch)
    remediator.start()
    try:
        first = migrate_alert(store, "a")
        disk.fill()
        remediator.on_alerts([first])  # its deadline cannot be written: kept in memory, not raised
        clock.now += 61
        disk.wait_refused("remediations.claim")
        assert actuator.seen == []  # no claim on disk, no drain
        disk.free()
        clock.now += 2
        assert remediator.wait_done(1, WAIT_S)
        second = migrate_alert(store, "b")  # new alerts after space came back are drained too
        remediator.on_alerts([second])
        clock.now += 61
        assert remediator.wait_done(2, WAIT_S)
        assert _worker_alive()
    finally:
        remediator.stop()
    assert [r.alert_id for r in actuator.seen] == [first.id, second.id]
    assert store.remediations.of(first.id) == ("ok", "drained a")
    assert store.remediations.of(second.id) == ("ok", "drained b")
    assert len(disk.refused) >= 2  # the deadline and the claim at least
    assert _restarts(metrics) == 0  # store failures are handled where they happen


@pytest.mark.parametrize(
    "write",
    [
        "remediations.claim",  # the claim: nothing is done until it is on disk
        "settings.save",  # the breaker's admission: nothing is done until it is on disk
        "remediations.begin_attempt",  # the attempt count: nothing is done until it is on disk
        "remediations.finish",  # the outcome, after the drain: written later, the drain not repeated
    ],
)
def test_a_refused_write_is_retried_and_the_node_drained_once(
    store: StateStore, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    clock, metrics = Clock(), ServiceMetrics()
    disk = _Disk(store, monkeypatch)
    actuator = _Recording()
    remediator = Remediator(store, actuator, metrics, clock=clock)
    alert = migrate_alert(store, "a")
    disk.fill(write)  # before the acknowledgement, which claims and admits at once when it can
    remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 3, "s3://ckpt/3"))
    for _ in range(5):  # the disk stays full for a while
        remediator.run_once()
        clock.now += 1.0
    assert len(actuator.seen) == (1 if write == "remediations.finish" else 0)
    assert len(disk.refused) >= 2  # refused, and refused again when retried
    assert remediator.done == []
    disk.free()
    clock.now += 1.0
    remediator.run_once()
    assert [r.checkpoint_uri for r in actuator.seen] == ["s3://ckpt/3"]  # the acknowledged request, once
    [(remediation, outcome, detail)] = remediator.done
    assert (remediation.alert_id, outcome, detail) == (alert.id, "ok", "drained a")  # attempt 1, not 2
    assert store.remediations.of(alert.id) == ("ok", "drained a")
    clock.now += 3600.0
    assert remediator.run_once() == 0


def test_a_failed_attempt_whose_detail_cannot_be_written_is_still_retried(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, metrics = Clock(), ServiceMetrics()
    disk = _Disk(store, monkeypatch)
    actuator = _Recording(failures=1)
    policy = RetryPolicy(initial_s=5.0, multiplier=2.0, max_s=60.0, max_attempts=3, jitter=0.0)
    remediator = Remediator(store, actuator, metrics, clock=clock, retry=policy)
    alert = migrate_alert(store, "a")
    remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 3, ""))
    disk.fill("remediations.note_failed_attempt")
    remediator.run_once()
    assert disk.refused == ["remediations.note_failed_attempt"]
    disk.free()
    clock.now += 5.0
    remediator.run_once()
    assert len(actuator.seen) == 2
    assert store.remediations.of(alert.id) == ("ok", "drained a (on attempt 2)")


def test_a_disk_that_fills_during_the_drain_keeps_the_outcome_and_drains_once(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, metrics = Clock(), ServiceMetrics()
    disk = _Disk(store, monkeypatch)
    actuator = _Recording(on_call=disk.fill)  # the disk fills while the scheduler drains the node
    remediator = Remediator(store, actuator, metrics, clock=clock)
    remediator.start()
    try:
        alert = migrate_alert(store, "a")
        remediator.on_ack(Ack(alert.id, "j1", apb.ACK_ACTION_SNAPSHOT_DONE, 3, ""))
        disk.wait_refused("remediations.finish")
        assert store.remediations.of(alert.id) == ("pending", "")
        actuator.on_call = None
        disk.free()
        # The worker parks the outcome for a retry a second later by the test's clock, after the
        # refusal was seen: move the clock on until it has written it.
        for _ in range(int(WAIT_S / 0.1)):
            clock.now += 2.0
            if remediator.wait_done(1, 0.1):
                break
        assert remediator.wait_done(1, 0)
    finally:
        remediator.stop()
    assert len(actuator.seen) == 1
    assert store.remediations.of(alert.id) == ("ok", "drained a")


def test_an_unexpected_error_in_the_worker_is_counted_and_the_drain_still_happens(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, metrics, actuator = Clock(), ServiceMetrics(), _Recording()
    remediator = Remediator(store, actuator, metrics, grace_s=60.0, clock=clock)
    acks, raised = store.acks.of, threading.Event()

    def broken_once(alert_id: int) -> list[Ack]:
        if not raised.is_set():
            raised.set()
            raise RuntimeError("a bug")
        return acks(alert_id)

    monkeypatch.setattr(store.acks, "of", broken_once)  # read when the grace timer fires
    remediator.start()
    try:
        alert = migrate_alert(store, "a")
        remediator.on_alerts([alert])
        clock.now += 61
        assert remediator.wait_done(1, WAIT_S)
    finally:
        remediator.stop()
    assert raised.is_set()
    assert [r.alert_id for r in actuator.seen] == [alert.id]
    assert _restarts(metrics) == 1
