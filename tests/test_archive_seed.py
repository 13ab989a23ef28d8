"""Seeding the archive from a data directory gives the files the archive writes when it observes the same
twin's samples: the same settled days, row for row, the same days.json and manifest; seeding day by day
gives what seeding at once does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultcast.service.archive.seed import seed_archive
from faultcast.service.archive.writer import Archive, ArchiveSettings, settled_days
from faultcast.sim.writer import simulate
from tests.test_archive import FLEET, SETTLE_NOW, _steps


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(FLEET, out)
    return out


@pytest.fixture(scope="module")
def observed(twin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive the service writes from the twin's samples."""
    where = tmp_path_factory.mktemp("observed")
    archive = Archive(ArchiveSettings(where, FLEET.cadence_s, settle_s=SETTLE_NOW))
    for snapshot in _steps(FLEET, FLEET.nodes):
        archive.observe(snapshot)
    archive.close()
    archive.maintain()
    return where


def _assert_same_rows(ours: pa.Table, theirs: pa.Table) -> None:
    assert ours.column_names == theirs.column_names
    assert ours.num_rows == theirs.num_rows > 0
    for name in theirs.column_names:
        a, b = ours.column(name), theirs.column(name)
        if pa.types.is_floating(b.type):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), err_msg=name)
        else:
            assert a.cast(pa.string()).to_pylist() == b.cast(pa.string()).to_pylist(), name


def test_seeding_writes_the_days_the_archive_settles(twin: Path, observed: Path, tmp_path: Path) -> None:
    days = seed_archive(twin, tmp_path, FLEET.cadence_s)
    assert days == sorted(settled_days(observed))
    for day in days:
        _assert_same_rows(
            pq.read_table(tmp_path / "telemetry.parquet" / f"{day}.parquet"),
            pq.read_table(observed / "telemetry.parquet" / f"{day}.parquet"),
        )
        # Node rows: the twin leaves out some the archive writes; every one it has is the archive's.
        ours = pq.read_table(tmp_path / "network.parquet" / f"{day}.parquet").to_pandas()
        theirs = pq.read_table(observed / "network.parquet" / f"{day}.parquet").to_pandas()
        for frame in (ours, theirs):
            frame["node"] = frame["node"].astype(str)
        joined = ours.merge(
            theirs, on=["timestamp", "node"], suffixes=("", "_observed"), validate="one_to_one"
        )
        assert len(joined) == len(ours) > 0
        for name in ours.columns.drop(["timestamp", "node"]):
            np.testing.assert_array_equal(joined[name].to_numpy(), joined[f"{name}_observed"].to_numpy())
    seeded, settled = settled_days(tmp_path), settled_days(observed)
    for day in days:
        assert (seeded[day].nodes, seeded[day].gpu_rows, seeded[day].gpus_per_node) == (
            settled[day].nodes,
            settled[day].gpu_rows,
            settled[day].gpus_per_node,
        )
    assert json.loads((tmp_path / "manifest.json").read_text()) == json.loads(
        (observed / "manifest.json").read_text()
    )
    assert (tmp_path / "failures.csv").exists()  # a data directory: `faultcast train --data` reads it


def test_seeding_day_by_day_gives_what_seeding_at_once_does(twin: Path, tmp_path: Path) -> None:
    at_once = tmp_path / "at-once"
    days = seed_archive(twin, at_once, FLEET.cadence_s)
    by_day = tmp_path / "by-day"
    for day in days:
        assert seed_archive(twin, by_day, FLEET.cadence_s, days={day}) == [day]
    seed_archive(twin, by_day, FLEET.cadence_s, days={days[0]})  # again: merged, nothing doubled
    for table in ("telemetry.parquet", "network.parquet"):
        for day in days:
            _assert_same_rows(
                pq.read_table(by_day / table / f"{day}.parquet"),
                pq.read_table(at_once / table / f"{day}.parquet"),
            )
    assert settled_days(by_day) == settled_days(at_once)
    assert (by_day / "manifest.json").read_text() == (at_once / "manifest.json").read_text()
