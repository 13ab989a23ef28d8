"""A stub model: a real artifact (`model.artifact.save` writes it, `load` and `Service.open` read it
through the same checks as a trained one) built in milliseconds instead of the demo model's minute.

Its risk booster is one tree without a split, fit on a few all-zero rows of this faultcast's feature
width: every GPU scores the same risk, STUB_RISK, well under its threshold. So a service serving it
never alerts on anything, by construction. It is for the tests and benchmarks whose outcome cannot
depend on the model's quality (authentication, limits, reflection, health, admin RPCs,
registration, plumbing); anything that needs a precursor caught needs a trained model
(faultcast.demo.model).
"""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np

from faultcast.model.artifact import FaultModel, Logistic, save
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.incidents import AlertPolicy

# The rows it is fit on: one positive in eight, so the one leaf's probability is 1/8.
_ROWS = 8
STUB_RISK = 1.0 / _ROWS
STUB_THRESHOLD = 0.5  # above the only risk it gives, below training's "never" (1.0), which logs an error
STUB_HORIZON_S = 1800.0  # the demo model's: 30 minutes
# Any failure-mode names do: with no mode head each is equally likely.
STUB_MODES = ("hbm_wear", "host", "nvlink")


def stub_model(out: Path, config: FeatureConfig | None = None) -> Path:
    """Write the stub model into `out` (created if need be) and return `out`."""
    config = config or FeatureConfig()
    names = FeatureEngine(config, 1).names
    x = np.zeros((_ROWS, len(names)))
    y = np.zeros(_ROWS)
    y[0] = 1.0
    # Constant features leave nothing to split: the booster is its initial score, log-odds of 1/8.
    params = {"objective": "binary", "verbose": -1, "num_threads": 1, "boost_from_average": True}
    booster = lgb.train(params, lgb.Dataset(x, y, feature_name=list(names)), num_boost_round=1)
    width = len(names)
    # Median-imputed, standardised, every weight 0: the baseline's risk is sigmoid(-2) everywhere.
    logistic = Logistic(np.zeros(width), np.zeros(width), np.ones(width), np.zeros(width), -2.0)
    model = FaultModel(
        booster=booster,
        calibration=(1.0, 0.0),  # the identity: risk = the booster's probability
        mode_booster=None,
        modes=list(STUB_MODES),
        ttf_booster=None,
        feature_config=config,
        feature_names=tuple(names),
        horizon_s=STUB_HORIZON_S,
        threshold=STUB_THRESHOLD,
        policy=AlertPolicy(),
        logistic=logistic,
        logistic_threshold=STUB_THRESHOLD,
        dcgm_default_threshold=STUB_THRESHOLD,
    )
    save(model, out)
    return out
