"""How an alert reads to a person: when the failure is expected first, then the risk against the
threshold it crossed.

Risk is calibrated at hardware's real failure rate: the chance the GPU (or node) fails within the
model's horizon. Failures are rare, so a risk of a few percent can stand several times above the
alert threshold (0.016 for the demo model) and well above any healthy GPU's: "risk 0.031, 1.9x
threshold" says how far the alert stands above the line that opened it. The demo, `faultcast score`'s
table and the client's log lines all word it so (they share these functions).
"""

from __future__ import annotations

import math
from typing import Any


def time_to_failure_text(p50_s: float | None, p10_s: float | None = None, p90_s: float | None = None) -> str:
    """ "failure in ~12 min (5-25)", the p10-p90 range in brackets when known; "no time estimate"
    when the median is unknown (None, NaN or not positive: proto3's unset)."""
    if p50_s is None or not math.isfinite(p50_s) or p50_s <= 0:
        return "no time estimate"
    text = f"failure in ~{p50_s / 60:.0f} min"
    if (
        p10_s is not None
        and p90_s is not None
        and math.isfinite(p10_s)
        and math.isfinite(p90_s)
        and p90_s > 0
    ):
        text += f" ({p10_s / 60:.0f}-{p90_s / 60:.0f})"
    return text


def times_threshold(risk: float, threshold: float | None) -> float | None:
    """How many times its threshold the risk stands; None without a usable threshold."""
    if threshold is None or not math.isfinite(threshold) or threshold <= 0 or not math.isfinite(risk):
        return None
    return risk / threshold


def risk_text(risk: float, threshold: float | None, tier: str = "") -> str:
    """ "risk 0.031 = 1.9x threshold 0.016" (`tier`, e.g. "move", names which threshold); "risk 0.031"
    without a threshold."""
    ratio = times_threshold(risk, threshold)
    if ratio is None:
        return f"risk {risk:.3g}"
    assert threshold is not None
    which = f"{tier} threshold" if tier else "threshold"
    return f"risk {risk:.3g} = {ratio:.1f}x {which} {threshold:.3g}"


def alert_threshold(alert: Any) -> tuple[float | None, str]:
    """The threshold an alert event stands at, and its tier's name ("move", "protect", or "" for a
    service with one threshold): ModelInfo.protect_threshold for a PROTECT alert, ModelInfo.threshold
    otherwise; (None, "") when the event carries no model. `alert` is a faultcast.v1 Alert (duck-typed,
    so this module needs no generated stubs)."""
    if not alert.HasField("model") or alert.model.threshold <= 0:
        return None, ""
    model = alert.model
    protect = float(model.protect_threshold)
    if int(alert.tier) == 1 and protect > 0:  # ALERT_TIER_PROTECT
        return protect, "protect"
    return float(model.threshold), "move" if protect > 0 else ""


def alert_summary(alert: Any) -> str:
    """ "failure in ~12 min (5-25), risk 0.031 = 1.9x threshold 0.016" for an OPENED or UPDATED
    Alert event."""
    when = "no time estimate"
    if alert.HasField("time_to_failure"):
        ttf = alert.time_to_failure
        when = time_to_failure_text(ttf.p50_seconds, ttf.p10_seconds, ttf.p90_seconds)
    threshold, tier = alert_threshold(alert)
    return f"{when}, {risk_text(float(alert.risk), threshold, tier)}"
