"""The warm start, the other prior of `faultcast retrain`: a model's risk booster boosted on with the
fleet's rows (LightGBM's init_model), its trees kept; a model of another feature schema is refused."""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.shipped import shipped_model_dir
from faultcast.model.training.train import TrainConfig, _continued, warm_start_booster

NAMES = [f"f{i}" for i in range(5)]
PARAMS = {"objective": "binary", "metric": "average_precision", "num_leaves": 7, "min_data_in_leaf": 20,
          "seed": 0, "num_threads": 1, "verbose": -1, "deterministic": True}  # fmt: skip


def _rows(seed: int, signal: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose label follows feature `signal` (a world's precursor), with noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(NAMES)))
    y = x[:, signal] + 0.5 * rng.normal(size=n) > 1.5
    return x, y


def test_a_warm_start_keeps_the_priors_trees_and_learns_the_fleets_rows() -> None:
    # The prior learnt a world where feature 0 warns; the fleet's failures follow feature 0 and 3.
    x, y = _rows(1, 0)
    prior = lgb.train(PARAMS, lgb.Dataset(x, y, feature_name=NAMES), num_boost_round=20)
    fleet_x, fleet_y = _rows(2, 0)
    fleet_y |= _rows(2, 3)[1]
    val_x, val_y = _rows(3, 0)
    val_y |= _rows(3, 3)[1]
    ones = np.ones(len(fleet_y))
    config = TrainConfig(num_boost_round=100)
    booster, best = _continued(prior, PARAMS, fleet_x, fleet_y, ones, val_x, val_y, ones, config)
    assert best > prior.current_iteration()
    # The prior's trees come first, unchanged.
    first = booster.predict(val_x, num_iteration=prior.current_iteration(), raw_score=True)
    assert np.allclose(first, prior.predict(val_x, raw_score=True))
    # The new trees learnt what the prior missed.
    before = average_precision_score(val_y, prior.predict(val_x))
    after = average_precision_score(val_y, booster.predict(val_x, num_iteration=best))
    assert after > before


def test_a_warm_start_reads_the_same_features_or_says_why_not() -> None:
    names = FeatureEngine(FeatureConfig(), 1).names  # the schema the shipped model was trained on
    assert warm_start_booster(shipped_model_dir(), names).current_iteration() > 0
    with pytest.raises(ValueError, match="feature schema"):
        warm_start_booster(shipped_model_dir(), names[:-1])
