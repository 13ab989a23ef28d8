"""Integers from the wire are range-checked at the edge; no failed write poisons the shared database.
The probe: a collector pushing only for its own node sends a sequence >= 2^63;
the cursor write died on OverflowError inside BEGIN IMMEDIATE, and from then on no node got an alert,
RegisterJob answered OK without committing and cursors were never saved."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.server import Service
from faultcast.service.state.store import StateStore
from faultcast.sim.live import TwinSource
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2 as tpb
from tests.attacks.victim import FLEET, NAME, STEPS_BEFORE, assert_victim_alerted, serving

ATTACKER = FLEET.node_name(0)


def _attack(channel: grpc.Channel, sequences: list[int], spool_id: int = 7) -> list[tpb.PushAck]:
    """The attacker's samples: real twin readings of its own node, numbered as it likes."""
    source = TwinSource(FLEET, 0, [])
    snapshots = [
        replace(s, sequence=q)
        for s, q in zip(twin_snapshots(source, ATTACKER, len(sequences)), sequences, strict=False)
    ]
    return push(channel, ATTACKER, snapshots, spool_id=spool_id)


@pytest.fixture
def served(service_model: Path, tmp_path: Path) -> Iterator[tuple[Service, grpc.Channel, Path]]:
    with serving(service_model, tmp_path / "state", tmp_path) as (service, channel):
        yield service, channel, tmp_path / "state"


def test_a_sequence_beyond_2_63_is_refused_and_every_node_still_gets_its_alert(
    served: tuple[Service, grpc.Channel, Path],
) -> None:
    service, channel, state = served
    acks = _attack(channel, [2**63, 2**64 - 1])
    assert [len(a.rejections) for a in acks] == [1, 1]
    assert all("2^63" in a.rejections[0].reason for a in acks)
    assert acks[-1].acked_through == 0  # nothing taken: the next real sample is not a "duplicate"
    later = _attack(channel, [5])
    assert later[-1].acked_through == 5
    assert not later[-1].rejections
    alert = assert_victim_alerted(channel)  # the victim node still gets its alert
    stub = apb_grpc.AlertsStub(channel)
    stub.RegisterJob(apb.RegisterJobRequest(job_id="job-w", nodes=[ATTACKER]))
    service.stop(0)
    # What the service said it kept is on disk: read by a fresh store.
    reopened = StateStore.in_dir(state)
    assert set(reopened.jobs.all()) == {"job-v", "job-w"}
    assert reopened.alerts.get(alert.id) is not None
    cursors = reopened.cursors.load()
    assert cursors[(NAME, 1)] == STEPS_BEFORE
    assert cursors[(ATTACKER, 7)] == 5
    reopened.close()


def test_a_failed_write_leaves_no_transaction_open(tmp_path: Path) -> None:
    """Whatever a write fails on, the next one works: the failure cannot poison the connection."""
    store = StateStore.in_dir(tmp_path)
    with pytest.raises(ValueError, match="beyond"):
        store.cursors.save({("node-a", 1): 2**63})
    store.cursors.save({("node-a", 1): 3})
    poisoned = apb.Alert(node="node-a", gpu=0, state=apb.ALERT_STATE_OPEN, opened_id=2**64 - 1)
    with pytest.raises(OverflowError):
        store.alerts.append([apb.Alert(node="node-a", gpu=0, state=apb.ALERT_STATE_OPEN), poisoned])
    (stored,) = store.alerts.append([apb.Alert(node="node-a", gpu=1, state=apb.ALERT_STATE_OPEN)])
    store.jobs.register("job-a", ["node-a"])
    store.close()
    reopened = StateStore.in_dir(tmp_path)
    assert reopened.cursors.load() == {("node-a", 1): 3}
    assert [a.id for a in reopened.alerts.read_after(0)] == [stored.id]  # the failed batch left nothing
    assert reopened.jobs.all() == {"job-a": ["node-a"]}
    reopened.close()


def test_a_collector_opening_streams_with_fresh_spool_ids_keeps_a_bounded_cursor_table(
    served: tuple[Service, grpc.Channel, Path],
) -> None:
    """The probe: one collector made 23,122 cursor rows in 30 s with fresh spool ids."""
    service, channel, state = served
    for spool in range(1, 41):
        _attack(channel, [1], spool_id=spool)
    kept = {key for key in service.telemetry.cursors() if key[0] == ATTACKER}
    assert kept == {(ATTACKER, spool) for spool in range(33, 41)}  # the 8 most recent
    assert service.telemetry.spools_forgotten == 32
    service.stop(0)
    reopened = StateStore.in_dir(state)
    assert {key for key in reopened.cursors.load() if key[0] == ATTACKER} == kept
    reopened.close()
