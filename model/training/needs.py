"""What `faultcast train` needs of the data, in words a person can act on.

Training on one dataset (model/training/train.py) needs at least one failure a warning could precede
(FailureLog.learnable) labelling rows in each of its two slices: the fit slice (the training nodes'
earlier days) and the validation slice (the last `validation_fraction` of the training period on
the same nodes, where early stopping, the calibration and the thresholds are judged). A mode is
modelled by the mode head when at least one of its failures falls in the fit slice; no other count
is required. When the data falls short, the refusal says what it got, per slice and per mode, and
how many GPU-days would do at the data's own failure rate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import numpy as np

from faultcast.model.features.offline import Dataset

# The validation slice's expected failures the suggested size aims at: Poisson odds of at least one
# there are 1 - e^-3 = 95% (the fit slice, four times larger, then all but surely has one too).
EXPECTED_IN_SMALLEST = 3.0
NEEDED_PER_SLICE = (
    1  # what model/training/train.py checks: a positive row in each of the fit and validation slices
)


def slice_failures(
    label: np.ndarray, time_s: np.ndarray, ttf_s: np.ndarray, mode: np.ndarray, in_slice: np.ndarray
) -> Counter[str]:
    """The failures, per mode, that label the sampled rows of one slice (each failure once: its time
    and mode, from its positive rows)."""
    keep = label & in_slice
    seen = {
        (round(float(t + d), 1), str(m))
        for t, d, m in zip(time_s[keep], ttf_s[keep], mode[keep], strict=True)
    }
    return Counter(m for _, m in seen)


def counts_text(counts: Mapping[str, int], noun: str = "", more: str = "") -> str:
    """ "3 failures (hbm_wear 2, pcie 1)" for noun "failures", the modes most frequent first, `more`
    added in the brackets; "0 failures" when none."""
    total = sum(counts.values())
    parts = ", ".join(f"{m} {n}" for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n)
    inside = "; ".join(p for p in (parts, more) if p)
    return f"{total}{' ' + noun if noun else ''}{f' ({inside})' if inside else ''}"


def gpu_days(dataset: Dataset) -> float:
    """The data's GPU-days: every node and GPU over its whole span."""
    return len(dataset.nodes) * dataset.gpus_per_node * dataset.days


def learnable_rate(dataset: Dataset) -> tuple[float, str]:
    """Failures a warning could precede per GPU-day, and where the figure comes from: the data's own
    count, or (none in it) the twin's expected rate from its manifest; (0, ...) when neither says."""
    days = gpu_days(dataset)
    count = len(dataset.failures.learnable())
    if count and days > 0:
        return count / days, "this data's failure rate"
    modes = dataset.manifest.get("modes")
    if isinstance(modes, list):
        rate = sum(
            float(m.get("accelerated_rate_per_gpu_day", 0.0)) * float(m.get("precursor_probability", 0.0))
            for m in modes
            if isinstance(m, dict) and m.get("predictable", True)
        )
        if rate > 0:
            return rate, "the twin's expected failure rate"
    return 0.0, ""


def shortfall(
    dataset: Dataset,
    fit: Counter[str],
    validation: Counter[str],
    train_nodes: int,
    fit_span_s: float,
    validation_span_s: float,
) -> str:
    """The refusal's text: what the data holds, what each slice got and needs, and how much data
    would do at the data's failure rate."""
    learnable = dataset.failures.learnable()
    every = Counter(str(m) for m in learnable.mode)
    days = gpu_days(dataset)
    g = dataset.gpus_per_node
    fit_gpu_days = train_nodes * g * fit_span_s / 86_400.0
    val_gpu_days = train_nodes * g * validation_span_s / 86_400.0
    lines = [
        f"too few failures to train: {dataset.path} holds "
        f"{counts_text(every, 'failures a warning could precede', f'{len(dataset.failures)} failures in all')} "
        f"in {_days(days)} GPU-days; training needs at least "
        f"{NEEDED_PER_SLICE} in each of its fit slice ({_days(fit_gpu_days)} GPU-days: got {counts_text(fit)}) "
        f"and its validation slice ({_days(val_gpu_days)} GPU-days: got {counts_text(validation)})"
    ]
    rate, source = learnable_rate(dataset)
    share = min(fit_gpu_days, val_gpu_days) / days if days > 0 else 0.0
    if rate > 0 and share > 0:
        needed = EXPECTED_IN_SMALLEST / (rate * share)
        more = needed / days
        per_node_day = len(dataset.nodes) * g
        suggestion = f"e.g. {len(dataset.nodes)} nodes x {math.ceil(needed / per_node_day):,} days"
        acceleration = dataset.manifest.get("acceleration")
        twin = "twin" in str(dataset.manifest.get("kind", ""))  # an import's rate is its fleet's
        if twin and isinstance(acceleration, int | float) and acceleration > 0 and more > 1:
            suggestion += (
                f", or `faultcast simulate --acceleration {_round_up(acceleration * more):g}` at this size"
            )
        lines.append(
            f"at {source} ({1000 * rate:.1f} per 1,000 GPU-days) about {_days(needed)} GPU-days would do "
            f"({suggestion}): the smaller slice, {share:.0%} of the data, then expects "
            f"{EXPECTED_IN_SMALLEST:g} (95% odds of at least {NEEDED_PER_SLICE})"
        )
    else:
        lines.append("no failure rate to scale by: more days, more nodes or more acceleration")
    return "; ".join(lines)


def _days(value: float) -> str:
    """GPU-days as a person reads them: "0.53", "12", "2,560"."""
    return f"{value:.2g}" if value < 10 else f"{value:,.0f}"


def _round_up(value: float) -> float:
    """Up to two significant figures: 1,234 -> 1,300."""
    if value <= 0:
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / scale) * scale


def trained_on(fit: Counter[str], validation: Counter[str], modelled: list[str]) -> str:
    """The success's line: the failures each slice trained and validated on, and the modes the fit
    slice never saw (the mode head cannot name them)."""
    unseen = sorted(set(validation) - set(modelled))
    text = (
        f"training on the failures a warning could precede: fit slice {counts_text(fit)}, "
        f"validation slice {counts_text(validation)}"
    )
    if unseen:
        text += f"; not in the fit slice, so never named by the mode head: {', '.join(unseen)}"
    return text


def world_shortfall(dataset: Dataset, found: Mapping[str, int], warmup_s: float) -> str:
    """The refusal of one world across worlds: each world needs a failure a warning could precede
    after the features' warm-up (its rows are all sampled after it)."""
    learnable = dataset.failures.learnable()
    every = Counter(str(m) for m in learnable.mode)
    return (
        f"{dataset.path}: no failure a warning could precede after the {warmup_s / 3600:g} h warm-up "
        f"(got {counts_text(found)}; the data holds "
        f"{counts_text(every, 'such failures', f'{len(dataset.failures)} failures in all')} "
        f"in {_days(gpu_days(dataset))} GPU-days); every world needs at least {NEEDED_PER_SLICE}: more days, "
        "more nodes or more acceleration"
    )
