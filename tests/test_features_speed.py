"""The fast feature engine against the frozen reference (faultcast.testing.reference_features: the
engine before its vectorised rewrite): the same features, bit for bit, on random data with NaN gaps, sparse exports,
counter resets, frozen exporters, absent GPUs and nodes, infinities, replaced GPUs and skipped runs."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest

from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.features.offline import Failure, FailureLog, Labels, _str_codes
from faultcast.model.features.relative import node_mean, node_median
from faultcast.model.features.windows import Windowed
from faultcast.testing.engine_inputs import engine_steps
from faultcast.testing.reference_features import features as reference
from faultcast.testing.reference_features import windows as reference_windows

CONFIGS = [
    (FeatureConfig(frozen_s=600.0), 6, 8),
    (FeatureConfig(gpus_per_node=8, hold_s=300.0), 3, 4),  # the data's nodes are smaller than the model's
    (FeatureConfig(cadence_s=30.0, windows_s=(120.0, 600.0, 1800.0), frozen_s=300.0), 4, 8),
    (FeatureConfig(windows_s=(300.0, 900.0)), 2, 8),  # two windows: the middle one is the longest
]


def _equal(fast: np.ndarray, slow: np.ndarray, what: str) -> None:
    """Equal as numbers, NaN where NaN (a signed zero may differ: a min over equal values)."""
    np.testing.assert_array_equal(fast, slow, err_msg=what)


@pytest.mark.parametrize(("config", "nodes", "gpus"), CONFIGS)
@pytest.mark.parametrize("summaries", [True, False])
def test_the_fast_engine_gives_the_reference_features(
    config: FeatureConfig, nodes: int, gpus: int, summaries: bool
) -> None:
    fast = FeatureEngine(config, nodes, gpus)
    slow = reference.FeatureEngine(
        reference.FeatureConfig(
            config.cadence_s, config.windows_s, config.gpus_per_node, config.hold_s, config.frozen_s
        ),
        nodes,
        gpus,
    )
    assert fast.names == slow.names
    assert fast.schema_hash == slow.schema_hash
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN and gaps are data: no warnings either
        for i, s in enumerate(engine_steps(len(CONFIGS) + nodes, nodes, gpus, 700, summaries=summaries)):
            if i == 350:
                fast = pickle.loads(pickle.dumps(fast))  # noqa: S301 (our own bytes) a saved state goes on
            for engine in (fast, slow):
                if s.skip:
                    engine.skip(s.step - s.skip, s.skip)
                engine.reset_slots(s.reset)
            a = fast.update(s.step, s.gpu.copy(), s.node.copy(), s.is_h100, s.summary)
            b = slow.update(s.step, s.gpu.copy(), s.node.copy(), s.is_h100, s.summary)
            _equal(fast.present, slow.present, f"presence at step {s.step}")
            _equal(a, b, f"step {s.step}")


def test_windowed_min_and_max_match_a_scan_of_the_window() -> None:
    """The running min and max (blocks of a window's length) against a scan of the raw values, across
    resets, skips and a pickle."""
    rng = np.random.default_rng(3)
    fast = Windowed(5, 3, (4, 7, 16), 60.0, full=True)
    slow = reference_windows.Windowed(5, 3, (4, 7, 16), 60.0, full=True)
    for k in range(400):
        x = np.where(rng.random((5, 3)) < 0.3, np.nan, rng.normal(0, 1, (5, 3)))
        if k % 97 == 50:
            fast.skip(k % 23 + 1, np.full((5, 3), np.nan))
            slow.skip(k % 23 + 1, np.full((5, 3), np.nan))
        if k % 61 == 30:
            fast.reset(np.array([1, 3]))
            slow.reset(np.array([1, 3]))
        if k == 200:
            fast = pickle.loads(pickle.dumps(fast))  # noqa: S301 (our own bytes)
        for a, b in zip(fast.update(x), slow.update(x), strict=True):
            _equal(a, b, f"step {k}")


def test_the_node_median_and_mean_are_numpys_nanmedian_and_nanmean() -> None:
    rng = np.random.default_rng(5)
    for g in (1, 2, 3, 4, 8):
        values = rng.normal(0, 1, (50, g, 6))
        values[rng.random(values.shape) < 0.4] = np.nan
        values[0] = np.nan  # a node with no GPU
        values[1, :, 0] = 7.0  # ties
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(values, axis=1)
            mean = np.nanmean(values, axis=1)
        _equal(node_median(values), expected, f"{g} GPUs a node")
        _equal(node_mean(values), mean, f"{g} GPUs a node")


def test_uuid_codes_are_numpys_unique_of_the_strings() -> None:
    """replay's identity codes (found by hashing) equal np.unique over the column as str."""
    rng = np.random.default_rng(2)
    values = np.array([f"GPU-{i:03d}" for i in rng.integers(0, 40, 500)], dtype=object)
    for column in (pd.Series(values, dtype="category"), pd.Series(values, dtype=object), pd.Series(values)):
        names, codes = _str_codes(column)
        expected_names, expected_codes = np.unique(column.astype(str).to_numpy(), return_inverse=True)
        assert names.tolist() == expected_names.tolist()
        assert codes.tolist() == expected_codes.tolist()


def test_labels_found_by_bisection_are_those_of_the_whole_log() -> None:
    rng = np.random.default_rng(1)
    modes = ["hbm_wear", "host", "infiniband"]
    rows = [
        Failure(float(rng.uniform(0, 1e5)), int(rng.integers(0, 6)), int(rng.integers(-1, 8)), modes[k % 3])
        for k in range(60)
    ]
    labels = Labels(1800.0, FailureLog.of(rows))
    whole = Labels(1800.0, FailureLog.of(rows))
    whole.__dict__["_sorted"] = False  # the path that reads every failure of the log
    for t in np.arange(0.0, 1.1e5, 97.0):
        for nodes in ([0, 1, 2, 3, 4, 5], [4, 2]):
            fast, slow = labels.at(float(t), nodes, 8), whole.at(float(t), nodes, 8)
            for a, b in zip(fast, slow, strict=True):
                np.testing.assert_array_equal(a, b)
