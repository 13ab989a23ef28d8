"""A restart mid-incident gives the alert events no restart gives: `faultcast serve` is killed with
SIGKILL while a GPU's HBM wears out (its alert open, the precursor at full strength) and restarted on
the same state directory; a real collector spool and shipper carry the same samples through. The
restarted service takes back each node's saved scoring state and replays the journalled samples
after it, so its OPENED/UPDATED/CLEARED sequence is the uninterrupted run's, event for event.

Before the scoring state was kept, the restarted service began the node's windows and baselines
empty: the alert cleared as RISK_FELL ten scores later and never re-opened."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from faultcast import wire
from faultcast.collector.shipper import Backoff, Shipper
from faultcast.collector.spool import Spool
from faultcast.demo.feed import twin_snapshots
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb
from tests.serve_process import ServeProcess, serve_processes, spool_waits

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU = 2, 3
NAME = FLEET.node_name(NODE)
FAIL_S = 3 * 3600.0  # the GPU fails three hours into the twin's day
SAMPLES = int(FAIL_S / FLEET.cadence_s) + 15  # one a minute, through the failure and its going dark
WAIT_S = 60.0
# A few steps past the last periodic save, so that the restart must replay the journal too.
CHECKPOINT_STEPS = 7
Event = tuple[str, int, int, str, str, str, float]


def _events(state: Path) -> list[Event]:
    """The node's stored events in order: kind, which alert (by order of opening), GPU, event time,
    mode, action, clear reason and risk: everything but the ids, which each run draws afresh."""
    with closing(sqlite3.connect(f"file:{state / 'faultcast-service.sqlite'}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT payload FROM alerts WHERE node = ? ORDER BY id", (NAME,)).fetchall()
    opened: dict[int, int] = {}
    out = []
    for (payload,) in rows:
        alert = apb.Alert.FromString(payload)
        which = opened.setdefault(alert.opened_id, len(opened))
        out.append(
            (
                apb.EventKind.Name(alert.kind),
                which,
                alert.gpu,
                str(alert.time_unix_nano),
                apb.FailureMode.Name(alert.mode),
                apb.RecommendedAction.Name(alert.action) + "/" + apb.ClearReason.Name(alert.clear_reason),
                round(alert.risk, 12),
            )
        )
    return out


def _opened(state: Path) -> bool:
    return any(kind == "EVENT_KIND_OPENED" for kind, *_ in _events(state))


def _acked(spool: Spool, sequence: int) -> Callable[[], bool]:
    return lambda: spool.acked_through >= sequence


@pytest.fixture
def services() -> Iterator[list[ServeProcess]]:
    with serve_processes() as started:
        yield started


def _run(
    model: Path, directory: Path, services: list[ServeProcess], kill_after: Callable[[Path], bool] | None
) -> list[Event]:
    """Ship the node's samples to `faultcast serve`, SIGKILL it once `kill_after(state)` holds (and
    the samples shipped so far are acked) and start it again on the same state and port; returns the
    node's events once every sample is acked and the service stopped cleanly."""
    state = directory / "state"
    state.mkdir(parents=True)
    log = directory / "serve.log"
    flags = ("--checkpoint-every", str(CHECKPOINT_STEPS), "--silent-after", "1000")
    source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
    samples = list(twin_snapshots(source, NAME, SAMPLES))
    assert len(samples) == SAMPLES
    spool = Spool(directory / "spool.sqlite", reserve_bytes=0)
    service = ServeProcess(model, state, log, *flags)
    services.append(service)
    port = service.port
    shipper = Shipper(
        f"127.0.0.1:{port}", spool, NAME, window=16, backoff=Backoff(initial=0.05, maximum=0.2), seed=1
    )
    shipper.start()
    killed = kill_after is None
    try:
        for sample in samples:
            spool.append(wire.to_proto(sample))
            if not killed and kill_after is not None:
                spool_waits(spool, _acked(spool, spool.last_sequence), "the sample to be acked")
                if kill_after(state):
                    service.kill()  # mid-stream, between two saved states: the journal has the rest
                    service = ServeProcess(model, state, log, *flags, listen=f"127.0.0.1:{port}")
                    services.append(service)
                    killed = True
        last = spool.last_sequence
        spool_waits(spool, lambda: spool.acked_through == last, "every sample to be acked")
        # Every sample of the stream is through the scorer once the backlog is empty.
        service.until(lambda: service.metric("faultcast_scoring_backlog") == 0.0)
    finally:
        shipper.close(flush=0)
        spool.close()
    assert killed
    service.process.terminate()
    assert service.process.wait(timeout=WAIT_S) == 0
    return _events(state)


def test_a_restart_mid_incident_gives_the_events_of_no_restart(
    service_model: Path, tmp_path: Path, services: list[ServeProcess]
) -> None:
    steady = _run(service_model, tmp_path / "steady", services, None)
    opened = [e for e in steady if e[0] == "EVENT_KIND_OPENED"]
    assert len(opened) == 1, steady  # the HBM wear is one incident, ended by the GPU going dark
    assert steady[-1][0] == "EVENT_KIND_CLEARED", steady
    assert steady[-1][5].endswith("GPU_DARK"), steady

    # Killed a few samples after the alert opened: the precursor at full strength, the alert open.
    seen: list[int] = []

    def mid_incident(state: Path) -> bool:
        if _opened(state):
            seen.append(1)
        return len(seen) == 4

    restarted = _run(service_model, tmp_path / "restarted", services, mid_incident)
    assert restarted == steady
