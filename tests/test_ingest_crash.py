"""Fault injection: `faultcast serve` is killed with SIGKILL in the middle of ingest and restarted on
the same state directory and address. A real collector-side spool and shipper keep appending and
shipping throughout; after the restart the spool drains, and no sample is lost or taken twice."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from faultcast import wire
from faultcast.collector.shipper import Backoff, Shipper
from faultcast.collector.spool import Spool
from faultcast.demo.feed import twin_snapshots
from faultcast.service.state.sample_journal import SampleJournal
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from tests.serve_process import ServeProcess, serve_processes, spool_waits

FLEET = FleetConfig(nodes=4, days=1.0, seed=78, acceleration=1.0)
NODE = 1
NAME = FLEET.node_name(NODE)
WAIT_S = 60.0
# Samples appended: until the service has persisted an ingest cursor, in a burst the kill cuts
# short, while the service is frozen just before the kill (so some are surely in flight), during
# the outage, and while the restarted service drains the spool.
BEFORE, BURST, FROZEN, OUTAGE, DRAINING = 60, 100, 10, 50, 20
WINDOW = 32


def _cursor(state: Path, spool_id: int) -> int:
    """The ingest cursor the service persisted for this collector's spool (0 when none yet)."""
    with closing(sqlite3.connect(f"file:{state / 'faultcast-service.sqlite'}?mode=ro", uri=True)) as db:
        row = db.execute(
            "SELECT last_sequence FROM cursors WHERE node = ? AND spool_id = ?", (NAME, spool_id)
        ).fetchone()
    return int(row[0]) if row is not None else 0


@pytest.fixture
def services() -> Iterator[list[ServeProcess]]:
    with serve_processes() as started:
        yield started


def test_a_service_killed_during_ingest_loses_no_sample_and_takes_none_twice(
    service_model: Path, tmp_path: Path, services: list[ServeProcess]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    log = tmp_path / "serve.log"
    # Samples as the collector spools them: twin snapshots through the wire format; the spool numbers them.
    snapshots = iter(
        twin_snapshots(TwinSource(FLEET, NODE), NAME, BEFORE + BURST + FROZEN + OUTAGE + DRAINING)
    )
    spool = Spool(tmp_path / "spool.sqlite", reserve_bytes=0)

    def append(count: int) -> None:
        for snapshot in [next(snapshots) for _ in range(count)]:
            assert spool.append(wire.to_proto(snapshot)) == spool.last_sequence

    first = ServeProcess(service_model, state, log)  # on a port of its choosing, port 0
    services.append(first)
    # The restart binds this port again, so that the shipper's target stays valid: that is what a
    # restart on a fixed address is (a connection left in TIME_WAIT does not block it: gRPC binds
    # with SO_REUSEADDR; only another listener taking the port during the outage could).
    port = first.port
    shipper = Shipper(
        f"127.0.0.1:{port}", spool, NAME, window=WINDOW, backoff=Backoff(initial=0.05, maximum=0.2), seed=1
    )
    shipper.start()
    try:
        append(BEFORE)
        first.until(lambda: _cursor(state, spool.spool_id) > 0)  # the restart has a cursor to load
        append(BURST)
        spool_waits(
            spool,
            lambda: spool.acked_through >= BEFORE + BURST // 3,
            "the first service acks some of the burst",
        )
        # Freeze the service so that what follows cannot be acked, and let the shipper hand some of
        # it to the transport: those samples are in flight when the kill comes.
        first.process.send_signal(signal.SIGSTOP)
        append(FROZEN)
        first.until(lambda: shipper.stats.samples_sent > spool.acked_through)
        failures = shipper.stats.stream_failures
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        spool_waits(
            spool, lambda: shipper.stats.stream_failures > failures, "the shipper sees the stream break"
        )
        acked_at_kill = spool.acked_through
        persisted_at_kill = _cursor(state, spool.spool_id)
        journalled = max(
            (e.sequence for e in SampleJournal(state / "journal").entries() if e.spool_id == spool.spool_id),
            default=0,
        )
        assert 0 < acked_at_kill < spool.last_sequence
        assert 0 < persisted_at_kill <= spool.last_sequence

        append(OUTAGE)  # nobody to ship to: the spool grows
        assert spool.depth == spool.last_sequence - acked_at_kill
        assert spool.acked_through == acked_at_kill

        second = ServeProcess(service_model, state, log, listen=f"127.0.0.1:{port}")
        services.append(second)
        append(DRAINING)
        last = spool.last_sequence
        spool_waits(spool, lambda: spool.acked_through == last, "the spool drains into the second service")
    finally:
        shipper.close(flush=0)

    assert last == BEFORE + BURST + FROZEN + OUTAGE + DRAINING
    assert spool.depth == 0
    assert spool.dropped == 0
    assert spool.dropped_no_space == 0
    assert shipper.stats.rejected == 0
    taken = second.metric("faultcast_ingest_node_samples_total") or 0.0
    duplicates = second.metric("faultcast_ingest_duplicates_total") or 0.0
    # The shipper resends everything after acked_at_kill. The restarted service refuses as duplicates
    # exactly the samples its predecessor took: those in its journal (written before each ack, so
    # at least every acked one, and at least what its cursor, saved every second, says), and takes
    # the rest once each.
    assert journalled >= max(acked_at_kill, persisted_at_kill)
    assert taken + duplicates == last - acked_at_kill
    assert duplicates == journalled - acked_at_kill
    assert taken == last - journalled
    # Every reject reason is exported from the start at 0; none may have moved.
    rejects = [
        line
        for line in second.exposition().splitlines()
        if line.startswith("faultcast_ingest_rejects_total{")
    ]
    assert rejects
    assert all(line.endswith(" 0.0") for line in rejects), rejects

    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=WAIT_S) == 0
    assert _cursor(state, spool.spool_id) == last
    spool.close()
