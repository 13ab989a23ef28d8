"""The recall a model can expect at any threshold, measured where it was trained: `recall_curve.json`
beside the model. Training writes it from leave-world-out validation (recall of the failures of
worlds the model never saw, at each of a grid of thresholds); `faultcast calibrate` reads the recall
at the threshold it chose for a fleet, whose own history has too few failures to measure one.

Between the grid's thresholds the curve is a step: the recall at `t` is the recall at the nearest
threshold of the grid not below `t`; above the grid's highest threshold it is unknown (NaN), never
extrapolated. Event recall need not fall as the threshold rises (a low threshold opens alerts so
early that they are held open past the prediction period and credit nothing), so the curve is what
was measured at each threshold, not a bound.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FILE = "recall_curve.json"
FORMAT = "faultcast-recall-curve/1"


class RecallCurveError(ValueError):
    """recall_curve.json is there but unusable, or a curve to write is malformed."""


@dataclass(frozen=True)
class RecallCurve:
    """Recall at ascending thresholds, and what it was measured on (`basis`)."""

    thresholds: tuple[float, ...]
    recall: tuple[float, ...]
    basis: dict[str, object] = field(default_factory=dict)

    def recall_at(self, threshold: float) -> float:
        """Recall at the nearest threshold of the curve not below `threshold` (NaN above the last)."""
        i = int(np.searchsorted(np.asarray(self.thresholds), threshold, side="left"))
        return self.recall[i] if i < len(self.recall) else math.nan


def _checked(thresholds: Sequence[float], recall: Sequence[float], where: str) -> RecallCurve:
    t = [float(v) for v in thresholds]
    r = [float(v) for v in recall]
    if not t or len(t) != len(r):
        raise RecallCurveError(f"{where}: thresholds and recall must be non-empty and of one length")
    if not all(math.isfinite(v) for v in t) or any(b <= a for a, b in itertools.pairwise(t)):
        raise RecallCurveError(f"{where}: thresholds must be finite and strictly ascending")
    if not all(0.0 <= v <= 1.0 for v in r):  # NaN fails this too
        raise RecallCurveError(f"{where}: every recall must be a number in [0, 1]")
    return RecallCurve(tuple(t), tuple(r))


def write_curve(
    model_dir: Path, thresholds: Sequence[float], recall: Sequence[float], basis: Mapping[str, object]
) -> Path:
    """Write model_dir/recall_curve.json (atomically): recall at each ascending threshold, and what
    it was measured on (`basis`: worlds, failures, periods). Raises RecallCurveError for a malformed
    curve."""
    curve = _checked(thresholds, recall, "recall curve")
    path = model_dir / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "format": FORMAT,
                "thresholds": list(curve.thresholds),
                "recall": list(curve.recall),
                "basis": dict(basis),
            },
            indent=1,
        )
    )
    tmp.replace(path)
    return path


def read_curve(model_dir: Path) -> RecallCurve | None:
    """model_dir/recall_curve.json, or None when the model has none; raises RecallCurveError for a
    file that is there but unusable."""
    path = model_dir / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecallCurveError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecallCurveError(f"{path}: not a recall curve (expected format {FORMAT!r})")
    try:
        curve = _checked(data["thresholds"], data["recall"], str(path))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, RecallCurveError):
            raise
        raise RecallCurveError(f"{path} is corrupt: {exc!r}") from exc
    basis = data.get("basis", {})
    return RecallCurve(curve.thresholds, curve.recall, basis if isinstance(basis, dict) else {})
