"""The checkpoint interval that minimises expected waste: Young (1974) and Daly (2006)."""

from __future__ import annotations

import math


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: sqrt(2 * checkpoint cost * MTBF) of compute between checkpoints."""
    _check(checkpoint_s, mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum ("A higher order estimate of the optimum checkpoint interval for
    restart dumps", FGCS 22, 2006, eq. 37): for a checkpoint cost d below twice the MTBF M,
    sqrt(2dM) * (1 + sqrt(d / 2M) / 3 + (d / 2M) / 9) - d; otherwise M. An infinite MTBF (no failure
    goes unforeseen) needs no periodic checkpoint: the interval is infinite."""
    _check(checkpoint_s, mtbf_s)
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s


def _check(checkpoint_s: float, mtbf_s: float) -> None:
    if not (checkpoint_s > 0 and math.isfinite(checkpoint_s)):
        raise ValueError(f"the checkpoint cost must be positive and finite, got {checkpoint_s}")
    if not mtbf_s > 0:
        raise ValueError(f"the MTBF must be positive, got {mtbf_s}")
