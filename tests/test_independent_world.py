"""The independent twin (faultcast.sim.independent): its files open with the model's own reader, match
the schemas, are deterministic per seed, and carry failures, precursors and look-alikes as specified."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from faultcast.catalogue import Kind, Scope, metrics_for
from faultcast.model.features.offline import open_dataset
from faultcast.modes import FailureMode
from faultcast.schemas import FAILURE_FIELDS, NETWORK_SCHEMA, TELEMETRY_SCHEMA
from faultcast.sim.independent import IndependentConfig, draw_world, generate
from faultcast.sim.independent.events import build

FILES = ("telemetry.parquet", "network.parquet", "failures.csv", "manifest.json")
SMALL = IndependentConfig(nodes=6, gpus_per_node=8, days=2.0, seed=11, acceleration=60.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("independent") / "run"
    generate(out, SMALL)
    return out


def _digest(path: Path) -> dict[str, str]:
    return {name: hashlib.sha256((path / name).read_bytes()).hexdigest() for name in FILES}


def _failures(path: Path) -> list[dict[str, str]]:
    with (path / "failures.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_model_reader_opens_it(run: Path) -> None:
    dataset = open_dataset(run)
    assert dataset.nodes == tuple(f"node-{i:04d}" for i in range(SMALL.nodes))
    assert dataset.gpus_per_node == SMALL.gpus_per_node
    assert dataset.cadence_s == SMALL.cadence_s
    assert len(dataset.failures) == len(_failures(run))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["kind"] == "faultcast independent twin"
    assert manifest["world"]["family"] == "independent"
    assert manifest["world"]["id"] == draw_world(SMALL.seed).id
    assert sum(manifest["failure_counts"].values()) == len(dataset.failures)


def test_files_follow_the_schemas(run: Path) -> None:
    assert pq.read_schema(run / "telemetry.parquet").remove_metadata().equals(TELEMETRY_SCHEMA)
    assert pq.read_schema(run / "network.parquet").remove_metadata().equals(NETWORK_SCHEMA)
    with (run / "failures.csv").open(newline="") as handle:
        assert tuple(next(csv.reader(handle))) == FAILURE_FIELDS
    modes = {m.value for m in FailureMode}
    for row in _failures(run):
        assert row["mode"] in modes
        assert row["timestamp"].endswith("Z")
        node_level = FailureMode(row["mode"]).level.value == "node"
        assert (row["gpu"] == "") == node_level
    telemetry = pd.read_parquet(run / "telemetry.parquet", columns=["timestamp", "node", "gpu", "uuid"])
    assert telemetry["timestamp"].is_monotonic_increasing
    assert telemetry["uuid"].astype(str).str.match(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-").all()
    assert not telemetry.duplicated(["timestamp", "node", "gpu"]).any()


def test_same_seed_same_files_other_seed_other_files(run: Path, tmp_path: Path) -> None:
    generate(tmp_path / "again", SMALL)
    assert _digest(tmp_path / "again") == _digest(run)
    other = IndependentConfig(nodes=SMALL.nodes, days=SMALL.days, seed=SMALL.seed + 1, acceleration=60.0)
    generate(tmp_path / "other", other)
    assert _digest(tmp_path / "other")["telemetry.parquet"] != _digest(run)["telemetry.parquet"]
    assert draw_world(SMALL.seed).id != draw_world(SMALL.seed + 1).id


def test_failures_come_at_the_accelerated_rate() -> None:
    drawn = expected = 0.0
    for seed in range(12):
        config = IndependentConfig(nodes=16, days=10.0, seed=seed, acceleration=10.0)
        world = draw_world(seed)
        drawn += len(build(config, world).failures)
        expected += world["failure_rate_per_gpu_day"] * 10.0 * 16 * 8 * 10.0
    # about 4.7e-4 per GPU-day (Llama 3) before acceleration; a few fall on hardware already down
    assert 0.8 * expected < drawn < 1.15 * expected


def test_counters_never_decrease_except_at_a_reset(run: Path) -> None:
    counters = [m.name for m in metrics_for(Scope.GPU) if m.kind is Kind.COUNTER]
    frame = pd.read_parquet(run / "telemetry.parquet", columns=["node", "gpu", "uuid", *counters])
    frame["node"] = frame["node"].astype(str)
    frame["uuid"] = frame["uuid"].astype(str)
    resets = 0
    for _, gpu in frame.groupby(["node", "gpu"], sort=False):
        energy = gpu["total_energy"].ffill().to_numpy()
        uuid = gpu["uuid"].to_numpy()
        # a reset (driver reload, GPU reset, new card) restarts the energy counter too
        reset = np.r_[False, (np.diff(energy) < 0) | (uuid[1:] != uuid[:-1])]
        resets += int(reset.sum())
        for name in counters:
            values = gpu[name].ffill().to_numpy()
            step = np.r_[0.0, np.diff(values)]
            assert not ((step < 0) & ~reset).any(), name
    assert resets > 0  # the run has driver reloads or repairs


def test_healthy_gpus_show_look_alikes(run: Path) -> None:
    failed = {(r["node"], r["gpu"]) for r in _failures(run)}
    frame = pd.read_parquet(
        run / "telemetry.parquet",
        columns=["node", "gpu", "ecc_sbe_aggregate", "pcie_replay", "nvlink_crc_flit_errors", "xid_last"],
    )
    frame["node"] = frame["node"].astype(str)
    last = frame.groupby(["node", "gpu"]).max()
    healthy = last[[(n, str(g)) not in failed for n, g in last.index]]
    assert (healthy["ecc_sbe_aggregate"] > 0).any()  # SBE on cards that never fail
    assert (healthy["pcie_replay"] > 0).any()
    assert (healthy["xid_last"] > 0).any()  # application and benign Xids


def test_only_some_failures_have_a_precursor(run: Path) -> None:
    precursors = np.array([float(r["precursor_s"]) for r in _failures(run)])
    assert (precursors == 0).any()
    config = IndependentConfig(nodes=16, days=10.0, seed=5, acceleration=20.0)
    all_failures = build(config, draw_world(5)).failures
    share = np.mean([f.precursor_s > 0 for f in all_failures])
    assert 0.05 < share < 0.5  # a minority


def test_a_failed_gpu_goes_dark(run: Path) -> None:
    frame = pd.read_parquet(run / "telemetry.parquet", columns=["timestamp", "node", "gpu"])
    frame["node"] = frame["node"].astype(str)
    checked = 0
    for row in _failures(run):
        if row["gpu"] == "" or row["mode"] in ("software",):
            continue
        at = pd.Timestamp(row["timestamp"])
        rows = frame[(frame["node"] == row["node"]) & (frame["gpu"] == int(row["gpu"]))]
        after = rows[(rows["timestamp"] > at + pd.Timedelta(seconds=SMALL.cadence_s))]
        if after.empty:
            continue
        assert after["timestamp"].iloc[0] - at >= pd.Timedelta(minutes=5)
        checked += 1
    assert checked > 0
