"""The rows cache: a world's sampled rows kept once, served to trainings at the same or lower rates by
thinning (a Bernoulli sample of a Bernoulli sample), so that fewer negatives need no replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faultcast.model.training import rows_cache
from faultcast.model.training.rows_cache import Rates

PLAIN, HARD, POSITIVE = 200_000, 50_000, 1_000


def _rows(held: Rates) -> rows_cache.Rows:
    """Rows as the sampler writes them at `held`: plain negatives weighted 1/negative, hard 1/hard,
    positives 1 (half of them from node-level failures, 1/8)."""
    n = PLAIN + HARD + POSITIVE
    label = np.zeros(n, dtype=bool)
    label[-POSITIVE:] = True
    weight = np.concatenate(
        [
            np.full(PLAIN, 1 / held.negative),
            np.full(HARD, 1 / held.hard),
            np.tile([1.0, 1 / 8], POSITIVE // 2),
        ]
    )
    return {
        "features": np.arange(n, dtype=np.float32)[:, None],
        "label": label,
        "weight": weight,
        "time_s": np.arange(n, dtype=np.float64),
        "ttf_s": np.zeros(n),
        "mode": np.array([""] * n, dtype=object),
    }


def _within(count: int, n: int, p: float) -> bool:
    """`count` of `n` Bernoulli(p) draws, within five standard deviations of n*p."""
    return bool(abs(count - n * p) <= 5 * np.sqrt(n * p * (1 - p)))


def test_thinning_keeps_each_kind_at_its_new_rate_and_weighs_it_back() -> None:
    held, wanted = Rates.of(0.2, 0.5), Rates.of(0.05, 0.25)
    rows = _rows(held)
    out = rows_cache.thin(rows, held, wanted, seed=3)
    positive = out["label"]
    assert positive.sum() == POSITIVE  # every positive kept, its weight untouched
    np.testing.assert_array_equal(out["weight"][positive], rows["weight"][rows["label"]])
    plain = ~positive & (out["features"][:, 0] < PLAIN)
    hard = ~positive & ~plain
    assert _within(int(plain.sum()), PLAIN, 0.05 / 0.2)
    assert _within(int(hard.sum()), HARD, 0.25 / 0.5)
    np.testing.assert_allclose(out["weight"][plain], 1 / 0.05)
    np.testing.assert_allclose(out["weight"][hard], 1 / 0.25)
    # The weighted negatives still estimate the negatives the world had (1,000,000 + 100,000).
    total = PLAIN / 0.2 + HARD / 0.5
    assert out["weight"][~positive].sum() == pytest.approx(total, rel=0.02)
    # Every column is thinned alike: a row stays whole.
    np.testing.assert_array_equal(out["time_s"], out["features"][:, 0].astype(np.float64))


def test_thinning_to_no_hard_negatives_samples_them_at_the_plain_rate() -> None:
    held, wanted = Rates.of(0.2, 0.5), Rates.of(0.05, 0.0)
    out = rows_cache.thin(_rows(held), held, wanted, seed=4)
    hard = ~out["label"] & (out["features"][:, 0] >= PLAIN)
    assert _within(int(hard.sum()), HARD, 0.05 / 0.5)
    np.testing.assert_allclose(out["weight"][~out["label"]], 1 / 0.05)


def test_thinning_is_seeded_and_the_same_rates_are_the_rows_themselves() -> None:
    held, wanted = Rates.of(0.2, 0.5), Rates.of(0.1, 0.3)
    rows = _rows(held)
    a, b = rows_cache.thin(rows, held, wanted, seed=7), rows_cache.thin(rows, held, wanted, seed=7)
    np.testing.assert_array_equal(a["time_s"], b["time_s"])
    assert not np.array_equal(a["time_s"], rows_cache.thin(rows, held, wanted, seed=8)["time_s"])
    assert rows_cache.thin(rows, held, held, seed=7) is rows


def test_rows_that_cannot_serve_are_refused() -> None:
    held = Rates.of(0.02, 0.25)
    assert not held.serves(Rates.of(0.05, 0.25))  # more plain negatives than were kept
    assert not held.serves(Rates.of(0.02, 0.5))  # more hard ones
    assert not Rates.of(0.05, 0.0).serves(Rates.of(0.02, 0.04))  # hard ones were never told apart
    with pytest.raises(ValueError, match="cannot be thinned"):
        rows_cache.thin(_rows(held), held, Rates.of(0.05, 0.25), seed=0)


def test_the_cache_finds_the_exact_rows_else_the_fewest_that_serve(tmp_path: Path) -> None:
    rows = _rows(Rates.of(0.2, 0.5))
    for rates in (Rates.of(0.2, 0.5), Rates.of(0.1, 0.4), Rates.of(0.05, 0.0)):
        rows_cache.save(tmp_path, "k", rates, rows)
    assert rows_cache.find(tmp_path, "k", Rates.of(0.1, 0.4)) == (
        tmp_path / "k" / "n0.1-h0.4.npz",
        Rates.of(0.1, 0.4),
    )
    found = rows_cache.find(tmp_path, "k", Rates.of(0.05, 0.3))
    assert found is not None
    assert found[1] == Rates.of(0.1, 0.4)
    found = rows_cache.find(tmp_path, "k", Rates.of(0.01, 0.0))
    assert found is not None
    assert found[1] == Rates.of(0.05, 0.05)
    assert rows_cache.find(tmp_path, "k", Rates.of(0.3, 0.5)) is None
    assert rows_cache.find(tmp_path, "other", Rates.of(0.01, 0.0)) is None
    loaded = rows_cache.load(tmp_path / "k" / "n0.2-h0.5.npz")
    np.testing.assert_array_equal(loaded["weight"], rows["weight"])
    assert not list(tmp_path.glob("k/*.part.npz"))  # written through a temporary name
