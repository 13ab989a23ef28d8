"""Choices by groups of worlds: early stopping by cross-validation over groups of the
training worlds, calibration and thresholds pooled over several validation worlds, and the per-world
replay spread over local processes with the same rows as in one process."""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from faultcast.model.artifact import load, save
from faultcast.model.evaluation.evaluate import MODE_FLOOR, WARMUP_S, score_period
from faultcast.model.evaluation.outcomes import choose_threshold, choose_threshold_pooled
from faultcast.model.evaluation.world_pass import map_worlds
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.offline import open_dataset
from faultcast.model.risk_range import risk_range
from faultcast.model.training.recall_curve import read_curve
from faultcast.model.training.train import (
    TrainConfig,
    _world_rows,
    mode_balance,
    train,
    world_folds,
)
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.sim.config import FleetConfig
from faultcast.sim.world import World
from faultcast.sim.writer import simulate

# Four small worlds at 1000x: two train (one a fold), two validate, pooled.
WORLDS = (3, 4, 5, 6)
CONFIG = TrainConfig(num_boost_round=40, negative_rate=0.05, validation_worlds=2, folds=2)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = []
    for seed in WORLDS:
        path = tmp_path_factory.mktemp(f"world{seed}")
        simulate(FleetConfig(nodes=6, days=1.0, seed=seed, acceleration=1000.0, world=World.draw(seed)), path)
        out.append(path)
    return out


@pytest.fixture(scope="module")
def grouped(worlds: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model")
    train([open_dataset(p) for p in worlds], out, CONFIG)
    return out


def test_folds_keep_each_world_whole_and_deal_worlds_round_robin() -> None:
    worlds = np.array([7, 7, 2, 2, 2, 9, 4, 4, 7])
    folds = world_folds(worlds, 2)
    for w in set(worlds.tolist()):
        assert len(set(folds[worlds == w].tolist())) == 1  # a world is never split between folds
    # In the order they first appear: 7, 2, 9, 4 -> folds 0, 1, 0, 1.
    assert [int(folds[worlds == w][0]) for w in (7, 2, 9, 4)] == [0, 1, 0, 1]


def test_cross_validated_early_stopping_and_pooled_validation(worlds: list[Path], grouped: Path) -> None:
    model = load(grouped)
    metrics = model.card.metrics
    assert metrics is not None
    # One best iteration per fold, and the booster refit on every training world for their mean.
    assert len(metrics.fold_best_iterations) == 2
    assert all(1 <= b <= CONFIG.num_boost_round for b in metrics.fold_best_iterations)
    assert metrics.best_iteration == round(float(np.mean(metrics.fold_best_iterations)))
    booster = lgb.Booster(model_str=model.booster.model_to_string())
    assert booster.num_trees() == metrics.best_iteration
    # The validation pooled the last two worlds, both named.
    assert metrics.validation_worlds == 2
    curve = read_curve(grouped)
    assert curve is not None
    assert all(str(p) in str(curve.basis["measured_on"]) for p in worlds[2:])


def test_pooled_thresholds_judge_every_validation_world(worlds: list[Path], grouped: Path) -> None:
    """The threshold is the one whose false alarms summed over both validation worlds fit the budget of
    their GPU-days summed, reproduced here from both worlds scored afresh."""
    model = load(grouped)
    parts = [open_dataset(p) for p in worlds[2:]]
    judged = [
        (score_period(d, model, range(len(d.nodes)), d.start_s + WARMUP_S, d.end_s), d.failures)
        for d in parts
    ]
    periods = model.card.metrics.prediction_periods  # type: ignore[union-attr]
    assert periods is not None
    args = ("model", model.policy, NODE_LEVEL_MODES, CONFIG.false_alarm_budget, periods)
    assert model.card.metrics.validation_gpu_days == pytest.approx(sum(p.gpu_days for p, _ in judged))  # type: ignore[union-attr]
    pooled, _ = choose_threshold_pooled(judged, *args, floor=MODE_FLOOR)
    assert pooled == pytest.approx(model.card.threshold)
    # One part pooled is the single-period choice.
    period, failures = judged[0]
    assert choose_threshold_pooled([judged[0]], *args) == choose_threshold(period, failures, *args)


def test_worlds_replayed_in_other_processes_give_the_same_rows(worlds: list[Path]) -> None:
    datasets = [open_dataset(p) for p in worlds[:2]]
    features = FeatureConfig(cadence_s=datasets[0].cadence_s)
    calls = [(d, features, CONFIG, 10 + k) for k, d in enumerate(datasets)]
    here = map_worlds(_world_rows, calls)
    spread = map_worlds(_world_rows, calls, jobs=2)
    for (a, names_a), (b, names_b) in zip(here, spread, strict=True):
        assert names_a == names_b
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert here[0][0]["label"].any()  # rows with failures, not two empty results


def test_the_served_risk_is_the_learner_that_caught_more_on_validation(grouped: Path) -> None:
    model = load(grouped)
    metrics = model.card.metrics
    assert metrics is not None
    assert metrics.served in ("booster", "blend")
    assert metrics.validation_recall_booster is not None
    assert metrics.validation_recall_blend is not None
    served = metrics.validation_recall_5min_predictable
    assert served is not None
    if metrics.served == "blend":  # chosen only where it caught strictly more, and that is what serves
        assert metrics.validation_recall_blend > metrics.validation_recall_booster
        assert served.model == pytest.approx(metrics.validation_recall_blend)
        assert model.blend != 0.0
    else:
        assert metrics.validation_recall_blend <= metrics.validation_recall_booster
        assert served.model == pytest.approx(metrics.validation_recall_booster)
        assert model.blend == 0.0


def test_a_blend_saves_loads_and_bounds_its_risks(grouped: Path, tmp_path: Path) -> None:
    """The blend's risk adds the logistic log-odds at its weight; it survives save and load, and the
    lowest risk the model can give (the threshold floor) bounds it on extreme inputs."""
    model = load(grouped)
    model.blend, model.calibration = 0.8, (0.9, -3.0)
    rng = np.random.default_rng(1)
    x = rng.normal(0, 50, (400, len(model.feature_names)))
    x[rng.random(x.shape) < 0.2] = np.nan
    a, b = model.calibration
    raw = np.clip(model.raw(x), 1e-9, 1 - 1e-9)
    expected = 1 / (1 + np.exp(-(a * np.log(raw / (1 - raw)) + b + 0.8 * model.logistic.logit(x))))
    np.testing.assert_allclose(model.risk(x), expected)
    saved = tmp_path / "blend"
    model.threshold = float(np.quantile(expected, 0.99))
    save(model, saved)
    back = load(saved)
    assert back.blend == 0.8
    np.testing.assert_allclose(back.risk(x), model.risk(x))
    low, high = risk_range(back.booster, back.calibration, back.logistic.logit_range(), back.blend)
    risks = back.risk(x)
    assert low <= risks.min()
    assert risks.max() <= high
    # Without the logistic part in the bound, the blend's risks would escape it.
    plain_low, plain_high = risk_range(back.booster, back.calibration)
    assert risks.min() < plain_low or risks.max() > plain_high


def test_mode_balance_gives_each_mode_the_average_modes_weight() -> None:
    modes = np.array(["hbm"] * 30 + ["nvlink"] * 3 + ["pcie"] * 6 + [""] * 50, dtype=object)
    positive = modes != ""
    factor = mode_balance(modes, positive)
    totals = {m: float(factor[positive & (modes == m)].sum()) for m in ("hbm", "nvlink", "pcie")}
    assert totals["hbm"] == pytest.approx(13.0)  # the mean count: 39 positives over three modes
    assert totals["nvlink"] == pytest.approx(13.0)  # 3 rows, 13/3 each: under the cap
    assert totals["pcie"] == pytest.approx(13.0)
    assert np.all(factor[~positive] == 1.0)  # negatives untouched
    capped = mode_balance(modes, positive, cap=2.0)
    assert capped[modes == "nvlink"].max() == 2.0
    single = mode_balance(np.array(["hbm", "hbm", ""], dtype=object), np.array([True, True, False]))
    assert np.all(single == 1.0)  # one mode: nothing to balance
