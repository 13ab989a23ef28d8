"""`faultcast retrain` on the fleet's own history: a service's archive (fed the twin's samples through
the archive writer) and its label log (the twin's failures, imported as a harvested log) become a window
that trains and a newest day that every choice is made on; the challenger is a model like any other."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from faultcast.cli.retrain import SERVING, _warm_start
from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import load
from faultcast.model.shipped import shipped_model_dir
from faultcast.modes import FailureMode
from faultcast.service.archive.window import choose_window
from faultcast.service.archive.writer import Archive, ArchiveSettings
from faultcast.service.config import ServiceConfig
from faultcast.service.model_registry import of_store
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.retrain_schedule import Retrainer, RetrainSchedule, run_child
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
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


@pytest.fixture(scope="module")
def challenger(fleet_state: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`faultcast retrain` on the fleet's state, the twin world as a prior: the challenger's directory."""
    state, twin = fleet_state
    out = tmp_path_factory.mktemp("retrained") / "challenger"
    done = subprocess.run(
        [FAULTCAST, "retrain", "--state-dir", str(state), "--out", str(out), "--holdout", "1d",
         "--negative-rate", "0.05", "--prior", str(twin), "--prior-weight", "0.5"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_retrain_trains_a_challenger_on_the_fleets_own_days(
    fleet_state: tuple[Path, Path], challenger: Path
) -> None:
    _, twin = fleet_state
    out = challenger
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


def test_retrain_warm_starts_from_a_model(
    fleet_state: tuple[Path, Path], challenger: Path, tmp_path: Path
) -> None:
    """--warm-start MODEL boosts on from that model's trees (here the module's challenger: small, so the
    run is quick; the shipped model's 318 trees would score every row first)."""
    state, _ = fleet_state
    out = tmp_path / "warm"
    done = subprocess.run(
        [FAULTCAST, "retrain", "--state-dir", str(state), "--out", str(out), "--holdout", "1d",
         "--negative-rate", "0.05", "--warm-start", str(challenger)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    model, prior = load(out), load(challenger)
    assert model.card.train_config is not None
    assert model.card.train_config["warm_start"] == str(challenger.resolve())
    assert "world_weights" not in model.card.train_config  # no twin rows beside it
    assert model.booster.current_iteration() > prior.booster.current_iteration()  # boosted on
    # The label log says no failure's precursor (a real fleet's never does): the validation recall
    # counts the failures whose mode can warn rather than none.
    recall = model.card.metrics.validation_recall_5min_predictable if model.card.metrics else None
    assert recall is not None
    assert recall.failures > 0
    assert 0.0 <= recall.model <= 1.0


def test_warm_start_without_a_model_is_the_serving_one(tmp_path: Path, challenger: Path) -> None:
    """`--warm-start` alone: the registry's serving model, or the shipped one when none is registered."""
    store = StateStore.in_dir(tmp_path / "state")
    try:
        assert _warm_start(None, store) is None
        assert _warm_start(str(challenger), store) == challenger
        assert _warm_start(SERVING, store) == shipped_model_dir()
        registry = of_store(store)
        added, _ = registry.add(challenger, "ops", "a challenger")
        registry.promote(added.id, "ops", "it serves now", lambda path: (True, "", ""), shipped_model_dir())
        assert _warm_start(SERVING, store) == registry.path_of(added.id)
    finally:
        store.close()


def test_retrain_says_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [FAULTCAST, "retrain", "--state-dir", str(tmp_path), "--out", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no state database" in done.stderr


def test_a_scheduled_retrain_shadows_its_challenger(fleet_state: tuple[Path, Path], challenger: Path) -> None:
    state, _ = fleet_state
    config = ServiceConfig(
        limits=Limits(max_future_s=0, max_age_s=0),
        retrain_every_s=7 * 86400.0,
        retrain_flags=("--holdout", "1d", "--negative-rate", "0.05"),
    )
    service = Service.open(challenger, state, config, actuator=NoopActuator())
    service.start("127.0.0.1:0")
    try:
        deadline = time.monotonic() + 240
        while service.shadow is None:  # the schedule's thread retrains in a child process, then shadows
            assert time.monotonic() < deadline, "no challenger shadowed"
            time.sleep(0.2)
        _, events = service.list_models()
        shadowed = [e for e in events if e.model_id == service.shadow.model_id]
        assert [e.by for e in shadowed] == ["service", "service"]  # added, then shadowed
        assert all("scheduled retrain" in e.why for e in shadowed)
        assert service.model_dir == challenger  # never promoted by the schedule
    finally:
        service.stop(0)
    # Due again a week after this attempt, not at the next start.
    store = StateStore.in_dir(state)
    try:
        schedule = Retrainer(RetrainSchedule(7 * 86400.0), state, store.settings, lambda _: None)
        assert 7 * 86400.0 - 600 < schedule.due_in_s() <= 7 * 86400.0
    finally:
        store.close()


def test_a_failed_scheduled_retrain_is_said_and_tried_again_later(tmp_path: Path) -> None:
    store = StateStore.in_dir(tmp_path)  # a state without an archive: nothing to retrain on yet
    taken: list[Path] = []
    try:
        schedule = Retrainer(RetrainSchedule(3600.0), tmp_path, store.settings, taken.append)
        assert schedule.due_in_s() == 0
        assert schedule.once(threading.Event()) is None
        assert taken == []
        assert schedule.due_in_s() > 3500
        log = next((tmp_path / "retrained").glob("*.log")).read_text()
        assert "holds no archive" in log
    finally:
        store.close()


def test_a_scheduled_warm_start_continues_the_model_serving_when_it_starts(tmp_path: Path) -> None:
    """--retrain-warm-start: each retrain names the model serving at that moment (after a promotion, the
    promoted one), not the one the service started with."""
    store = StateStore.in_dir(tmp_path)
    serving = [tmp_path / "started-with"]
    argvs: list[list[str]] = []

    def recorded(argv: Sequence[str], output: Path, stopping: threading.Event) -> tuple[int, str]:
        argvs.append(list(argv))
        return run_child(argv, output, stopping)

    try:
        schedule = RetrainSchedule(3600.0, ("--holdout", "1d"), warm_start=True)
        retrainer = Retrainer(
            schedule, tmp_path, store.settings, lambda _: None, run=recorded, serving_dir=lambda: serving[-1]
        )
        assert retrainer.once(threading.Event()) is None  # no archive yet: the child says so and fails
        serving.append(tmp_path / "registry" / "promoted")
        assert retrainer.once(threading.Event()) is None
    finally:
        store.close()
    assert [a[a.index("--warm-start") + 1] for a in argvs] == [str(p) for p in serving]
    assert all(a[5:7] == ["--holdout", "1d"] for a in argvs)
