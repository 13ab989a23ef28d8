"""The rows cache: each world's sampled training rows kept between trainings, and thinned on reading.

A world's rows are the positives and a seeded Bernoulli share of its negatives: plain ones at the
negative rate, hard ones (a healthy row on which a shipped rule fires) at the hard rate, each weighted
back up by 1/rate. Keeping a Bernoulli(p) sample's rows with probability q/p is a Bernoulli(q) sample,
so rows cached at higher rates serve any lower ones without replaying the world through the features
again: a training on many worlds tries fewer negatives (time and memory) from the same cache.

Layout: `DIR/<world key>/n<negative rate>-h<hard rate>.npz`, the key a hash of the data, the feature
schema, the horizon and the sampling seed; the rates in the name are the effective ones (`rates`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Rows = dict[str, np.ndarray]
_NAME = re.compile(r"^n(?P<n>[0-9.e+-]+)-h(?P<h>[0-9.e+-]+)\.npz$")


@dataclass(frozen=True, slots=True)
class Rates:
    """The sampling's effective rates: plain negatives kept at `negative`, hard ones at `hard` (equal
    to `negative` when hard negatives are not told apart)."""

    negative: float
    hard: float

    @staticmethod
    def of(negative_rate: float, hard_negative_rate: float) -> Rates:
        """The rates a sampler with these settings keeps (it never keeps hard ones more rarely)."""
        return Rates(negative_rate, max(hard_negative_rate, negative_rate))

    @property
    def splits_hard(self) -> bool:
        """Whether the hard negatives were kept at their own rate."""
        return self.hard > self.negative

    def serves(self, wanted: Rates) -> bool:
        """Whether rows sampled at these rates can be thinned to `wanted`'s."""
        if wanted.negative > self.negative or wanted.hard > self.hard:
            return False
        return self.splits_hard or not wanted.splits_hard

    def file_name(self) -> str:
        return f"n{self.negative:g}-h{self.hard:g}.npz"


def world_key(parts: list[object]) -> str:
    """The cache key of a world's rows: a hash of what makes them (data, schema, horizon, seed)."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def find(cache: Path, key: str, wanted: Rates) -> tuple[Path, Rates] | None:
    """The cached rows of `key` that serve `wanted`: the exact rates if kept, else the fewest rows
    (lowest rates) that can be thinned to them; None when none can."""
    exact = cache / key / wanted.file_name()
    if exact.is_file():
        return exact, wanted
    found: list[tuple[float, float, Path, Rates]] = []
    for path in (cache / key).glob("n*-h*.npz"):
        match = _NAME.match(path.name)
        if match is None:
            continue
        held = Rates(float(match["n"]), float(match["h"]))
        if held.serves(wanted):
            found.append((held.negative, held.hard, path, held))
    if not found:
        return None
    _, _, path, held = min(found, key=lambda f: (f[0], f[1]))
    return path, held


def load(path: Path) -> Rows:
    with np.load(path, allow_pickle=True) as held:
        return {name: held[name] for name in held.files}


def save(cache: Path, key: str, rates: Rates, rows: Rows) -> Path:
    """Write a world's rows (through a temporary name: a reader never sees half a file)."""
    folder = cache / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / rates.file_name()
    part = path.with_name(path.name + ".part.npz")
    np.savez(part, **rows)  # type: ignore[arg-type]  # numpy's stub reads **rows as allow_pickle
    part.replace(path)
    return path


def thin(rows: Rows, held: Rates, wanted: Rates, seed: int) -> Rows:
    """`rows` sampled at `held`'s rates, thinned to `wanted`'s: every positive kept, each negative kept
    with probability (wanted rate / held rate) of its kind and weighted 1/(wanted rate). Seeded: the
    same rows and seed give the same rows."""
    if not held.serves(wanted):
        raise ValueError(f"rows sampled at {held} cannot be thinned to {wanted}")
    if held == wanted:
        return rows
    positive = rows["label"].astype(bool)
    weight = rows["weight"]
    # The sampler weighs a negative 1/rate of its kind: the weight says which kind it was.
    hard = ~positive & np.isclose(weight, 1.0 / held.hard) if held.splits_hard else np.zeros_like(positive)
    plain = ~positive & ~hard
    wanted_hard = wanted.hard if wanted.splits_hard else wanted.negative
    keep_share = np.where(
        hard, wanted_hard / held.hard, np.where(plain, wanted.negative / held.negative, 1.0)
    )
    keep = positive | (np.random.default_rng([seed, 0x7417]).random(len(positive)) < keep_share)
    out = {name: column[keep] for name, column in rows.items()}
    out["weight"] = np.where(
        hard[keep], 1.0 / wanted_hard, np.where(plain[keep], 1.0 / wanted.negative, weight[keep])
    ).astype(weight.dtype)
    return out
