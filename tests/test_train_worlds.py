"""Training across worlds: the last world validates, risk is calibrated at the real failure
rate, error features are monotone, sampled rows are cached, and calibrate finds what training wrote."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from faultcast.model.artifact import load
from faultcast.model.evaluation.drift import load_reference
from faultcast.model.evaluation.evaluate import WARMUP_S, held_out_part
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.features.offline import open_dataset
from faultcast.model.training import rows_cache
from faultcast.model.training import train as train_module
from faultcast.model.training.recall_curve import read_curve
from faultcast.model.training.rows_cache import Rates
from faultcast.model.training.train import (
    TrainConfig,
    _calibrate,
    _Sampled,
    acceleration_of,
    excluded_columns,
    monotone_constraints,
    train,
)
from faultcast.sim.config import FleetConfig
from faultcast.sim.world import World
from faultcast.sim.writer import simulate

# Small worlds at 1000x: enough failures with a precursor after the warm-up to fit and validate on.
# Each training scores the last (validation) world at every step, twice (all inputs, and dcgm-exporter's
# default set), and this module trains twice: that world has one day (its first 6 h are warm-up).
WORLDS = (3, 4)
DAYS = {3: 2.0, 4: 1.0}
CONFIG = TrainConfig(num_boost_round=40, negative_rate=0.05)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = []
    for seed in WORLDS:
        path = tmp_path_factory.mktemp(f"world{seed}")
        fleet = FleetConfig(nodes=8, days=DAYS[seed], seed=seed, acceleration=1000.0, world=World.draw(seed))
        simulate(fleet, path)
        out.append(path)
    return out


@pytest.fixture(scope="module")
def across(worlds: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model")
    cache = tmp_path_factory.mktemp("rows")
    train([open_dataset(p) for p in worlds], out, replace(CONFIG, rows_cache=str(cache)))
    return out


def test_the_last_world_validates_and_the_card_names_every_world(worlds: list[Path], across: Path) -> None:
    model = load(across)
    card = model.card
    assert card.split is None  # nothing of a training world is held out: the evaluation is on others
    assert card.training_data is not None
    manifest = card.training_data.manifest
    assert manifest["kind"] == "worlds"
    assert manifest["validation"] == str(worlds[-1])
    ids = [w["id"] for w in manifest["worlds"]]  # type: ignore[attr-defined]
    assert ids == [json.loads((p / "manifest.json").read_text())["world"]["id"] for p in worlds]
    # A world it trained on is not held-out data: every node after the warm-up is scored.
    dataset = open_dataset(worlds[0])
    nodes, start, own = held_out_part(dataset, model)
    assert (nodes, start, own) == (list(range(len(dataset.nodes))), dataset.start_s + WARMUP_S, False)


def test_training_writes_the_drift_reference_and_the_validation_recall_curve(across: Path) -> None:
    model = load(across)
    reference = load_reference(across)
    assert reference is not None
    assert tuple(reference.names) == model.feature_names
    curve = read_curve(across)
    assert curve is not None
    assert curve.basis["leave_world_out"] is True
    assert list(curve.thresholds) == sorted(curve.thresholds)
    assert model.threshold in curve.thresholds
    recall = np.array(curve.recall)
    assert np.all((recall >= 0) & (recall <= 1))
    assert isinstance(curve.basis["failures_with_precursor"], int)
    assert curve.basis["failures_with_precursor"] > 0
    # Event recall need not fall as the threshold rises (a low one opens alerts hours early, held
    # open past the prediction period), so the curve keeps what was measured at each threshold.
    assert curve.recall_at(model.threshold) == recall[list(curve.thresholds).index(model.threshold)]


def test_cached_rows_give_the_same_model(worlds: list[Path], across: Path, tmp_path: Path) -> None:
    """A second training on the same worlds and sampling reads the cache and writes the same booster."""
    cache = Path(json.loads((across / "manifest.json").read_text())["train_config"]["rows_cache"])
    assert len(list(cache.glob("*/*.npz"))) == len(WORLDS)
    again = tmp_path / "again"
    train([open_dataset(p) for p in worlds], again, replace(CONFIG, rows_cache=str(cache)))
    assert (again / "model.txt").read_text() == (across / "model.txt").read_text()
    assert len(list(cache.glob("*/*.npz"))) == len(WORLDS)


def test_fewer_negatives_are_thinned_from_the_cache_not_replayed(
    worlds: list[Path], across: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows cached at 5% of the negatives serve a training at 2%: the cached rows thinned, no replay."""
    cache = Path(json.loads((across / "manifest.json").read_text())["train_config"]["rows_cache"])
    dataset = open_dataset(worlds[0])
    key = train_module.world_rows_key(dataset, FeatureConfig(), CONFIG, 0)
    held = rows_cache.load(cache / key / Rates.of(0.05, 0.0).file_name())

    def no_replay(*_: object, **__: object) -> None:
        raise AssertionError("the cache should have served these rows")

    monkeypatch.setattr(train_module, "replay", no_replay)
    lower = replace(CONFIG, rows_cache=str(cache), negative_rate=0.02)
    rows, _ = train_module._world_rows(dataset, FeatureConfig(), lower, 0)
    expected = rows_cache.thin(held, Rates.of(0.05, 0.0), Rates.of(0.02, 0.0), 0)
    np.testing.assert_array_equal(rows["time_s"], expected["time_s"])
    assert rows["label"].sum() == held["label"].sum()  # every positive kept
    assert len(rows["label"]) < 0.6 * len(held["label"])  # negatives are nearly all of the rows
    np.testing.assert_allclose(rows["weight"][~rows["label"].astype(bool)], 1 / 0.02)
    assert len(list(cache.glob("*/*.npz"))) == len(WORLDS)  # nothing new written


def test_risk_is_the_probability_at_the_real_failure_rate() -> None:
    """Platt scaling with each positive counted 1/A times: the calibrated risks sum to the positives a
    fleet failing A times less often would have (the fit's own score equation), not to the twin's."""
    rng = np.random.default_rng(0)
    n = 20_000
    y = rng.random(n) < 0.05
    x = np.where(y, rng.normal(1.0, 1.0, n), rng.normal(-1.0, 1.0, n))[:, None].astype(np.float32)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_threads": 1}, lgb.Dataset(x, y), num_boost_round=20
    )
    w = np.ones(n)

    def risks(acceleration: float) -> np.ndarray:
        rows = _Sampled(
            x=x, y=y, w=w, ttf_s=np.zeros(n), mode=np.zeros(n), fit=np.zeros(n, dtype=bool),
            val=np.ones(n, dtype=bool), acceleration=np.full(n, acceleration), world=np.zeros(n, dtype=np.int64),
            boost=np.ones(n),
        )  # fmt: skip
        a, b = _calibrate(booster, rows)
        raw = np.clip(np.asarray(booster.predict(x)), 1e-9, 1 - 1e-9)
        return np.asarray(1 / (1 + np.exp(-(a * np.log(raw / (1 - raw)) + b))))

    twin, real = risks(1.0), risks(100.0)
    assert twin.sum() == pytest.approx(y.sum(), rel=0.02)
    # Weighted by 1 for negatives and 1/100 for positives, the score equation holds for the weights
    # (to the solver's tolerance, which the positives' tiny total weight makes a few percent).
    weights = np.where(y, 1 / 100, 1.0)
    assert (weights * real).sum() == pytest.approx((weights * y).sum(), rel=0.1)
    assert real.mean() < twin.mean() / 20
    assert np.all(np.argsort(real, kind="stable") == np.argsort(twin, kind="stable"))  # the ranking stays


def test_acceleration_comes_from_the_config_else_the_manifest(worlds: list[Path]) -> None:
    dataset = open_dataset(worlds[0])
    assert acceleration_of(dataset, TrainConfig()) == 1000.0
    assert acceleration_of(dataset, TrainConfig(acceleration=1.0)) == 1.0


def test_only_hardware_error_features_are_monotone_and_exclusions_match_patterns() -> None:
    names = FeatureEngine(FeatureConfig(), 1).names
    flags = dict(zip(names, monotone_constraints(names), strict=True))
    for held in (
        "sbe_rate_60m",
        "xid_memory_excess_15m",
        "pcie_replay_vs_node_60m",
        "node_ib_symbol_error_rate",
    ):
        assert flags[held] == 1, held
    for free in ("xid_app_rate", "nvml_failed_rate_5m", "gpu_temp_now", "sm_clock_z_own_15m", "power_limit"):
        assert flags[free] == 0, free
    excluded = excluded_columns(names, ["gpu_temp_*", "power_limit"])
    assert {names[i] for i in excluded} == {n for n in names if n.startswith("gpu_temp_")} | {"power_limit"}
