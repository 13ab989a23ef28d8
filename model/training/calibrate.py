"""Fleet calibration: the serving threshold from a fleet's own recent history (`faultcast calibrate`).

A model's trained threshold held its false-alarm budget on the twin worlds it was validated on; a real
fleet (hotter racks, other cards, other jobs) scores its healthy GPUs differently. Calibration scores
the fleet's recent history with the model, through the same features and alert policy as serving,
and takes the lowest threshold at which false alarms (incidents not followed by their
failure within the prediction period) on the windows not followed by a failure stay within the
budget, per 1,000 GPU-days. With no failure log every incident counts as a false alarm: conservative,
since an incident that a failure did follow is counted against the budget too.

**Small histories.** Two days of a 32-GPU fleet are 64 GPU-days: at a budget of 2 per 1,000 GPU-days
that history is expected to hold 0.13 false alarms, and seeing none bounds the rate only to 47 per
1,000 GPU-days (95%, Poisson). The threshold therefore cannot come from counting alarms on the
history; it comes from the tail of the healthy scores, extrapolated, with an upper confidence bound:

1. Each healthy GPU-step gets its *opening level*, the risk at which an alert would open there: the
   lowest of its last `k` consecutive scores (the policy opens after `k` scores at or above the
   threshold). Steps within the prediction period before a failure they credit are left out.
2. Each GPU-day's highest opening level is a block maximum: at a threshold t, about as many alerts
   open as there are GPU-days whose maximum reaches t (never fewer, unless one GPU-day holds two
   separate alerts). Days, not hours: healthy scores are a mixture of a quiet background and rare
   look-alike episodes (a degradation that stops short of failing) lasting hours; per GPU-hour, an
   episode fills several blocks and the fitted tail is the background's. Measured on an independent
   twin (8 nodes, 2 days): GPU-hour blocks and a 10% tail put the threshold at 0.018 where an
   episode had opened an alert at 0.50; GPU-day blocks at 0.82, above every episode of the two days
   that followed (0.52 at most).
3. The tail of the block maxima, in logit space, is fitted with an exponential above the top 10%
   (at least 10 blocks): peaks over a threshold (Pickands 1975; Coles, "An Introduction to
   Statistical Modeling of Extreme Values", Springer 2001, ch. 4), with the shape fixed at 0 (the
   Gumbel domain; a fitted shape would be too uncertain on a hundred blocks). The level at which
   the fitted rate of exceeding GPU-days equals the budget is the point estimate: the return level
   of 1,000 / budget GPU-days, which on a short history lies above anything seen.
4. The threshold is the highest of: the point estimate; the same with the exponential scale at its
   one-sided 95% upper bound (chi-square, 2n degrees of freedom); the 95th percentile of the point
   estimate over 200 bootstrap resamples of the nodes (a bad node's hours are not independent). So
   it errs high on a short history and closes in on the estimate as the history grows.
5. Checked with the real tracker on the history: if its false alarms there exceed what the budget
   allows on that many GPU-days (rounded down: none on a small history), the threshold rises just
   above the offending opening levels until they do not.

Alternatives considered: the highest healthy score plus a fixed margin has no stated confidence and
does not shrink with more data; an empirical quantile of the block maxima cannot reach past the
largest one (a 1-in-500 GPU-day quantile from 64 GPU-days); a quantile's upper confidence bound
alone (order statistics) is undefined below 1/n. The exponential tail extrapolates, and its
bounds say how far the history supports it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import chi2

from faultcast.model.artifact import FaultModel, load
from faultcast.model.evaluation import drift
from faultcast.model.evaluation.evaluate import MODE_FLOOR, WARMUP_S
from faultcast.model.evaluation.intervals import resample_weights
from faultcast.model.evaluation.outcomes import (
    DEFAULT_PERIODS,
    Outcome,
    PredictionPeriods,
    ScoredPeriod,
    incidents,
    judge,
)
from faultcast.model.features.offline import Dataset, FailureLog, Step, open_dataset, read_failures, replay
from faultcast.model.training import recall_curve
from faultcast.modes import NODE_LEVEL_MODES

log = logging.getLogger(__name__)

SOURCE = "faultcast calibrate"
BLOCK_S = 86_400.0  # block maxima per GPU-day
TAIL_SHARE = 0.1  # the tail fitted: the top 10% of the block maxima ...
MIN_TAIL = 10  # ... and at least this many
MIN_BLOCKS = 50  # fewer healthy GPU-days than this: too little history to calibrate on
RESAMPLES = 200
CONFIDENCE = 0.95
MAX_THRESHOLD = 1.0 - 1e-6  # threshold.json takes (0, 1): this one never alerts in practice
SAMPLE_ROWS = 20_000  # feature rows kept (uniformly over the history) for drift
_LOGIT_CLIP = 1e-12


class CalibrationError(ValueError):
    """The history cannot calibrate this model (too short, another node size); says why."""


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(p, _LOGIT_CLIP, 1 - _LOGIT_CLIP)
    return np.asarray(np.log(q / (1 - q)))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


@dataclass
class _Sink:
    """Scores every present row after `start_s` with the model (risk and, near alerts, the mode), and
    keeps a uniform sample of the feature rows for drift (reservoir sampling)."""

    model: FaultModel
    start_s: float
    rng: np.random.Generator
    times: list[float] = field(default_factory=list)
    present: list[np.ndarray] = field(default_factory=list)
    risk: list[np.ndarray] = field(default_factory=list)
    modes: list[np.ndarray] = field(default_factory=list)
    sample: np.ndarray | None = None
    seen: int = 0

    def __call__(self, step: Step) -> None:
        if step.time_s < self.start_s:
            return
        rows = step.present
        risk = np.full(len(rows), np.nan)
        modes = np.full(len(rows), "", dtype=object)
        if rows.any():
            x = step.features[rows]
            r = self.model.risk(x)
            risk[rows] = r
            near = r >= MODE_FLOOR
            if near.any() and self.model.modes:
                likely = np.argmax(self.model.mode_probabilities(x[near]), axis=1)
                modes[np.nonzero(rows)[0][near]] = np.asarray(self.model.modes, dtype=object)[likely]
            self._keep(x)
        self.times.append(step.time_s)
        self.present.append(rows.copy())
        self.risk.append(risk)
        self.modes.append(modes)

    def _keep(self, x: np.ndarray) -> None:
        if self.sample is None:
            self.sample = np.empty((0, x.shape[1]), dtype=np.float32)
        take = x[: max(0, SAMPLE_ROWS - len(self.sample))]
        if len(take):
            self.sample = np.concatenate([self.sample, take.astype(np.float32)])
            self.seen += len(take)
            x = x[len(take) :]
        if len(x):
            position = self.seen + 1 + np.arange(len(x))
            slot = self.rng.integers(0, position)
            kept = slot < SAMPLE_ROWS
            self.sample[slot[kept]] = x[kept]
            self.seen += len(x)


@dataclass(frozen=True)
class History:
    """A fleet's history scored with a model: the period (risk only), and sampled feature rows."""

    dataset: Dataset
    period: ScoredPeriod
    rows: np.ndarray  # (sampled rows, features), float32


def score_history(dataset: Dataset, model: FaultModel, seed: int = 0) -> History:
    """Score every node of `dataset` after the features' warm-up (6 h) with the model alone."""
    start = dataset.start_s + WARMUP_S
    if start >= dataset.end_s:
        raise CalibrationError(
            f"{dataset.path}: {dataset.days * 24:.1f} h of data, shorter than the features' "
            f"{WARMUP_S / 3600:g} h warm-up: nothing to calibrate on"
        )
    sink = _Sink(model, start, np.random.default_rng(seed))
    nodes = list(range(len(dataset.nodes)))
    try:
        replay(
            dataset, model.feature_config, sink, nodes=nodes, start_s=start - WARMUP_S, end_s=dataset.end_s
        )
    except ValueError as exc:  # DataError: another node size, rows for unknown nodes
        raise CalibrationError(str(exc)) from exc
    g = dataset.gpus_per_node  # the data's node size, whatever the model was trained on
    steps = len(sink.times)
    period = ScoredPeriod(
        times_s=np.asarray(sink.times),
        nodes=tuple(nodes),
        gpus_per_node=g,
        present=np.asarray(sink.present).reshape(steps, -1),
        scores={"model": np.asarray(sink.risk).reshape(steps, -1)},
        labels=np.zeros((steps, len(nodes) * g), dtype=bool),
        modes=np.asarray(sink.modes, dtype=object).reshape(steps, -1),
        censored=dataset.censored,  # a drained prediction nothing settled is no false alarm here either
    )
    rows = sink.sample if sink.sample is not None else np.empty((0, len(model.feature_names)), np.float32)
    return History(dataset, period, rows)


# -- the threshold --------------------------------------------------------------------------------


def healthy_mask(period: ScoredPeriod, failures: FailureLog, periods: PredictionPeriods) -> np.ndarray:
    """(steps, slots): present rows not within the prediction period before a failure they would be
    credited by (a GPU failure: that GPU's rows; a node-level failure: every GPU of the node)."""
    mask = period.present.copy()
    times = period.times_s
    g = period.gpus_per_node
    for f in failures.between(float(times[0]) - 1e-6, float(times[-1]) + periods.period_s, period.nodes):
        before = (times >= f.time_s - periods.period_s) & (times < f.time_s)
        base = period.nodes.index(f.node) * g
        columns = slice(base, base + g) if f.gpu < 0 else slice(base + f.gpu, base + f.gpu + 1)
        mask[before, columns] = False
    return mask


def opening_levels(risk: np.ndarray, present: np.ndarray, k: int) -> np.ndarray:
    """(steps, slots): the highest threshold at which an alert could open at each present step, the
    lowest of the slot's last `k` present scores (-inf where absent or fewer than k scores yet)."""
    out = np.full(risk.shape, -np.inf)
    r = np.where(np.isnan(risk), -np.inf, risk)
    for slot in range(risk.shape[1]):
        steps = np.nonzero(present[:, slot])[0]
        if len(steps) < k:
            continue
        values = r[steps, slot]
        windows = np.lib.stride_tricks.sliding_window_view(values, k)
        out[steps[k - 1 :], slot] = windows.min(axis=1)
    return out


@dataclass(frozen=True)
class Blocks:
    """GPU-hour block maxima of the healthy opening levels, in logit space, with their nodes."""

    z: np.ndarray  # (blocks,) logit of the block's highest opening level
    node: np.ndarray  # (blocks,) position of the block's node in the period
    node_gpu_days: np.ndarray  # (nodes,) healthy GPU-days per node

    @property
    def gpu_days(self) -> float:
        """Healthy GPU-days of the history."""
        return float(self.node_gpu_days.sum())


def block_maxima(period: ScoredPeriod, healthy: np.ndarray, k: int) -> Blocks:
    """The healthy opening levels' maximum per GPU and hour (blocks with no healthy step left out)."""
    levels = np.where(healthy, opening_levels(period.scores["model"], period.present, k), -np.inf)
    per_block = max(1, round(BLOCK_S / period.cadence_s))
    steps, slots = levels.shape
    pad = (-steps) % per_block
    padded = np.concatenate([levels, np.full((pad, slots), -np.inf)]) if pad else levels
    seen = np.concatenate([healthy, np.zeros((pad, slots), dtype=bool)]) if pad else healthy
    maxima = padded.reshape(-1, per_block, slots).max(axis=1)
    any_seen = seen.reshape(-1, per_block, slots).any(axis=1)
    # A block whose healthy steps all lack k scores yet still counts, at the lowest level.
    maxima = np.where(any_seen & np.isinf(maxima), 0.0, maxima)
    node_of_slot = np.arange(slots) // period.gpus_per_node
    node = np.broadcast_to(node_of_slot, maxima.shape)[any_seen]
    rows = healthy.reshape(steps, len(period.nodes), period.gpus_per_node).sum(axis=(0, 2))
    return Blocks(_logit(maxima[any_seen]), node, rows * period.cadence_s / 86_400.0)


def tail_level(z: np.ndarray, gpu_days: float, budget: float, scale_quantile: float | None = None) -> float:
    """The logit level at which the exponential tail fitted to block maxima `z` exceeds as often as
    `budget` per 1,000 GPU-days over `gpu_days`; with `scale_quantile`, the tail's scale at that
    one-sided upper bound (chi-square) instead of its estimate."""
    n = len(z)
    allowed = budget * gpu_days / 1000.0  # exceeding blocks the budget allows on this history
    ranked = np.sort(z)[::-1]
    tail = min(n - 1, max(MIN_TAIL, math.ceil(TAIL_SHARE * n)))
    if allowed >= tail:  # the budget reaches below the fitted tail: the empirical quantile is enough
        return float(ranked[min(n - 1, math.floor(allowed))])
    u = float(ranked[tail])
    scale = max(float(np.mean(ranked[:tail] - u)), 1e-6)
    if scale_quantile is not None:
        scale *= 2 * tail / float(chi2.ppf(1.0 - scale_quantile, 2 * tail))
    return u + scale * math.log(tail / allowed)


@dataclass(frozen=True)
class TailEstimate:
    """The threshold's three candidates (risk, not logit) and the highest, which is taken."""

    point: float
    scale_upper: float
    bootstrap_upper: float

    @property
    def threshold(self) -> float:
        """The highest of the three."""
        return max(self.point, self.scale_upper, self.bootstrap_upper)


def tail_estimate(blocks: Blocks, budget: float, seed: int = 0) -> TailEstimate:
    """The threshold from the block maxima's tail (see the module docstring, steps 3 and 4)."""
    if len(blocks.z) < MIN_BLOCKS:
        raise CalibrationError(
            f"{len(blocks.z)} healthy GPU-hours scored; calibration needs at least {MIN_BLOCKS} "
            "(a longer history, or more nodes)"
        )
    point = tail_level(blocks.z, blocks.gpu_days, budget)
    scale_upper = tail_level(blocks.z, blocks.gpu_days, budget, CONFIDENCE)
    nodes = len(blocks.node_gpu_days)
    levels = []
    for weights in resample_weights(nodes, RESAMPLES, seed):
        repeats = weights[blocks.node].astype(np.int64)
        z = np.repeat(blocks.z, repeats)
        if len(z) >= MIN_TAIL + 1:
            levels.append(tail_level(z, float(weights @ blocks.node_gpu_days), budget))
    boot = float(np.percentile(levels, 100 * CONFIDENCE)) if levels else point
    return TailEstimate(_sigmoid(point), _sigmoid(scale_upper), _sigmoid(boot))


@dataclass(frozen=True)
class FalseAlarms:
    """False alarms at one threshold on the history: the count, the rate and its upper bound."""

    threshold: float
    count: int
    incidents: int
    gpu_days: float

    @property
    def per_1000_gpu_days(self) -> float:
        """The rate observed."""
        return 1000.0 * self.count / self.gpu_days if self.gpu_days > 0 else math.nan

    @property
    def upper_95(self) -> float:
        """The exact one-sided 95% Poisson upper bound of the rate per 1,000 GPU-days (Garwood)."""
        if self.gpu_days <= 0:
            return math.nan
        return 1000.0 * float(chi2.ppf(CONFIDENCE, 2 * (self.count + 1))) / 2.0 / self.gpu_days

    def to_json(self) -> dict[str, float | int]:
        """The figures as reported."""
        return {
            "threshold": self.threshold,
            "false_alarms": self.count,
            "incidents": self.incidents,
            "gpu_days": self.gpu_days,
            "per_1000_gpu_days": self.per_1000_gpu_days,
            "upper_95_per_1000_gpu_days": self.upper_95,
        }


def false_alarms(
    period: ScoredPeriod,
    failures: FailureLog,
    thresholds: list[float],
    policy: Any,
    periods: PredictionPeriods = DEFAULT_PERIODS,
) -> list[FalseAlarms]:
    """False alarms (premature + false; every incident when the log is empty) at each threshold,
    through the service's alert tracker."""
    found = incidents(period, "model", thresholds, policy, NODE_LEVEL_MODES)
    out = []
    for threshold, these in zip(thresholds, found, strict=True):
        judged = judge(period, failures, these, periods)
        count = sum(1 for j in judged if j.outcome in (Outcome.PREMATURE, Outcome.FALSE))
        out.append(FalseAlarms(threshold, count, len(these), period.gpu_days))
    return out


def checked_threshold(
    period: ScoredPeriod,
    failures: FailureLog,
    healthy: np.ndarray,
    start: float,
    budget: float,
    policy: Any,
    periods: PredictionPeriods = DEFAULT_PERIODS,
) -> float:
    """The lowest threshold from `start` up whose false alarms on the history stay within what the
    budget allows there (rounded down): `start` itself, or just above an offending opening level."""
    allowed = math.floor(budget * period.gpu_days / 1000.0)
    levels = opening_levels(period.scores["model"], period.present, policy.k)[healthy]
    above = np.unique(levels[np.isfinite(levels) & (levels >= start)])[::-1][:300][::-1]
    candidates = sorted({min(start, MAX_THRESHOLD), *(min(float(v) + 1e-9, MAX_THRESHOLD) for v in above)})
    for result in false_alarms(period, failures, candidates, policy, periods):
        if result.count <= allowed:
            return result.threshold
    return MAX_THRESHOLD


# -- the report -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """What `faultcast calibrate` found (`to_json` is its --json output)."""

    model_dir: Path
    data_dir: Path
    budget: float
    budget_source: str
    threshold: float
    model_threshold: float
    serving_threshold: float  # what the model serves now (threshold.json's, or the trained one)
    estimate: TailEstimate
    met: bool  # a threshold under MAX_THRESHOLD holds the budget
    at_threshold: FalseAlarms
    at_model_threshold: FalseAlarms
    failures: int
    labelled: bool
    healthy_gpu_days: float
    recall: float | None  # the twin worlds' recall at the threshold (None: the model has no curve)
    model_recall: float | None
    recall_basis: dict[str, object] | None
    drift: dict[str, float] | None  # PSI per group (None: no reference)
    drift_top: dict[str, str]  # per group, the feature with the largest PSI
    drift_note: str
    missing_groups: tuple[str, ...]  # groups with no value at all in the history
    notes: tuple[str, ...]
    calibrated_at: str

    def basis(self) -> dict[str, object]:
        """What threshold.json records: where the threshold came from."""
        return {
            "source": SOURCE,
            "data": str(self.data_dir),
            "gpu_days": self.at_threshold.gpu_days,
            "healthy_gpu_days": self.healthy_gpu_days,
            "budget_per_1000_gpu_days": self.budget,
            "labelled": self.labelled,
            "failures": self.failures,
            "false_alarms": self.at_threshold.count,
            "false_alarms_upper_95_per_1000_gpu_days": self.at_threshold.upper_95,
            "model_threshold": self.model_threshold,
            "calibrated_at": self.calibrated_at,
            "calibrated_at_unix_s": dt.datetime.fromisoformat(self.calibrated_at).timestamp(),
        }

    def to_json(self) -> dict[str, Any]:
        """Every figure, JSON-ready (NaN as null)."""
        out: dict[str, Any] = {
            "model": str(self.model_dir),
            "data": str(self.data_dir),
            "budget_per_1000_gpu_days": self.budget,
            "budget_source": self.budget_source,
            "threshold": self.threshold,
            "budget_met": self.met,
            "model_threshold": self.model_threshold,
            "serving_threshold": self.serving_threshold,
            "estimate": {
                "point": self.estimate.point,
                "scale_upper_95": self.estimate.scale_upper,
                "bootstrap_upper_95": self.estimate.bootstrap_upper,
            },
            "history": {
                "gpu_days": self.at_threshold.gpu_days,
                "healthy_gpu_days": self.healthy_gpu_days,
                "failures": self.failures,
                "labelled": self.labelled,
            },
            "false_alarms_at_threshold": self.at_threshold.to_json(),
            "false_alarms_at_model_threshold": self.at_model_threshold.to_json(),
            "expected_recall": {
                "at_threshold": self.recall,
                "at_model_threshold": self.model_recall,
                "basis": self.recall_basis,
            },
            "drift": {
                "psi_by_group": self.drift,
                "top_feature": self.drift_top,
                "note": self.drift_note,
            },
            "missing_groups": list(self.missing_groups),
            "notes": list(self.notes),
            "calibrated_at": self.calibrated_at,
        }
        safe: dict[str, Any] = _json_safe(out)
        return safe


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _budget(model: FaultModel, budget: float | None) -> tuple[float, str]:
    if budget is not None:
        if not (math.isfinite(budget) and budget > 0):
            raise CalibrationError(f"the budget must be a positive number of false alarms, got {budget}")
        return budget, "--budget"
    trained = (model.card.train_config or {}).get("false_alarm_budget")
    if isinstance(trained, int | float) and not isinstance(trained, bool) and trained > 0:
        return float(trained), "the model's training budget"
    return 2.0, "the default (the model records no training budget)"


def _drift(
    model_dir: Path, model: FaultModel, rows: np.ndarray
) -> tuple[dict[str, float] | None, dict[str, str], str]:
    try:
        reference = drift.load_reference(model_dir)
    except drift.DriftReferenceError as exc:
        return None, {}, f"unknown: {exc}"
    if reference is None:
        return None, {}, f"unknown: {model_dir} has no {drift.FILE} (the model was trained before references)"
    if reference.names != model.feature_names:
        return None, {}, f"unknown: {drift.FILE} was built for other features than the model's"
    if len(rows) == 0:
        return None, {}, "unknown: no row scored"
    psi = drift.psi_by_feature(reference, rows)
    top = {}
    for group, index in reference.groups().items():
        values = psi[index]
        if np.isfinite(values).any():
            top[group] = reference.names[index[int(np.nanargmax(values))]]
    by_group = drift.psi_by_group(reference, rows)
    return by_group, top, f"PSI per group: the largest of its features' (over {len(rows):,} sampled rows)"


def _missing_groups(names: tuple[str, ...], rows: np.ndarray) -> tuple[str, ...]:
    if len(rows) == 0:
        return ()
    absent = np.isnan(rows).all(axis=0)
    by_group: dict[str, list[bool]] = {}
    for name, gone in zip(names, absent.tolist(), strict=True):
        by_group.setdefault(drift.feature_group(name), []).append(gone)
    return tuple(g for g in drift.GROUPS if g in by_group and all(by_group[g]))


def calibrate(
    model_dir: Path,
    data_dir: Path,
    *,
    failures_path: Path | None = None,
    budget: float | None = None,
    periods: PredictionPeriods = DEFAULT_PERIODS,
    seed: int = 0,
    now: dt.datetime | None = None,
    history: History | None = None,
) -> Calibration:
    """Score `data_dir` with the model in `model_dir` and choose the serving threshold (see the module
    docstring). `failures_path`: a failure log (the data's failures.csv columns) to use instead of
    the data's own. `history`: `data_dir`'s telemetry already scored with this model and `seed`
    (`score_history`), not scored again; scoring reads no failure log, so the log still comes from
    `data_dir` or `failures_path`. Raises ModelError, DataError or CalibrationError saying what is
    wrong."""
    model = load(model_dir)
    dataset = open_dataset(data_dir)
    if failures_path is not None:
        dataset = replace(dataset, failures=read_failures(failures_path, dataset.nodes))
    chosen_budget, budget_source = _budget(model, budget)
    if history is None:
        history = score_history(dataset, model, seed)
    period, failures = history.period, dataset.failures
    healthy = healthy_mask(period, failures, periods)
    blocks = block_maxima(period, healthy, model.policy.k)
    estimate = tail_estimate(blocks, chosen_budget, seed)
    start = min(estimate.threshold, MAX_THRESHOLD)
    threshold = checked_threshold(period, failures, healthy, start, chosen_budget, model.policy, periods)
    trained = model.card.threshold
    at, own = false_alarms(period, failures, [threshold, trained], model.policy, periods)
    labelled = len(failures) > 0
    curve_note = None
    try:
        curve = recall_curve.read_curve(model_dir)
    except recall_curve.RecallCurveError as exc:
        curve, curve_note = None, str(exc)
    psi, top, drift_note = _drift(model_dir, model, history.rows)
    notes = []
    if not labelled:
        notes.append(
            "no failure in the log: every incident on the history counts as a false alarm (conservative: "
            "an incident a failure followed counts against the budget too)"
        )
    if threshold >= MAX_THRESHOLD:
        notes.append(
            f"no threshold holds {chosen_budget:g} false alarms per 1,000 GPU-days on this history: the one "
            "written never alerts in practice; look at the drift below, retrain, or raise --budget"
        )
    if dataset.cadence_s != model.feature_config.cadence_s:
        notes.append(
            f"the data's cadence is {dataset.cadence_s:g} s, the model's {model.feature_config.cadence_s:g} s"
        )
    if curve_note:
        notes.append(f"expected recall unknown: {curve_note}")
    stamp = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds")
    return Calibration(
        model_dir=model_dir,
        data_dir=data_dir,
        budget=chosen_budget,
        budget_source=budget_source,
        threshold=threshold,
        model_threshold=trained,
        serving_threshold=model.threshold,
        estimate=estimate,
        met=threshold < MAX_THRESHOLD,
        at_threshold=at,
        at_model_threshold=own,
        failures=len(failures),
        labelled=labelled,
        healthy_gpu_days=blocks.gpu_days,
        recall=None if curve is None else curve.recall_at(threshold),
        model_recall=None if curve is None else curve.recall_at(trained),
        recall_basis=None if curve is None else curve.basis,
        drift=psi,
        drift_top=top,
        drift_note=drift_note,
        missing_groups=_missing_groups(model.feature_names, history.rows),
        notes=tuple(notes),
        calibrated_at=stamp,
    )


def apply(calibration: Calibration) -> Path:
    """Write threshold.json beside the model with the calibrated threshold and its basis: the service
    serves it from its next start or reload. A protect tier the file had is kept while it stays below
    the new threshold (calibration moves the alert threshold only); one that would not is dropped,
    with a warning."""
    from faultcast.model.threshold_file import ThresholdFileError, read, write

    model = load(calibration.model_dir)
    digest = model.card.files["model.txt"]
    try:
        before = read(calibration.model_dir, digest)
    except ThresholdFileError:
        before = None  # another model's, or damaged: replaced whole
    protect = before.protect_threshold if before is not None else None
    if protect is not None and protect >= calibration.threshold:
        log.warning(
            "the protect tier's threshold %g is not below the calibrated threshold %g: the tier is dropped",
            protect,
            calibration.threshold,
        )
        protect = None
    return write(calibration.model_dir, calibration.threshold, digest, calibration.basis(), protect)


def summary(c: Calibration) -> str:
    """The readable report."""

    def pct(value: float | None) -> str:
        return (
            "unknown (the model has no recall curve)"
            if value is None
            else ("unknown (above the curve's thresholds)" if math.isnan(value) else f"{100 * value:.0f}%")
        )

    def alarms(f: FalseAlarms) -> str:
        return (
            f"{f.count} false alarm(s) of {f.incidents} incident(s) = {f.per_1000_gpu_days:.2f} per 1,000 "
            f"GPU-days (95% upper bound {f.upper_95:.1f})"
        )

    lines = [
        f"calibrated {c.model_dir} on {c.data_dir}: {c.at_threshold.gpu_days:,.1f} GPU-days scored "
        f"({c.healthy_gpu_days:,.1f} healthy), "
        + (f"{c.failures} failure(s) in the log" if c.labelled else "unlabelled (no failure in the log)"),
        f"budget: {c.budget:g} false alarms per 1,000 GPU-days ({c.budget_source})",
        f"threshold: {c.threshold:.4f} (the model's own {c.model_threshold:.4f}; serving now {c.serving_threshold:.4f})"
        + ("" if c.met else "  BUDGET NOT MET"),
        f"  from the healthy scores' tail: estimate {c.estimate.point:.4f}, scale upper 95% "
        f"{c.estimate.scale_upper:.4f}, node bootstrap 95% {c.estimate.bootstrap_upper:.4f}",
        f"on the history at {c.threshold:.4f}: {alarms(c.at_threshold)}",
        f"on the history at the model's own {c.model_threshold:.4f}: {alarms(c.at_model_threshold)}",
        f"expected recall (twin worlds): {pct(c.recall)} at {c.threshold:.4f}, "
        f"{pct(c.model_recall)} at the model's own",
    ]
    if c.drift is None:
        lines.append(f"drift: {c.drift_note}")
    else:
        lines.append(f"drift ({c.drift_note}; 0.1 watch, 0.25 major):")
        for group, psi in sorted(c.drift.items(), key=lambda kv: -kv[1]):
            flag = "  MAJOR" if psi > drift.MAJOR else ("  watch" if psi > drift.WATCH else "")
            lines.append(f"  {group:14s} {psi:7.3f}  ({c.drift_top.get(group, '')}){flag}")
    lines.append(
        "missing from the data: " + (", ".join(c.missing_groups) if c.missing_groups else "no feature group")
    )
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def read_basis(basis: Mapping[str, object]) -> float | None:
    """When a threshold.json basis says calibrate wrote it: its time (unix seconds), else None."""
    if basis.get("source") != SOURCE:
        return None
    value = basis.get("calibrated_at_unix_s")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
