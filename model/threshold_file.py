"""An alert threshold chosen for a model after training, kept beside it as `threshold.json`.

`faultcast goodput --apply MODELDIR` writes one (the threshold that maximises effective training
time for a job size and checkpoint cost); `load` applies it, so the service takes it at start and on
every reload. The file names the model it was chosen for: a threshold chosen for another model is
refused, with the reason, rather than silently applied.

It may also hold `protect_threshold`, the lower threshold of the protect tier (alerts that buy cheap
protection: replicas to peers' memory and a readied spare, no move), below `threshold`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FILE = "threshold.json"


class ThresholdFileError(ValueError):
    """threshold.json is there but unusable (unreadable, malformed, or chosen for another model)."""


@dataclass(frozen=True)
class ChosenThreshold:
    """What threshold.json says: the threshold to serve, the model it was chosen for, and why."""

    threshold: float
    model_sha256: str
    basis: dict[str, object]  # written by `faultcast goodput --apply`: job size, costs, the figures
    protect_threshold: float | None = None  # the protect tier's, below threshold; None: no such tier


def write(
    model_dir: Path,
    threshold: float,
    model_sha256: str,
    basis: Mapping[str, object],
    protect_threshold: float | None = None,
) -> Path:
    """Write `threshold.json` atomically; `basis` records why (job size, costs, the figures)."""
    _check_threshold(threshold, "threshold")
    data: dict[str, object] = {"threshold": threshold, "model_sha256": model_sha256, "basis": dict(basis)}
    if protect_threshold is not None:
        _check_protect(protect_threshold, threshold, "protect_threshold")
        data["protect_threshold"] = protect_threshold
    path = model_dir / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    with tmp.open("rb") as handle:
        os.fsync(handle.fileno())
    tmp.replace(path)
    return path


def read(model_dir: Path, model_sha256: str) -> ChosenThreshold | None:
    """The file's content when there is one (None when not); raises ThresholdFileError saying what
    is wrong with a file that is there, or that it was chosen for another model."""
    path = model_dir / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ThresholdFileError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or "threshold" not in data or "model_sha256" not in data:
        raise ThresholdFileError(f"{path}: expected an object with threshold and model_sha256")
    if data["model_sha256"] != model_sha256:
        raise ThresholdFileError(
            f"{path} was chosen for model {str(data['model_sha256'])[:12]}, this model is {model_sha256[:12]}: "
            "run faultcast goodput --apply again for this model, or remove the file"
        )
    _check_threshold(data["threshold"], str(path))
    protect = data.get("protect_threshold")
    if protect is not None:
        _check_protect(protect, float(data["threshold"]), f"{path}: protect_threshold")
    basis = data.get("basis", {})
    return ChosenThreshold(
        float(data["threshold"]),
        str(data["model_sha256"]),
        basis if isinstance(basis, dict) else {},
        None if protect is None else float(protect),
    )


def _check_protect(value: object, threshold: float, where: str) -> None:
    _check_threshold(value, where)
    if not float(value) < threshold:  # type: ignore[arg-type]  # a number, checked just above
        raise ThresholdFileError(f"{where}: must be below the threshold {threshold:g}, got {value!r}")


def _check_threshold(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0.0 < float(value) < 1.0):
        raise ThresholdFileError(f"{where}: the threshold must be a number in (0, 1), got {value!r}")
    if not math.isfinite(float(value)):
        raise ThresholdFileError(f"{where}: the threshold must be finite, got {value!r}")
