"""The service's rolling archive: what it writes from the samples is what `faultcast simulate` wrote for
the same twin (row for row, value for value), a sample sent twice is kept once, a late part is merged
into its settled day, and the retention and the disk bound remove the oldest days."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.modes import FailureMode
from faultcast.readings import NodeSnapshot
from faultcast.schemas import SUMMARISED_TELEMETRY_SCHEMA
from faultcast.service.archive.rows import sort_rows
from faultcast.service.archive.writer import Archive, ArchiveSettings
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.service.state.labels import FailureLabel, LabelSource
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.writer import simulate

FLEET = FleetConfig(nodes=2, gpus_per_node=4, days=1.25, seed=11, acceleration=1.0)
SETTLE_NOW = -1e9  # every day is due at once


def _steps(fleet: FleetConfig, nodes: int) -> Iterator[NodeSnapshot]:
    """Every node's samples, step by step (nodes interleaved, as a fleet's arrive)."""
    feeds = [twin_snapshots(TwinSource(fleet, n), f"node-{n:04d}", 10**9) for n in range(nodes)]
    while True:
        batch = [next(feed, None) for feed in feeds]
        if any(s is None for s in batch):
            return
        yield from (s for s in batch if s is not None)


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(FLEET, out)
    return out


def _sorted(table: pa.Table) -> pa.Table:
    return sort_rows(table, ("node", "gpu"))


def test_the_archive_holds_what_the_twin_wrote(twin: Path, tmp_path: Path) -> None:
    archive = Archive(ArchiveSettings(tmp_path / "archive", FLEET.cadence_s, settle_s=SETTLE_NOW))
    for snapshot in _steps(FLEET, FLEET.nodes):
        archive.observe(snapshot)
    archive.close()
    archive.maintain()
    manifest = json.loads((tmp_path / "archive" / "manifest.json").read_text())
    assert manifest["days"] == ["2026-01-05", "2026-01-06"]
    assert manifest["nodes"] == ["node-0000", "node-0001"]
    assert manifest["config"]["gpus_per_node"] == FLEET.gpus_per_node
    assert not list((tmp_path / "archive" / "open").iterdir())
    written = _sorted(pq.read_table(tmp_path / "archive" / "telemetry.parquet"))
    expected = _sorted(pq.read_table(twin / "telemetry.parquet"))
    assert written.schema.equals(SUMMARISED_TELEMETRY_SCHEMA)
    assert written.num_rows == expected.num_rows > 0
    for name in expected.column_names:
        a, b = written.column(name), expected.column(name)
        if pa.types.is_floating(b.type):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), err_msg=name)
        else:
            assert a.cast(pa.string()).to_pylist() == b.cast(pa.string()).to_pylist(), name
    # Network rows: the node's devices rolled up as the twin rolls them up, for every step the twin
    # wrote one (a sample whose node row the twin left out still has the archive's).
    ours = pq.read_table(tmp_path / "archive" / "network.parquet").to_pandas()
    theirs = pq.read_table(twin / "network.parquet").to_pandas()
    for frame in (ours, theirs):
        frame["node"] = frame["node"].astype(str)
    joined = theirs.merge(ours, on=["timestamp", "node"], suffixes=("", "_archived"), validate="one_to_one")
    assert len(joined) == len(theirs) > 0
    for name in theirs.columns.drop(["timestamp", "node"]):
        np.testing.assert_array_equal(
            joined[name].to_numpy(), joined[f"{name}_archived"].to_numpy(), err_msg=name
        )


def test_a_sample_sent_twice_is_kept_once_and_a_late_part_joins_its_day(tmp_path: Path) -> None:
    fleet = replace(FLEET, days=0.1)
    samples = list(_steps(fleet, 1))
    archive = Archive(ArchiveSettings(tmp_path, fleet.cadence_s, settle_s=SETTLE_NOW))
    for s in samples[:60]:
        archive.observe(s)
    archive.close()
    archive.maintain()
    first = pq.read_table(tmp_path / "telemetry.parquet").num_rows
    assert first == 60 * fleet.gpus_per_node
    # A restart replays the journal (samples 40-59 again) and the node goes on; a lagging spool also
    # brings step 70 after 80 (late within its node: dropped and counted).
    again = Archive(ArchiveSettings(tmp_path, fleet.cadence_s, settle_s=SETTLE_NOW))
    for s in [*samples[40:70], samples[80], samples[75]]:
        again.observe(s)
    again.close()
    again.maintain()
    assert again.counts.late == 1
    table = pq.read_table(tmp_path / "telemetry.parquet")
    assert table.num_rows == 71 * fleet.gpus_per_node
    steps = table.column("timestamp").cast(pa.int64()).to_numpy() // int(fleet.cadence_s * 1e9)
    assert len(np.unique(steps)) == 71
    assert (np.diff(steps) >= 0).all()  # sorted by time


def test_retention_and_the_bound_remove_the_oldest_days(tmp_path: Path) -> None:
    fleet = replace(FLEET, days=4.0, nodes=1)
    samples = list(_steps(fleet, 1))
    archive = Archive(ArchiveSettings(tmp_path, fleet.cadence_s, keep_days=3, settle_s=SETTLE_NOW))
    for s in samples:
        archive.observe(s)
    archive.close()
    archive.maintain()
    days = sorted(p.stem for p in (tmp_path / "telemetry.parquet").iterdir())
    assert days == ["2026-01-06", "2026-01-07", "2026-01-08"]
    assert archive.counts.removed_days == 1
    one_day = (tmp_path / "telemetry.parquet" / "2026-01-08.parquet").stat().st_size
    tight = Archive(
        ArchiveSettings(tmp_path, fleet.cadence_s, max_bytes=int(2.5 * one_day), settle_s=SETTLE_NOW)
    )
    tight.maintain()
    assert sorted(p.stem for p in (tmp_path / "telemetry.parquet").iterdir()) == ["2026-01-08"]
    assert json.loads((tmp_path / "manifest.json").read_text())["days"] == ["2026-01-08"]
    # Unsettled parts alone over the bound: new rows are dropped and counted, nothing is written.
    full = Archive(ArchiveSettings(tmp_path / "small", fleet.cadence_s, max_bytes=1, settle_s=1e9))
    for s in samples[:30]:
        full.observe(s)
    full.close()
    full.observe(samples[40])
    full.close()
    assert full.counts.dropped == fleet.gpus_per_node
    assert full.counts.rows == 30 * fleet.gpus_per_node


def test_a_service_archives_what_it_took_with_its_label_log(stub_model: Path, tmp_path: Path) -> None:
    fleet = replace(FLEET, days=0.05, nodes=1)
    state = tmp_path / "state"
    twin_times = Limits(max_future_s=0, max_age_s=0)  # the twin's samples are from January 2026
    config = ServiceConfig(limits=twin_times, grace_s=3600.0, archive_settle_s=SETTLE_NOW)
    service = Service.open(stub_model, state, config, actuator=NoopActuator())
    port = service.start("127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            samples = list(twin_snapshots(TwinSource(fleet, 0), "node-a", 40))
            acks = push(channel, "node-a", samples)
        assert acks[-1].acked_through == 40
        service.score_now()
        service.store.labels.add(
            [
                FailureLabel(
                    "node-a", 2, FailureMode.HBM_WEAR, samples[30].time_unix_nano, LabelSource.KERNEL_LOG
                )
            ],
            "ops",
        )
    finally:
        service.stop(0)
    archive = state / "archive"
    assert list((archive / "open").rglob("telemetry-*.parquet"))  # written at the stop, not settled yet
    # The next start settles the day (due at once here) and writes the label log beside it.
    again = Service.open(stub_model, state, config, actuator=NoopActuator())
    try:
        assert again.archive is not None
        again.archive.maintain()
    finally:
        again.stop(0)
    table = pq.read_table(archive / "telemetry.parquet")
    assert table.num_rows == 40 * fleet.gpus_per_node
    assert set(table.column("node").cast(pa.string()).to_pylist()) == {"node-a"}
    failures = (archive / "failures.csv").read_text().splitlines()
    assert len(failures) == 2
    assert failures[1].split(",")[:5] == [
        _iso(samples[30].time_unix_nano),
        "node-a",
        "2",
        "",
        "hbm_wear",
    ]
    manifest = json.loads((archive / "manifest.json").read_text())
    assert manifest["nodes"] == ["node-a"]


def _iso(time_ns: int) -> str:
    moment = dt.datetime.fromtimestamp(time_ns // 10**9, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def test_a_damaged_part_loses_its_own_rows_only(tmp_path: Path) -> None:
    fleet = replace(FLEET, days=0.1, nodes=1)
    samples = list(_steps(fleet, 1))
    archive = Archive(ArchiveSettings(tmp_path, fleet.cadence_s, settle_s=SETTLE_NOW))
    for s in samples[:20]:
        archive.observe(s)
    archive.close()
    for s in samples[20:30]:
        archive.observe(s)
    archive.close()
    (first, *_) = sorted((tmp_path / "open").rglob("telemetry-*.parquet"))
    first.write_bytes(first.read_bytes()[:100])  # cut short (a crash mid-write on a disk without rename)
    archive.maintain()
    assert pq.read_table(tmp_path / "telemetry.parquet").num_rows == 10 * fleet.gpus_per_node
