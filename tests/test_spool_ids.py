"""Spool ids are unsigned 64-bit numbers (proto/README.md: "a random 64-bit id"): an id from 2^63 up,
half of all random ids, is taken, its cursor stored and read back across a restart like any other.
SQLite holds signed integers: such ids are stored as their two's complement, and
cursors written before, all below 2^63, read as they were."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.state.store import StateStore
from faultcast.sim.live import TwinSource
from tests.attacks.victim import FLEET, serving

NODE = 0
NAME = FLEET.node_name(NODE)
SPOOL = 2**64 - 2**20 - 7  # at or above 2^63: a valid id, once refused at the hello
SENT = 6


def test_a_spool_id_above_2_63_is_taken_and_its_replay_after_a_restart_is_dropped(
    stub_model: Path, tmp_path: Path
) -> None:
    source = TwinSource(FLEET, NODE, [])
    sent = list(twin_snapshots(source, NAME, SENT))
    state = tmp_path / "state"
    with serving(stub_model, state, tmp_path / "first") as (service, channel):
        acks = push(channel, NAME, sent, spool_id=SPOOL)
        assert [list(a.rejections) for a in acks] == [[] for _ in sent]
        assert acks[-1].acked_through == len(sent)
        service.stop(0)  # a clean stop saves the cursors

    with serving(stub_model, state, tmp_path / "second") as (service, channel):
        assert service.telemetry.cursors()[(NAME, SPOOL)] == len(sent)
        after = list(twin_snapshots(source, NAME, 3, first_sequence=len(sent) + 1))
        replay = sent[-2:]  # what the collector resends when it saw no ack for it
        acks = push(channel, NAME, replay + after, spool_id=SPOOL)
        assert acks[-1].acked_through == len(sent) + len(after)
        assert not any(a.rejections for a in acks)
        assert service.telemetry.duplicates == len(replay)


def test_cursors_keep_every_64_bit_spool_id_and_read_old_rows_as_they_were(tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)
    cursors = {("node-a", 0): 1, ("node-a", 2**63 - 1): 2, ("node-a", 2**63): 3, ("node-b", 2**64 - 1): 4}
    store.cursors.save(cursors)
    store.close()
    database = tmp_path / "faultcast-service.sqlite"
    with closing(sqlite3.connect(database)) as db, db:
        # A row as the service wrote it before ids from 2^63 up were taken: the id as it is.
        db.execute(
            "INSERT INTO cursors (node, spool_id, last_sequence, seen_unix) VALUES ('node-c', 42, 9, 0)"
        )
        stored = dict(db.execute("SELECT spool_id, last_sequence FROM cursors WHERE node = 'node-a'"))
    assert stored == {0: 1, 2**63 - 1: 2, -(2**63): 3}  # signed 64-bit integers in the file
    reopened = StateStore.in_dir(tmp_path)
    assert reopened.cursors.load() == {**cursors, ("node-c", 42): 9}
    reopened.close()
