"""`faultcast retrain` on the fleet's own history: a service's archive (fed the twin's samples through
the archive writer) and its label log (the twin's failures, imported as a harvested log) become a window
that trains and a newest day that every choice is made on; the challenger is a model like any other."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import load
from faultcast.modes import FailureMode
from faultcast.service.archive.window import choose_window
from faultcast.service.archive.writer import Archive, ArchiveSettings
from faultcast.service.state.labels import FailureLabel, LabelSource
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.writer import simulate

FAULTCAST = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "faultcast")
FLEET = FleetConfig(nodes=6, gpus_per_node=4, days=3.0, seed=5, acceleration=400.0)


def test_a_window_needs_days_to_fit_on_and_to_hold_out() -> None:
    days = ["2026-01-05", "2026-01-06", "2026-01-07", "2026-01-09"]
    window = choose_window(days, window_days=4, holdout_days=2)
    assert (window.fit, window.holdout) == (["2026-01-06", "2026-01-07"], ["2026-01-09"])
    with pytest.raises(ValueError, match="holds no settled day"):
        choose_window([], 90, 14)
    with pytest.raises(ValueError, match="at least one to fit on"):
        choose_window(days[-1:], 90, 14)


@pytest.fixture(scope="module")
def fleet_state(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A state directory as a service leaves it: the archive of three days, the twin's failures labelled."""
    state = tmp_path_factory.mktemp("state")
    twin = tmp_path_factory.mktemp("twin")
    simulate(FLEET, twin)
    archive = Archive(ArchiveSettings(state / "archive", FLEET.cadence_s, settle_s=-1e9))
    feeds = [twin_snapshots(TwinSource(FLEET, n), f"node-{n:04d}", 10**9) for n in range(FLEET.nodes)]
    for samples in zip(*feeds, strict=False):
        for s in samples:
            archive.observe(s)
    archive.close()
    archive.maintain()
    store = StateStore.in_dir(state)
    with (twin / "failures.csv").open() as handle:
        labels = [
            FailureLabel(
                r["node"], int(r["gpu"]) if r["gpu"] else -1, FailureMode(r["mode"]),
                int(dt.datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp() * 1e9),
                LabelSource.KERNEL_LOG,
            )
            for r in csv.DictReader(handle)
        ]  # fmt: skip
    store.labels.add(labels, "ops")
    store.close()
    return state, twin


def test_retrain_trains_a_challenger_on_the_fleets_own_days(
    fleet_state: tuple[Path, Path], tmp_path: Path
) -> None:
    state, twin = fleet_state
    out = tmp_path / "challenger"
    done = subprocess.run(
        [FAULTCAST, "retrain", "--state-dir", str(state), "--out", str(out), "--holdout", "1d",
         "--negative-rate", "0.05", "--prior", str(twin), "--prior-weight", "0.5"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    model = load(out)
    data = json.loads((out / "manifest.json").read_text())["training_data"]["manifest"]
    assert [Path(p).name for p in data["datasets"]] == [twin.name, "fit", "holdout"]
    assert Path(data["validation"]).name == "holdout"  # the newest day made every choice
    # The prior world's GPU-days, and those of the rows the archive holds (a GPU in repair sends none).
    gpu_days = FLEET.nodes * FLEET.gpus_per_node * FLEET.days
    assert 1.5 * gpu_days < data["gpu_days"] <= 2 * gpu_days
    assert 0 < model.threshold < 1
    assert model.card.train_config is not None
    assert model.card.train_config["world_weights"] == "0.5,1,1"  # the prior weighed against the fleet
    # The window's views link the archive's files and carry the label log.
    fit = out.with_name(out.name + ".window") / "fit"
    assert sorted(p.name for p in (fit / "telemetry.parquet").iterdir()) == [
        "2026-01-05.parquet",
        "2026-01-06.parquet",
    ]
    assert (fit / "telemetry.parquet" / "2026-01-05.parquet").is_symlink()
    assert len((fit / "failures.csv").read_text().splitlines()) > 1


def test_retrain_says_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [FAULTCAST, "retrain", "--state-dir", str(tmp_path), "--out", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no state database" in done.stderr
