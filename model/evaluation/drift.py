"""Feature drift: how far a fleet's feature rows sit from what training saw, per feature group.

The measure is the population stability index (PSI) of each feature against the training rows'
deciles, the credit-scoring industry's drift check: with a the live share and e the training share of
a bin, PSI = sum over bins of (a - e) * ln(a / e). The usual reading (Siddiqi, "Credit Risk
Scorecards", Wiley 2006; Yurdakul, "Statistical properties of population stability index", 2018):
under 0.1 no real change, 0.1 to 0.25 a moderate shift worth watching, above 0.25 a major shift, where
a model's scores and its threshold no longer mean what they meant in training.

Bins: the deciles of the training rows (fewer where values tie: a counter that is mostly 0 has a
bin "0" and a bin "above 0"), and NaN as a bin of its own, so a metric that goes missing more often
shows too. Shares are floored at `FLOOR` so that an empty bin costs a large but finite amount.

A group's PSI is the largest PSI of its features: drift in one feature (memory temperature alone, say)
is what matters, and an average over the 60-odd features of the thermal group would hide it. The
maximum over many features is inflated by sampling noise only slightly: for identical distributions
a feature's PSI is about (bins - 1) * (1/n + 1/N) (n live rows, N training rows), 0.002 at n = 5,000.
A feature with no value at all in the live rows is left out (the fleet does not export it: what
calibrate reports as missing, not a shift of what it does export); a group whose features are all
left out is absent from the result.

Groups come from name patterns (never a list of names), so features added later land in their group.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE = "reference.json"
FORMAT = "faultcast-feature-reference/1"
FLOOR = 1e-4  # the smallest share a bin counts with (an empty one): PSI stays finite
DECILES = np.linspace(0.1, 0.9, 9)
WATCH, MAJOR = 0.1, 0.25  # the usual PSI thresholds (see the module docstring)

# (group, pattern searched in the name), first match wins: order matters ("xid_memory_rate" is an Xid
# feature, "memory_temp_mean_5m" a thermal one, "nvml_failed_rate" NVML's health).
_GROUPS: tuple[tuple[str, str], ...] = (
    ("network", r"^node_|(^|_)(ib|tcp|peer)_"),
    ("presence", r"missing|seconds_since_last_sample|late|frozen|stale"),
    ("nvml health", r"nvml|unsupported_fields"),
    ("xid", r"(^|_)xid_"),
    ("row remap", r"row_remap"),
    ("memory errors", r"(^|_)(sbe|dbe|ecc)(_|$)"),
    ("pcie", r"pcie"),
    ("nvlink", r"nvlink"),
    ("thermal", r"temp|thermal"),
    ("power", r"power"),
    ("clocks", r"clock|slowdown"),
    ("utilisation", r"util"),
    ("hardware", r"^is_|generation|model_"),
)
_COMPILED = tuple((group, re.compile(pattern)) for group, pattern in _GROUPS)
GROUPS: tuple[str, ...] = (*(g for g, _ in _GROUPS), "other")


def feature_group(name: str) -> str:
    """The group of a feature name (one of GROUPS; "other" when no pattern matches)."""
    for group, pattern in _COMPILED:
        if pattern.search(name):
            return group
    return "other"


class DriftReferenceError(ValueError):
    """reference.json is there but unusable; the message says what is wrong."""


@dataclass(frozen=True)
class FeatureReference:
    """What training rows looked like, per feature: the decile cut points and each bin's share.

    For feature i, `edges[i]` are the ascending cut points c_1 < ... < c_m; value x falls in bin j,
    the number of cut points below it (so bin 0 is x <= c_1, bin m is x > c_m); `proportions[i]`
    has m + 2 shares: the m + 1 bins, then NaN."""

    names: tuple[str, ...]
    edges: tuple[tuple[float, ...], ...]
    proportions: tuple[tuple[float, ...], ...]
    rows: int  # training rows it was built from

    def groups(self) -> dict[str, list[int]]:
        """Feature indexes by group, in GROUPS order (groups with no feature left out)."""
        out: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            out.setdefault(feature_group(name), []).append(i)
        return {g: out[g] for g in GROUPS if g in out}


def _weighted_quantiles(values: np.ndarray, weight: np.ndarray | None, q: np.ndarray) -> np.ndarray:
    if weight is None:
        return np.asarray(np.quantile(values, q))
    order = np.argsort(values, kind="stable")
    v, w = values[order], weight[order]
    cum = np.cumsum(w)
    return np.asarray(np.interp(q * cum[-1], cum - w / 2.0, v))


def _shares(column: np.ndarray, edges: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """Share of each bin (len(edges) + 1 finite bins, then NaN) of `column`."""
    bins = len(edges) + 1
    nan = np.isnan(column)
    index = np.where(nan, bins, np.searchsorted(edges, np.where(nan, 0.0, column), side="left"))
    w = np.ones(len(column)) if weight is None else weight
    counts = np.bincount(index, weights=w, minlength=bins + 1)
    total = counts.sum()
    return np.asarray(counts / total) if total > 0 else np.zeros(bins + 1)


def build_reference(
    x: np.ndarray, names: Sequence[str], weight: np.ndarray | None = None
) -> FeatureReference:
    """The reference of training rows `x` (rows x features, NaN allowed), each row counting
    `weight` (e.g. the inverse of its sampling rate) when given."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != len(names):
        raise ValueError(f"x has shape {x.shape}, expected (rows, {len(names)})")
    if len(x) == 0:
        raise ValueError("no training rows to build a reference from")
    w = None if weight is None else np.asarray(weight, dtype=np.float64)
    if w is not None and (
        w.shape != (len(x),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0
    ):
        raise ValueError("weight must be one finite non-negative number per row, not all 0")
    edges, proportions = [], []
    for i in range(x.shape[1]):
        column = x[:, i].astype(np.float64)
        finite = np.isfinite(column)
        column = np.where(finite, column, np.nan)  # +-inf count as missing
        if finite.any():
            cut = np.unique(_weighted_quantiles(column[finite], None if w is None else w[finite], DECILES))
        else:
            cut = np.zeros(0)
        edges.append(tuple(float(c) for c in cut))
        proportions.append(tuple(float(p) for p in _shares(column, cut, w)))
    return FeatureReference(tuple(names), tuple(edges), tuple(proportions), len(x))


def save_reference(reference: FeatureReference, model_dir: Path) -> Path:
    """Write model_dir/reference.json (atomically) and return its path."""
    path = model_dir / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "format": FORMAT,
                "rows": reference.rows,
                "names": list(reference.names),
                "edges": [list(e) for e in reference.edges],
                "proportions": [list(p) for p in reference.proportions],
            }
        )
    )
    tmp.replace(path)
    return path


def load_reference(model_dir: Path) -> FeatureReference | None:
    """model_dir/reference.json, or None when there is none; raises DriftReferenceError naming what
    is wrong with one that is there."""
    path = model_dir / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DriftReferenceError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DriftReferenceError(f"{path}: not a feature reference (expected format {FORMAT!r})")
    try:
        names = tuple(str(n) for n in data["names"])
        edges = tuple(tuple(float(c) for c in e) for e in data["edges"])
        proportions = tuple(tuple(float(p) for p in s) for s in data["proportions"])
        rows = int(data["rows"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DriftReferenceError(f"{path} is corrupt: {exc!r}") from exc
    if not (len(names) == len(edges) == len(proportions)):
        raise DriftReferenceError(f"{path} is corrupt: names, edges and proportions differ in length")
    for name, cut, share in zip(names, edges, proportions, strict=True):
        if not all(math.isfinite(c) for c in cut) or any(b <= a for a, b in itertools.pairwise(cut)):
            raise DriftReferenceError(f"{path} is corrupt: {name}'s cut points are not finite and ascending")
        if len(share) != len(cut) + 2 or any(not (0.0 <= p <= 1.0) for p in share):
            raise DriftReferenceError(f"{path} is corrupt: {name} needs {len(cut) + 2} shares in [0, 1]")
        if abs(sum(share) - 1.0) > 1e-6:
            raise DriftReferenceError(f"{path} is corrupt: {name}'s shares sum to {sum(share):.6g}, not 1")
    return FeatureReference(names, edges, proportions, rows)


def psi_by_feature(reference: FeatureReference, x: np.ndarray) -> np.ndarray:
    """(features,) PSI of each feature of `x` (rows x the reference's features) against the
    reference; NaN for a feature with no finite value in `x` (not exported there)."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != len(reference.names):
        raise ValueError(f"x has shape {x.shape}, the reference has {len(reference.names)} features")
    out = np.full(len(reference.names), np.nan)
    if len(x) == 0:
        return out
    for i, (cut, expected) in enumerate(zip(reference.edges, reference.proportions, strict=True)):
        column = x[:, i].astype(np.float64)
        column = np.where(np.isfinite(column), column, np.nan)
        if np.isnan(column).all():
            continue
        a = np.maximum(_shares(column, np.asarray(cut), None), FLOOR)
        e = np.maximum(np.asarray(expected), FLOOR)
        out[i] = float(np.sum((a - e) * np.log(a / e)))
    return out


def psi_by_group(reference: FeatureReference, x: np.ndarray) -> dict[str, float]:
    """Per feature group, the largest PSI of its features (see the module docstring); groups whose
    features have no value at all in `x` are absent."""
    psi = psi_by_feature(reference, x)
    out = {}
    for group, index in reference.groups().items():
        values = psi[index]
        values = values[~np.isnan(values)]
        if values.size:
            out[group] = float(values.max())
    return out
