"""Training's sampler with `ignore_before_failure_s`: the rows of a failing GPU between the horizon and
the ignored span before its failure are neither positives nor negatives; every other row is as before."""

from __future__ import annotations

import numpy as np

from faultcast.model.features.offline import Failure, FailureLog, Labels, Step
from faultcast.model.training.train import _Sampler

HORIZON, IGNORED, G = 1800.0, 7200.0, 4
FAIL_AT = 100_000.0
LOG = FailureLog.of(
    [
        Failure(FAIL_AT, node=0, gpu=1, mode="nvlink", precursor_s=3000.0),
        # No precursor: nothing could warn of it, so its approach is an ordinary negative.
        Failure(FAIL_AT, node=1, gpu=2, mode="firmware", precursor_s=0.0),
    ]
)


def _kept(ignored: Labels | None, before_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Which of the 2 x G slots a sampler keeping every row (rate 1) keeps `before_s` ahead of the
    failures, and their labels."""
    labels = Labels(HORIZON, LOG.learnable())
    sampler = _Sampler(labels, (0, 1), G, rate=1.0, seed=0, ignored=ignored)
    features = np.arange(2 * G, dtype=np.float64)[:, None]  # a row's feature is its slot
    sampler(Step(0, FAIL_AT - before_s, np.ones(2 * G, dtype=bool), features))
    rows = sampler.rows.stack()
    if not len(rows["label"]):
        return np.zeros(0, dtype=int), np.zeros(0, dtype=bool)
    return rows["features"][:, 0].astype(int), rows["label"].astype(bool)


def test_the_approach_beyond_the_horizon_is_left_out_only_with_the_option() -> None:
    ignored = Labels(IGNORED, LOG.learnable())
    every = list(range(2 * G))
    # An hour before: slot 1 (node 0, GPU 1) is left out; the firmware GPU without a precursor is not.
    slots, labels = _kept(ignored, 3600.0)
    assert slots.tolist() == [s for s in every if s != 1]
    assert not labels.any()
    slots, labels = _kept(None, 3600.0)  # without the option: a negative like the rest
    assert slots.tolist() == every
    assert not labels.any()
    # Within the horizon the failing GPU's row is a positive, kept either way.
    slots, labels = _kept(ignored, 600.0)
    assert slots.tolist() == every
    assert labels.tolist() == [s == 1 for s in every]
    # Beyond the ignored span it is an ordinary negative again.
    slots, labels = _kept(ignored, IGNORED + 60.0)
    assert slots.tolist() == every
    assert not labels.any()
