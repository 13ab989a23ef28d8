"""The risks a model can give at all, and the thresholds that make sense for it.

The risk booster's score is a sum of one leaf per tree, so it lies between the sums of each tree's
lowest and highest leaves; through the sigmoid and the calibration (monotone) that bounds every risk
the model can give. A threshold at or below the lowest alerts on every GPU at every step (a value
such as 1e-320 in a threshold file, or set by mistake): such a model is refused with the reason,
at start and on reload, rather than served to drain a cluster. One above the highest never alerts:
it is served, and the service says so (it is how training marks a model that met no budget).
"""

from __future__ import annotations

import math
from typing import Any

import lightgbm as lgb

from faultcast.model.manifest import ModelError

_CLIP = 1e-9  # FaultModel.risk clips the booster's probability to [1e-9, 1 - 1e-9]


def _extreme_leaves(node: dict[str, Any]) -> tuple[float, float]:
    if "leaf_value" in node:
        value = float(node["leaf_value"])
        return value, value
    left = _extreme_leaves(node["left_child"])
    right = _extreme_leaves(node["right_child"])
    return min(left[0], right[0]), max(left[1], right[1])


def _sigmoid_scale(booster: lgb.Booster) -> float | None:
    """The binary objective's sigmoid parameter; None for another objective."""
    objective = str(booster.dump_model(num_iteration=0).get("objective", ""))
    parts = objective.split()
    if not parts or parts[0] != "binary":
        return None
    for part in parts[1:]:
        if part.startswith("sigmoid:"):
            return float(part.split(":", 1)[1])
    return 1.0


def risk_range(
    booster: lgb.Booster,
    calibration: tuple[float, float],
    logistic_logits: tuple[float, float] | None = None,
    blend: float = 0.0,
) -> tuple[float, float]:
    """The lowest and highest calibrated risk the model can give (bounds: reached or not). A blend
    adds `blend` times the logistic baseline's log-odds, which lie within `logistic_logits`."""
    a, b = calibration
    scale = _sigmoid_scale(booster)
    if scale is None:
        raw_low, raw_high = _CLIP, 1.0 - _CLIP
    else:
        low = high = 0.0
        for tree in booster.dump_model()["tree_info"]:
            tree_low, tree_high = _extreme_leaves(tree["tree_structure"])
            low, high = low + tree_low, high + tree_high
        raw_low, raw_high = (_clipped(1.0 / (1.0 + math.exp(-scale * margin))) for margin in (low, high))
    shifts = [0.0]
    if blend and logistic_logits is not None:
        shifts = [blend * logistic_logits[0], blend * logistic_logits[1]]
    risks = [_calibrated(raw, a, b + shift) for raw in (raw_low, raw_high) for shift in shifts]
    return min(risks), max(risks)


def _clipped(raw: float) -> float:
    return min(max(raw, _CLIP), 1.0 - _CLIP)


def _calibrated(raw: float, a: float, b: float) -> float:
    z = a * math.log(raw / (1.0 - raw)) + b
    if z > 700:
        return 1.0
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def check_threshold(threshold: float, low: float, where: str) -> None:
    """ModelError unless `threshold` lies above `low`, the lowest risk the model gives."""
    if not (threshold > low and math.isfinite(threshold)):
        raise ModelError(
            f"{where}: alert threshold {threshold:.6g} is at or below the lowest risk this model gives "
            f"({low:.6g}): every GPU would alert at every step. Choose a threshold above it "
            "(faultcast goodput --apply, faultcast calibrate --apply) or remove the threshold file"
        )
