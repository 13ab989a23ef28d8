"""Training: labelled rows from failure logs, LightGBM with early stopping, Platt calibration at the
real failure rate, a failure-mode head and a time-to-failure head, the logistic baseline, and the
alert threshold chosen to meet a false-alarm budget on validation.

Across worlds (several datasets, typically twins drawn from the priors of `faultcast.sim.world`:
domain randomisation), the last dataset is the validation world: early stopping, calibration and the
thresholds are all judged on a world the booster never saw, so every choice is leave-world-out. The
model is then evaluated on further worlds (`faultcast evaluate`), never on its own.

On one dataset the split is by time and by node: a quarter of the nodes (chosen by seed) and the last
third of the days are held out for `faultcast evaluate`; training sees only the other nodes' earlier
days, of which the last fifth is the validation slice. That flatters the model (its own world), and
the evaluation says so.

Risk is the probability at the real failure rate: a twin at acceleration A fails A times as often as
hardware does, so the calibration counts each of its failures 1/A times (the prior odds fall A-fold;
the evidence in the features does not change). A risk of 0.3 means three in ten.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import math
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
from sklearn.linear_model import LogisticRegression

from faultcast.model.artifact import TTF_BUCKETS_S, FaultModel, Logistic, load, save
from faultcast.model.evaluation.drift import build_reference, save_reference
from faultcast.model.evaluation.evaluate import (
    DCGM_DEFAULT_MISSING,
    LOGISTIC_FLOOR,
    MODE_FLOOR,
    WARMUP_S,
    score_period,
)
from faultcast.model.evaluation.outcomes import (
    PredictionPeriods,
    ScoredPeriod,
    catches,
    choose_threshold_pooled,
    incidents,
    predictable_counts,
)
from faultcast.model.evaluation.rules import RulesBaseline
from faultcast.model.evaluation.world_pass import map_worlds
from faultcast.model.features.engine import (
    ERROR_GROUPS,
    GPU_INPUTS,
    NODE_INPUTS,
    NODE_RATES,
    FeatureConfig,
    FeatureEngine,
)
from faultcast.model.features.offline import (
    Censored,
    DataError,
    Dataset,
    FailureLog,
    Labels,
    Sink,
    Step,
    replay,
)
from faultcast.model.features.parquet_parts import part_files
from faultcast.model.incidents import AlertPolicy
from faultcast.model.manifest import (
    FalseAlarms,
    JsonScalar,
    ModelError,
    SplitRecord,
    Timings,
    TrainingData,
    TrainingMetrics,
    ValidationRecall,
)
from faultcast.model.training import rows_cache
from faultcast.model.training.needs import shortfall, slice_failures, trained_on, world_shortfall
from faultcast.model.training.recall_curve import write_curve
from faultcast.modes import NODE_LEVEL_MODES

log = logging.getLogger(__name__)


_HEAD_ROUNDS = 60  # rounds of the mode and time-to-failure heads
_REFERENCE_ROWS = 500_000  # fit rows the drift reference's deciles are taken over, at most


@dataclass(frozen=True)
class TrainConfig:
    """Training's settings; recorded in the model's manifest as `train_config`."""

    horizon_s: float = 1800.0
    cadence_s: float | None = None  # default: the data's interval
    negative_rate: float = 0.02  # share of negative rows kept (weighted back up)
    # Share of the hard negatives kept: healthy rows on which a shipped rule fires (look-alikes). Off
    # by default (at most negative_rate); bench/worlds.sh keeps 25% across worlds (docs/model.md).
    hard_negative_rate: float = 0.0
    # Rows up to this long before a failure a warning could precede, but beyond the horizon, are left
    # out (neither positive nor negative): a precursor already running there looks like the positives,
    # and a "no failure within 30 min" label taught the model to alert late. 0: every row labelled.
    ignore_before_failure_s: float = 0.0
    seed: int = 0
    test_node_fraction: float = 0.25
    test_time_fraction: float = 1 / 3
    validation_fraction: float = 0.2
    # Per 1,000 GPU-days on validation; a false alarm is an incident not followed by its failure
    # within the prediction period (model/evaluation/outcomes.py).
    false_alarm_budget: float = 0.5
    warning_s: float = 300.0  # minimal warning time
    prediction_period_s: float = 7200.0
    k: int = 2
    clear_steps: int = 10
    hold_ratio: float = 0.5
    dark_steps: int = 3
    group_dropout: float = 0.3  # share of training rows that lose the metrics dcgm-exporter lacks
    num_boost_round: int = 800
    learning_rate: float = 0.05
    # More errors never mean less risk: the error-rate features are held monotone (physics, and what
    # keeps a booster from learning one world's quirks of its healthy background).
    monotone_errors: bool = True
    # Feature names (fnmatch patterns) the booster may not use: e.g. absolute readings, to test what
    # transfers to unseen worlds. The columns stay in the schema (the service computes them anyway).
    exclude: tuple[str, ...] = ()
    # The failure rate of the data relative to hardware's; None: from each dataset's manifest.
    acceleration: float | None = None
    # Where sampled rows of each world are kept between runs (trying settings that do not change the
    # rows: the booster's, the exclusions); None: not kept.
    rows_cache: str | None = None
    # The seed of the negatives' sampling; None: `seed`. Fixed while `seed` varies, it measures what the
    # booster's own randomness does on the same rows (the threshold's spread over seeds).
    sample_seed: int | None = None
    # LightGBM parameters of the risk booster over `_lgb_params`, as (name, value) pairs: what a
    # leave-world-out comparison of settings varies. Across many worlds the comparison chose
    # num_leaves 15, min_data_in_leaf 200, lambda_l2 10, feature_fraction 0.5 (docs/model.md;
    # bench/worlds.sh passes them); they are not the default because 200 rows a leaf starves a small
    # training set (one small world's model then missed textbook failures).
    booster_params: tuple[tuple[str, float | int | str], ...] = ()
    # Across worlds: how many of the last datasets validate, pooled (calibration, thresholds, the
    # validation recall): a choice made on one world of a few dozen failures swings with its seed.
    validation_worlds: int = 1
    # Across worlds: early stopping by cross-validation over this many groups of the training worlds
    # (each group held out in turn; the booster is then refit on all of them for the folds' mean
    # best iteration). 1: early stopping on the validation worlds.
    folds: int = 1
    # Worlds replayed at once by local processes (without a Dask client; with one, its workers do).
    jobs: int = 1
    # Weigh each failure mode's positive rows alike in the booster's ranking (capped at 10x): a mode with a
    # handful of failures otherwise gets a handful of leaves, and its risk never reaches a threshold.
    balance_modes: bool = False
    # Stack the booster with the logistic baseline and serve the blend where it catches more on the
    # validation worlds at the same budget (off: the booster alone).
    blend: bool = True
    # Across worlds: each dataset's rows weighed by this, in order (empty: 1 each). `faultcast retrain`
    # weighs the twin worlds it learns beside (the prior) against the fleet's own history.
    world_weights: tuple[float, ...] = ()
    # A model directory whose risk booster training continues (LightGBM's init_model: the new trees
    # fit what it misses on these rows): the other kind of prior `faultcast retrain --warm-start`
    # gives, beside or instead of weighted twin rows. None: a fresh booster.
    warm_start: str | None = None
    # The node-history features (model/features/history.py): each GPU's and node's own failures before
    # each row, from the data's failure log (online: the service's label log). Off: the features, the
    # schema and the recorded config as before.
    node_history: bool = False


@dataclass(frozen=True)
class Split:
    """The held-out nodes and days (indexes into Dataset.nodes, unix seconds)."""

    train_nodes: tuple[int, ...]
    test_nodes: tuple[int, ...]
    validation_start_s: float
    train_end_s: float  # == the start of the held-out period

    def to_json(self, dataset: Dataset) -> dict[str, object]:
        """The split as manifest.json holds it (the notebooks read this form)."""
        return asdict(self.record(dataset)) | {
            "train_nodes": [dataset.nodes[n] for n in self.train_nodes],
            "test_nodes": [dataset.nodes[n] for n in self.test_nodes],
        }

    def record(self, dataset: Dataset) -> SplitRecord:
        """The split as the manifest records it: nodes by name."""
        return SplitRecord(
            train_nodes=tuple(dataset.nodes[n] for n in self.train_nodes),
            test_nodes=tuple(dataset.nodes[n] for n in self.test_nodes),
            validation_start_unix_s=self.validation_start_s,
            test_start_unix_s=self.train_end_s,
        )


def make_split(dataset: Dataset, config: TrainConfig) -> Split:
    """The seeded split (see the module docstring); ValueError when there are too few nodes to hold any out."""
    rng = np.random.default_rng(config.seed)
    nodes = np.arange(len(dataset.nodes))
    test_count = max(1, round(len(nodes) * config.test_node_fraction))
    if test_count >= len(nodes):
        raise ValueError(f"{len(nodes)} nodes cannot be split into training and held-out nodes")
    test = np.sort(rng.choice(nodes, test_count, replace=False))
    train = np.setdiff1d(nodes, test)
    train_end = dataset.start_s + (1.0 - config.test_time_fraction) * (dataset.end_s - dataset.start_s)
    validation_start = dataset.start_s + (1.0 - config.validation_fraction) * (train_end - dataset.start_s)
    return Split(tuple(int(n) for n in train), tuple(int(n) for n in test), validation_start, train_end)


@dataclass
class Rows:
    """Sampled training rows."""

    features: list[np.ndarray] = field(default_factory=list)
    label: list[np.ndarray] = field(default_factory=list)
    weight: list[np.ndarray] = field(default_factory=list)
    time_s: list[np.ndarray] = field(default_factory=list)
    ttf_s: list[np.ndarray] = field(default_factory=list)
    mode: list[np.ndarray] = field(default_factory=list)

    def stack(self) -> dict[str, np.ndarray]:
        """Each column's arrays concatenated (empty when no row was kept)."""
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in vars(self).items()}


class _Sampler:
    """Keeps every positive row and a seeded random share of the negatives, weighted back up. Hard
    negatives (a healthy row on which a rule operators use fires: the look-alikes of a failing part)
    are kept at `hard_rate`, so the booster sees many of the rows it must tell apart."""

    def __init__(
        self,
        labels: Labels,
        nodes: Sequence[int],
        gpus_per_node: int,
        rate: float,
        seed: int,
        hard_rate: float = 0.0,
        names: Sequence[str] = (),
        ignored: Labels | None = None,
        censored: Censored | None = None,
    ) -> None:
        self.labels, self.nodes, self.g, self.rate = labels, tuple(nodes), gpus_per_node, rate
        self.ignored = ignored  # failures this far ahead leave the row out (unless it is positive)
        self.censored = censored  # spans whose label nobody knows leave the row out, positive or not
        self.hard_rate = max(hard_rate, rate)
        self.rules = RulesBaseline(names) if hard_rate > rate else None
        self.rng = np.random.default_rng(seed)
        self.rows = Rows()
        self.node_modes = np.array(sorted(m.value for m in NODE_LEVEL_MODES), dtype=object)

    def __call__(self, step: Step) -> None:
        positive, ttf, mode = self.labels.at(step.time_s, self.nodes, self.g)
        rate = np.full(len(positive), self.rate)
        if self.rules is not None:
            rate = np.where(self.rules.score(step.features) > 0, self.hard_rate, rate)
        keep = step.present & (positive | (self.rng.random(len(positive)) < rate))
        if self.ignored is not None:
            keep &= positive | ~self.ignored.at(step.time_s, self.nodes, self.g)[0]
        if self.censored is not None and len(self.censored.node):
            keep &= ~self.censored.at(step.time_s, self.nodes, self.g)
        if not keep.any():
            return
        r = self.rows
        r.features.append(step.features[keep].astype(np.float32))
        r.label.append(positive[keep])
        # A node-level failure labels all the node's GPUs: weigh those rows down so that each
        # failure, not each GPU row, counts once (else node-level modes drown the GPU-level ones).
        node_level = np.isin(mode[keep], self.node_modes)
        r.weight.append(np.where(positive[keep], np.where(node_level, 1.0 / self.g, 1.0), 1.0 / rate[keep]))
        r.time_s.append(np.full(int(keep.sum()), step.time_s))
        r.ttf_s.append(ttf[keep])
        r.mode.append(mode[keep])


def dcgm_missing_columns(config: FeatureConfig) -> np.ndarray:
    """Which feature columns go missing without the inputs dcgm-exporter's defaults lack.

    Found empirically: run the engine on synthetic data with and without those inputs."""
    rng = np.random.default_rng(0)
    full, masked = FeatureEngine(config, 1), FeatureEngine(config, 1)
    n = config.gpus_per_node
    mask = np.array([c in DCGM_DEFAULT_MISSING for c in GPU_INPUTS])
    node_mask = np.array([c in DCGM_DEFAULT_MISSING for c in NODE_INPUTS])
    lost = np.zeros(len(full.names), dtype=bool)
    for step in range(config.window_steps()[-1] + 3):
        gpu = rng.uniform(1, 100, (n, len(GPU_INPUTS))) + step * 10
        node = rng.uniform(1, 100, (1, len(NODE_INPUTS))) + step * 10
        a = full.update(step, gpu, node, np.zeros(n))
        gpu[:, mask] = np.nan
        node[:, node_mask] = np.nan
        b = masked.update(step, gpu, node, np.zeros(n))
        lost |= (np.isnan(b) & ~np.isnan(a)).any(axis=0)
    return np.nonzero(lost)[0]


def _lgb_params(config: TrainConfig, **extra: Any) -> dict[str, Any]:
    return {
        "learning_rate": config.learning_rate, "num_leaves": 31, "min_data_in_leaf": 40,
        "feature_fraction": 0.8, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
        "seed": config.seed, "num_threads": 2, "verbose": -1, "deterministic": True, **extra,
    }  # fmt: skip  # LightGBM's parameters packed, not one per line


def train(
    data: Dataset | Sequence[Dataset],
    out: Path,
    config: TrainConfig = TrainConfig(),
    *,
    dask_client: Any = None,
) -> FaultModel:
    """Train on `data` (one dataset, or several worlds: the last validates), write the artifact to
    `out`, and return the model. With a Dask client (distributed.Client) the booster trains across
    the cluster's workers through lightgbm.dask. Raises ValueError when the training period holds too
    few failures. Seeded: the same data and config give the same model."""
    started = time.perf_counter()
    datasets = [data] if isinstance(data, Dataset) else list(data)
    if not datasets:
        raise ValueError("no training data")
    dataset = datasets[-1]  # the validation world (or the only dataset)
    features = FeatureConfig(
        cadence_s=config.cadence_s or dataset.cadence_s,
        gpus_per_node=dataset.gpus_per_node,
        node_history=config.node_history,
    )
    if len(datasets) > 1 and not 1 <= config.validation_worlds < len(datasets):
        raise ValueError(
            f"{config.validation_worlds} validation worlds of {len(datasets)}: at least one must train "
            "and one validate"
        )
    check_mode_factors(datasets, 1 if len(datasets) == 1 else config.validation_worlds)
    if len(datasets) == 1:
        split = make_split(dataset, config)
        rows, names = _sample(dataset, features, split, config)
        validating = [_Validation(dataset, split.train_nodes, split.validation_start_s, split.train_end_s)]
    else:
        split = Split(tuple(range(len(dataset.nodes))), (), dataset.start_s + WARMUP_S, dataset.end_s)
        rows, names = _sample_worlds(datasets, features, config, dask_client)
        validating = [
            _Validation(d, tuple(range(len(d.nodes))), d.start_s + WARMUP_S, d.end_s)
            for d in datasets[-config.validation_worlds :]
        ]
    timings = {"feature_build_s": time.perf_counter() - started}
    log.info(
        "%s",
        trained_on(rows.fit_failures, rows.validation_failures, sorted(set(rows.mode[rows.y & rows.fit]))),
    )

    t0 = time.perf_counter()
    dropped = dcgm_missing_columns(features)
    excluded = excluded_columns(names, config.exclude)
    booster, best, fold_best = _fit_risk(rows, names, dropped, excluded, config, dask_client)
    calibration = _calibrate(booster, rows)
    modes, mode_booster = _fit_mode_head(rows, names, config)
    model = FaultModel(
        booster=booster,
        calibration=calibration,
        mode_booster=mode_booster,
        modes=modes,
        ttf_booster=_fit_ttf_head(rows, names, config),
        feature_config=features,
        feature_names=names,
        horizon_s=config.horizon_s,
        threshold=1.0,
        policy=AlertPolicy(config.k, config.clear_steps, config.hold_ratio, config.dark_steps),
        logistic=_fit_logistic(rows.x[rows.fit], rows.y[rows.fit], rows.w[rows.fit], config.seed),
        logistic_threshold=1.0,
        dcgm_default_threshold=1.0,
    )
    timings["training_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    periods = PredictionPeriods(config.warning_s, config.prediction_period_s)
    false_alarms, validation, masked = _choose_thresholds(validating, model, config, periods, dask_client)
    served = _choose_blend(rows, model, validation, masked, config, periods) if config.blend else None
    if served is not None and served.blend:
        false_alarms = replace(
            false_alarms, model=served.false_alarms, model_dcgm_default=served.dcgm_false_alarms
        )
    validation_gpu_days = sum(period.gpu_days for period, _ in validation)
    validation_recall = _validation_recall(validation, model, periods)
    timings["threshold_selection_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    metrics = TrainingMetrics(
        training_rows=len(rows.y),
        training_positives=int(rows.y.sum()),
        best_iteration=int(best),
        trained_on="dask" if dask_client is not None else "local",
        validation_gpu_days=validation_gpu_days,
        prediction_periods=periods,
        validation_false_alarms_per_1000_gpu_days=false_alarms,
        dropped_columns_for_dcgm_default=tuple(names[i] for i in dropped),
        validation_recall_5min_predictable=validation_recall,
        fold_best_iterations=fold_best,
        served="blend" if served is not None and served.blend else "booster",
        validation_recall_booster=served.booster_recall if served is not None else None,
        validation_recall_blend=served.blend_recall if served is not None else None,
        validation_worlds=len(validating),
    )
    save(
        model,
        out,
        training_data=_training_data(datasets),
        split=split.record(dataset) if len(datasets) == 1 else None,
        train_config=_config_record(config),
        metrics=metrics,
        timings_s=Timings(**timings),
    )
    # What `faultcast calibrate` reads: the training rows' distribution (drift) and the recall to
    # expect at any threshold, measured on the validation world (or slice).
    kept = _reference_rows(rows.fit, config.seed)
    save_reference(build_reference(rows.x[kept], names, rows.w[kept]), out)
    thresholds, recall, counted = _recall_curve(validation, model, periods)
    if thresholds:
        basis = {
            "measured_on": ", ".join(str(v.dataset.path) for v in validating),
            "leave_world_out": len(datasets) > 1,
            "failures_with_precursor": counted,
            "warning_s": periods.warning_s,
            "prediction_period_s": periods.period_s,
        }
        write_curve(out, thresholds, recall, basis)
    log.info(
        "trained on %d rows (%d positive) in %.1f s; threshold %.4f",
        len(rows.y),
        rows.y.sum(),
        timings["total_s"],
        model.threshold,
    )
    return model


def acceleration_of(dataset: Dataset, config: TrainConfig) -> float:
    """How many times more often the data fails than hardware: the config's, else the manifest's, else 1."""
    if config.acceleration is not None:
        return config.acceleration
    value = dataset.manifest.get("acceleration")
    return float(value) if isinstance(value, int | float) and value >= 1 else 1.0


def excluded_columns(names: Sequence[str], patterns: Sequence[str]) -> np.ndarray:
    """The indexes of the feature columns matching any of the fnmatch `patterns`."""
    return np.array(
        [i for i, n in enumerate(names) if any(fnmatch.fnmatchcase(n, p) for p in patterns)], dtype=np.int64
    )


def monotone_constraints(names: Sequence[str]) -> list[int]:
    """LightGBM's monotone constraints: +1 for the hardware error-rate features (the error groups'
    rates, and their excess over the GPU's background and its node's), 0 elsewhere."""
    errors = tuple(f"{g}_" for g in ERROR_GROUPS) + tuple(f"node_{g}_" for g, _ in NODE_RATES)
    kinds = ("_rate", "_excess_", "_vs_node_")
    return [int(n.startswith(errors) and any(k in n for k in kinds)) for n in names]


@dataclass(frozen=True)
class _Sampled:
    """The sampled training rows, stacked, and which fall in the fit and the validation slices."""

    x: np.ndarray  # (rows, features) float32
    y: np.ndarray  # bool: a failure within the horizon
    w: np.ndarray  # weight: negatives weighted back up, node-level positives down
    ttf_s: np.ndarray  # time to the failure (positives)
    mode: np.ndarray  # the failure's mode (positives)
    fit: np.ndarray  # bool: before the validation slice
    val: np.ndarray  # bool: in the validation slice
    # Per row, the data's failure rate relative to hardware's (calibration counts its positives 1/A times).
    acceleration: np.ndarray
    # Per row, the index of the world (dataset) it came from; all 0 for one dataset.
    world: np.ndarray
    # Per row, how much more often than `acceleration` its failure's mode was drawn (1: not boosted;
    # negatives 1): its weight was divided by it, so each mode counts as at its plain rate.
    boost: np.ndarray
    # The failures, per mode, that label the fit and the validation slices' rows (model/training/needs.py).
    fit_failures: Counter[str] = field(default_factory=Counter)
    validation_failures: Counter[str] = field(default_factory=Counter)


def _sample(
    dataset: Dataset, features: FeatureConfig, split: Split, config: TrainConfig
) -> tuple[_Sampled, tuple[str, ...]]:
    """Replay the training nodes and period through the features, keeping the sampler's rows. Only
    the failures a warning could precede are labelled (FailureLog.learnable); thresholds are still
    judged against every failure."""
    labels = Labels(config.horizon_s, dataset.failures.learnable())
    names = FeatureEngine(features, 1).names
    sampler = _Sampler(
        labels,
        split.train_nodes,
        dataset.gpus_per_node,
        config.negative_rate,
        config.seed,
        config.hard_negative_rate,
        names,
        _ignored(dataset, config),
        dataset.censored,
    )
    engine = replay(dataset, features, sampler, nodes=split.train_nodes, end_s=split.train_end_s)
    rows = sampler.rows.stack()
    x, y, t = rows["features"], rows["label"].astype(bool), rows["time_s"]
    fit, val = t < split.validation_start_s, t >= split.validation_start_s
    fit_failures = slice_failures(y, t, rows["ttf_s"], rows["mode"], fit)
    val_failures = slice_failures(y, t, rows["ttf_s"], rows["mode"], val)
    if x.size == 0 or not y[val].any() or not y[fit].any():
        raise ValueError(
            shortfall(
                dataset,
                fit_failures,
                val_failures,
                len(split.train_nodes),
                split.validation_start_s - dataset.start_s,
                split.train_end_s - split.validation_start_s,
            )
        )
    sampled = _Sampled(
        x=x, y=y, w=rows["weight"], ttf_s=rows["ttf_s"], mode=rows["mode"], fit=fit, val=val,
        acceleration=np.full(len(y), acceleration_of(dataset, config)), world=np.zeros(len(y), dtype=np.int64),
        boost=np.ones(len(y)), fit_failures=fit_failures, validation_failures=val_failures,
    )  # fmt: skip
    return sampled, engine.names


def _ignored(dataset: Dataset, config: TrainConfig) -> Labels | None:
    """The failures whose approach leaves rows out of training (`ignore_before_failure_s`), or None."""
    if config.ignore_before_failure_s <= 0:
        return None
    return Labels(max(config.ignore_before_failure_s, config.horizon_s), dataset.failures.learnable())


def _after(start_s: float, sink: Sink) -> Sink:
    """`sink` for the steps from `start_s` on: rows before the windows and baselines fill are not kept."""

    def kept(step: Step) -> None:
        if step.time_s >= start_s:
            sink(step)

    return kept


def world_rows_key(dataset: Dataset, features: FeatureConfig, config: TrainConfig, seed: int) -> str:
    """The rows cache's key of one world's rows: the data, the feature schema, the horizon and the
    sampling seed (the rates are the file's name within it)."""
    schema = FeatureEngine(features, 1).schema_hash
    parts: list[object] = [
        str(dataset.path.resolve()), dataset.manifest.get("created"), dataset.manifest.get("world"),
        schema, config.horizon_s, seed,
    ]  # fmt: skip
    if config.ignore_before_failure_s > 0:  # other rows (and the keys of rows cached before it, kept)
        parts.append(["ignore_before_failure_s", config.ignore_before_failure_s])
    for name in ("telemetry.parquet", "network.parquet"):
        table = dataset.path / name
        if table.is_dir():  # a rolling archive grows in place: its files' names and sizes tell its data
            parts.append(
                [name, [(f.relative_to(table).as_posix(), f.stat().st_size) for f in part_files(table)]]
            )
            # and its labels change as the fleet's label log grows (a drawn world's never do)
            parts.append(["failures.csv", _file_digest(dataset.path / "failures.csv")])
    if (dataset.path / "censored.csv").is_file():
        parts.append(["censored.csv", _file_digest(dataset.path / "censored.csv")])
    return rows_cache.world_key(parts)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def _world_rows(
    dataset: Dataset, features: FeatureConfig, config: TrainConfig, seed: int
) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The sampler's rows over every node and day of one world after the warm-up, from the rows
    cache when it holds them for the same data, features and seed at these or higher rates (then
    thinned: model/training/rows_cache.py)."""
    names = FeatureEngine(features, 1).names
    rates = rows_cache.Rates.of(config.negative_rate, config.hard_negative_rate)
    key = world_rows_key(dataset, features, config, seed)
    cache = Path(config.rows_cache) if config.rows_cache else None
    found = rows_cache.find(cache, key, rates) if cache is not None else None
    if found is not None:
        path, held = found
        return rows_cache.thin(rows_cache.load(path), held, rates, seed), names
    labels = Labels(config.horizon_s, dataset.failures.learnable())
    nodes = tuple(range(len(dataset.nodes)))
    sampler = _Sampler(
        labels, nodes, dataset.gpus_per_node, config.negative_rate, seed, config.hard_negative_rate, names,
        _ignored(dataset, config), dataset.censored,
    )  # fmt: skip
    replay(dataset, features, _after(dataset.start_s + WARMUP_S, sampler))
    rows = sampler.rows.stack()
    if cache is not None:
        rows_cache.save(cache, key, rates, rows)
    return rows, names


def _sample_worlds(
    datasets: Sequence[Dataset], features: FeatureConfig, config: TrainConfig, dask_client: Any = None
) -> tuple[_Sampled, tuple[str, ...]]:
    """Every node and day of each world replayed through the features (one call per world, spread
    over local processes or a Dask cluster: model/evaluation/world_pass.py), the sampler's rows kept; the last
    `config.validation_worlds` worlds' rows validate, the others' fit."""
    base = config.seed if config.sample_seed is None else config.sample_seed
    calls = [(dataset, features, config, base + k) for k, dataset in enumerate(datasets)]
    results: list[tuple[dict[str, np.ndarray], tuple[str, ...]] | None] = list(
        map_worlds(_world_rows, calls, jobs=config.jobs, client=dask_client)
    )
    validating = len(datasets) - config.validation_worlds
    names = results[0][1] if results[0] is not None else ()
    sizes = []
    slices: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    for k, (dataset, result) in enumerate(zip(datasets, results, strict=True)):
        assert result is not None
        rows = result[0]
        label = rows["label"].astype(bool)
        found = slice_failures(label, rows["time_s"], rows["ttf_s"], rows["mode"], np.ones(len(label), bool))
        if rows["features"].size == 0 or not label.any():
            raise ValueError(world_shortfall(dataset, found, WARMUP_S))
        slices[k >= validating].update(found)
        sizes.append(len(rows["label"]))
        log.info("%s: %d rows, %d positive", dataset.path, sizes[-1], int(rows["label"].sum()))
    # The worlds' rows moved into one array world by world, each freed once copied: at 64 worlds the
    # features are gigabytes, and holding them twice (the parts and their concatenation) ran out of memory.
    first = results[0]
    assert first is not None
    kinds = {key: np.result_type(*(r[0][key].dtype for r in results if r is not None)) for key in first[0]}
    stack: dict[str, np.ndarray] = {}
    ends = np.cumsum(sizes)
    for k, end in enumerate(ends):
        result = results[k]
        assert result is not None
        for key, part in result[0].items():
            if key not in stack:
                stack[key] = np.empty((int(ends[-1]), *part.shape[1:]), dtype=kinds[key])
            stack[key][end - sizes[k] : end] = part
        results[k] = None
    val = np.repeat([k >= validating for k in range(len(datasets))], sizes)
    accel = np.repeat([acceleration_of(d, config) for d in datasets], sizes)
    world = np.repeat(np.arange(len(datasets), dtype=np.int64), sizes)
    y = stack["label"].astype(bool)
    boost = _boosts(datasets, world, y, stack["mode"])
    weight = stack["weight"]
    if (boost != 1.0).any():  # a boosted mode's rows weighted back to its plain rate
        weight = weight / boost
    if config.world_weights:
        if len(config.world_weights) != len(datasets) or not all(w > 0 for w in config.world_weights):
            raise ValueError(
                f"world_weights: one positive weight per dataset ({len(datasets)}), not {config.world_weights}"
            )
        weight = weight * np.repeat(np.asarray(config.world_weights, dtype=np.float64), sizes)
    sampled = _Sampled(
        x=stack["features"], y=y, w=weight, ttf_s=stack["ttf_s"],
        mode=stack["mode"], fit=~val, val=val, acceleration=accel, world=world, boost=boost,
        fit_failures=slices[0], validation_failures=slices[1],
    )  # fmt: skip
    return sampled, names


def mode_acceleration_of(dataset: Dataset) -> dict[str, float]:
    """The modes the data's generator drew more often than its acceleration, and by how much (the
    manifest's `mode_acceleration`, `faultcast simulate --mode-acceleration`); {} when none."""
    given = dataset.manifest.get("mode_acceleration") or {}
    if not isinstance(given, dict) or not all(
        isinstance(f, int | float) and math.isfinite(f) and f > 0 for f in given.values()
    ):
        raise DataError(f"{dataset.path}: manifest mode_acceleration must map modes to positive factors")
    return {str(mode): float(factor) for mode, factor in given.items()}


def check_mode_factors(datasets: Sequence[Dataset], validating: int) -> None:
    """Before any replay: every dataset's mode factors readable (DataError), and none in the last
    `validating` datasets, whose mode mix the choices read (calibration, thresholds, the validation
    recall)."""
    for k, dataset in enumerate(datasets):
        boosted = mode_acceleration_of(dataset)
        if boosted and k >= len(datasets) - validating:
            modes = ", ".join(f"{m} x{f:g}" for m, f in sorted(boosted.items()))
            raise ValueError(
                f"{dataset.path} draws some modes more often ({modes}): its failures validate (calibration, "
                "thresholds, recall); validate on data at plain rates"
            )


def _boosts(datasets: Sequence[Dataset], world: np.ndarray, y: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """Per row, the boost of its failure's mode in its world (1 for negatives and plain modes)."""
    boost = np.ones(len(y))
    for k, dataset in enumerate(datasets):
        for name, factor in mode_acceleration_of(dataset).items():
            boost[(world == k) & y & (mode == name)] = factor
    return boost


def mode_balance(modes: np.ndarray, positive: np.ndarray, cap: float = 10.0) -> np.ndarray:
    """Per row, the factor that gives every failure mode's positive rows the same total weight as the
    average mode's (negatives 1): rare modes up, common ones down, never more than `cap` up."""
    factor = np.ones(len(modes))
    names, counts = np.unique(modes[positive].astype(str), return_counts=True)
    if len(names) < 2:
        return factor
    mean = counts.mean()
    for name, count in zip(names, counts, strict=True):
        factor[positive & (modes.astype(str) == name)] = min(cap, mean / count)
    return factor


def world_folds(worlds: np.ndarray, folds: int) -> np.ndarray:
    """The fold of each row, from the world it came from: the training worlds dealt round-robin in
    their order into `folds` groups, so that every world's rows stay together."""
    order = {w: k for k, w in enumerate(dict.fromkeys(worlds.tolist()))}
    return np.array([order[w] % folds for w in worlds.tolist()], dtype=np.int64)


def _fit_risk(
    rows: _Sampled,
    names: tuple[str, ...],
    dropped: np.ndarray,
    excluded: np.ndarray,
    config: TrainConfig,
    dask_client: Any,
) -> tuple[lgb.Booster, int, tuple[int, ...]]:
    """The risk booster, its number of trees and, with folds, each fold's best iteration. Early
    stopping is on the validation slice, or with `config.folds` > 1 by cross-validation over groups
    of the training worlds: each group in turn is held out and the others fit until its average
    precision stops rising; the booster is then fit on every training world for the folds' mean."""
    x, y, w, fit, val = rows.x, rows.y, rows.w, rows.fit, rows.val
    # Feature-group dropout: some rows look like a cluster with only dcgm-exporter's default metrics.
    rng = np.random.default_rng(config.seed + 1)
    x_fit = x[fit]  # a copy already (boolean indexing): the dropout below changes it, not x
    blank = rng.random(len(x_fit)) < config.group_dropout
    x_fit[np.ix_(blank, dropped)] = np.nan
    x_fit[:, excluded] = np.nan  # a column that is always missing is never split on
    params = _lgb_params(
        config, objective="binary", metric="average_precision", **dict(config.booster_params)
    )
    if config.monotone_errors:
        params["monotone_constraints"] = monotone_constraints(names)
    # The booster learns to rank on the sampled rows as they are (negatives weighted 50x made a few
    # heavy rows decide the splits and stopped it after a handful of trees); the calibration
    # uses the full weights, so risks are still probabilities for the whole population.
    rank_w = np.where(y, w, 1.0)
    if config.balance_modes:
        rank_w = rank_w * mode_balance(rows.mode, y)
    if config.warm_start is not None:
        if config.folds > 1 or dask_client is not None:
            raise ValueError(
                "a warm start trains locally with early stopping on validation (folds 1, no Dask)"
            )
        prior = warm_start_booster(Path(config.warm_start), names)
        booster, best = _continued(
            prior, params, x_fit, y[fit], rank_w[fit], x[val], y[val], rank_w[val], config
        )
        return _trimmed(booster, best), best, ()
    if config.folds > 1:
        # Binned once (the rows then freed: the bins are a quarter of their size); each fold's sides
        # are subsets of it, no copy of the rows per fold.
        whole = lgb.Dataset(x_fit, y[fit], weight=rank_w[fit], feature_name=list(names), params=params)
        whole.construct()
        del x_fit
        return _fit_by_folds(whole, y[fit], rows.world[fit], params, config)
    if dask_client is not None:
        from faultcast.model.training.distributed import fit_on_dask

        booster, best = fit_on_dask(
            dask_client,
            x_fit,
            y[fit],
            rank_w[fit],
            x[val],
            y[val],
            rank_w[val],
            params,
            config.num_boost_round,
        )
        return booster, best, ()
    train_set = lgb.Dataset(x_fit, y[fit], weight=rank_w[fit], feature_name=list(names), params=params)
    train_set.construct()
    del x_fit  # LightGBM keeps its bins, not the rows: gigabytes at 64 worlds
    val_set = lgb.Dataset(x[val], y[val], weight=rank_w[val], reference=train_set)
    booster, best = _early_stopped(params, train_set, val_set, config)
    return _trimmed(booster, best), best, ()


def warm_start_booster(model_dir: Path, names: Sequence[str]) -> lgb.Booster:
    """The risk booster of the model in `model_dir`, to continue; ValueError when it cannot be loaded or
    reads other features than these rows hold (another feature schema)."""
    try:
        prior = load(model_dir)
    except ModelError as exc:
        raise ValueError(f"warm start: {exc}") from exc
    if list(prior.booster.feature_name()) != list(names):
        raise ValueError(
            f"warm start: {model_dir}'s booster reads {len(prior.booster.feature_name())} features, not "
            f"the {len(names)} of this feature schema: retrain it with this version first"
        )
    return prior.booster


def _continued(
    prior: lgb.Booster,
    params: dict[str, Any],
    x_fit: np.ndarray,
    y_fit: np.ndarray,
    w_fit: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    w_val: np.ndarray,
    config: TrainConfig,
) -> tuple[lgb.Booster, int]:
    """The prior booster boosted on: its trees kept, new ones fit to its residual on the fit rows until
    the validation rows' metric stops improving (best iteration counted from its first tree). The
    rows stay raw (LightGBM scores them with the prior to start from): a fleet's rows are few."""
    names = prior.feature_name()
    train_set = lgb.Dataset(
        x_fit, y_fit, weight=w_fit, feature_name=names, params=params, free_raw_data=False
    )
    val_set = lgb.Dataset(x_val, y_val, weight=w_val, reference=train_set, free_raw_data=False)
    booster = lgb.train(
        params,
        train_set,
        num_boost_round=config.num_boost_round,
        valid_sets=[val_set],
        init_model=prior,
        callbacks=[lgb.early_stopping(50, verbose=False)],
    )
    start = prior.current_iteration()
    best = int(booster.best_iteration or booster.current_iteration())
    log.info("warm start: %d trees of the prior, %d new", start, best - start)
    return booster, best


def _early_stopped(
    params: dict[str, Any], train_set: lgb.Dataset, check: lgb.Dataset, config: TrainConfig
) -> tuple[lgb.Booster, int]:
    """The booster fit on `train_set` until `check`'s metric stops improving, and its best iteration."""
    booster = lgb.train(
        params,
        train_set,
        num_boost_round=config.num_boost_round,
        valid_sets=[check],
        callbacks=[lgb.early_stopping(50, verbose=False)],
    )
    return booster, int(booster.best_iteration or config.num_boost_round)


def _fit_by_folds(
    whole: lgb.Dataset,
    y: np.ndarray,
    worlds: np.ndarray,
    params: dict[str, Any],
    config: TrainConfig,
) -> tuple[lgb.Booster, int, tuple[int, ...]]:
    """Early stopping by cross-validation over groups of worlds (see `_fit_risk`)."""
    if len(set(worlds.tolist())) < config.folds:
        raise ValueError(
            f"{config.folds} folds need at least {config.folds} training worlds; "
            f"there are {len(set(worlds.tolist()))}"
        )
    fold = world_folds(worlds, config.folds)
    best: list[int] = []
    for f in range(config.folds):
        held = fold == f
        if not y[held].any() or not y[~held].any():
            raise ValueError(f"fold {f} of {config.folds} has no failure a warning could precede on one side")
        part = whole.subset(np.nonzero(~held)[0].tolist())
        check = whole.subset(np.nonzero(held)[0].tolist())
        best.append(_early_stopped(params, part, check, config)[1])
        log.info("fold %d of %d: best iteration %d", f + 1, config.folds, best[-1])
    rounds = max(1, round(float(np.mean(best))))
    return lgb.train(params, whole, num_boost_round=rounds), rounds, tuple(best)


def _calibrate(booster: lgb.Booster, rows: _Sampled) -> tuple[float, float]:
    """Platt scaling on the validation slice: monotone and continuous, so thresholds stay
    fine-grained (isotonic steps would tie thousands of rows at the top). Positives count 1/A times
    at acceleration A, so the risk is the probability at hardware's real failure rate."""
    raw_val = np.asarray(booster.predict(rows.x[rows.val]))
    y, w = rows.y[rows.val], rows.w[rows.val]
    w = np.where(y, w / rows.acceleration[rows.val], w)
    platt = LogisticRegression(C=1e6, max_iter=1000).fit(
        _logit(raw_val)[:, None], y, sample_weight=w / w.mean()
    )
    return float(platt.coef_[0][0]), float(platt.intercept_[0])


def _fit_mode_head(
    rows: _Sampled, names: tuple[str, ...], config: TrainConfig
) -> tuple[list[str], lgb.Booster | None]:
    """The modes seen among the fit slice's positives and, when more than one, a head that tells
    them apart."""
    positive = rows.y & rows.fit
    modes = sorted(set(rows.mode[positive]))
    if len(modes) <= 1:
        return modes, None
    mode_ids = np.array([modes.index(m) for m in rows.mode[positive]])
    weight = _head_weight(rows, positive)
    params = _lgb_params(
        config,
        objective="multiclass",
        num_class=len(modes),
        min_data_in_leaf=10,
        learning_rate=0.1,
        num_leaves=15,
    )
    dataset = lgb.Dataset(rows.x[positive], mode_ids, weight=weight, feature_name=list(names))
    # A tree per class and round, run on every row near an alert: 80 rounds at 0.1 keep it affordable.
    return modes, lgb.train(params, dataset, num_boost_round=_HEAD_ROUNDS)


def _fit_ttf_head(rows: _Sampled, names: tuple[str, ...], config: TrainConfig) -> lgb.Booster | None:
    """Which time bucket (TTF_BUCKETS_S) the failure falls in, when the positives fill every bucket."""
    positive = rows.y & rows.fit
    bucket = np.searchsorted(np.asarray(TTF_BUCKETS_S), rows.ttf_s[positive], side="left")
    bucket = np.minimum(bucket, len(TTF_BUCKETS_S) - 1)
    if len(set(bucket.tolist())) != len(TTF_BUCKETS_S):
        return None
    params = _lgb_params(
        config, objective="multiclass", num_class=len(TTF_BUCKETS_S), min_data_in_leaf=10, learning_rate=0.1
    )
    data = lgb.Dataset(
        rows.x[positive], bucket, weight=_head_weight(rows, positive), feature_name=list(names)
    )
    return lgb.train(params, data, num_boost_round=_HEAD_ROUNDS)


def _head_weight(rows: _Sampled, positive: np.ndarray) -> np.ndarray | None:
    """The heads' weights: None (every positive alike) unless some mode was boosted, then 1/boost."""
    boost = rows.boost[positive]
    return None if (boost == 1.0).all() else 1.0 / boost


@dataclass(frozen=True)
class _Validation:
    """A part of the data the choices are judged on: nodes of a dataset over [start_s, end_s)."""

    dataset: Dataset
    nodes: tuple[int, ...]
    start_s: float
    end_s: float


Judged = list[tuple[ScoredPeriod, FailureLog]]


def _pooled_catches(
    parts: Judged, method: str, thresholds: Sequence[float], model: FaultModel, periods: PredictionPeriods
) -> list[tuple[int, int]]:
    """(failures that carried a precursor, those caught at >= the warning time) at each threshold,
    summed over the parts. Where the log does not say whether a failure carried one (a fleet's own
    holdout: no real log does), its mode decides (outcomes.mode_tallies' `by_mode`): else the recall
    of a fleet's holdout is NaN, no blend is ever chosen and the recall curve is empty."""
    totals = [(0, 0)] * len(thresholds)
    for period, failures in parts:
        found = incidents(period, method, list(thresholds), model.policy, NODE_LEVEL_MODES)
        for k, these in enumerate(found):
            counted, caught, _ = predictable_counts(
                catches(period, failures, these, periods), periods.warning_s, by_mode=True
            )
            totals[k] = (totals[k][0] + counted, totals[k][1] + caught)
    return totals


def _validation_recall(parts: Judged, model: FaultModel, periods: PredictionPeriods) -> ValidationRecall:
    """The model's and the logistic baseline's recall of the validation failures that carried a
    precursor, each at its own threshold, pooled over the validation worlds."""
    recall = {}
    counted = 0
    for method, threshold in (("model", model.threshold), ("logistic", model.logistic_threshold)):
        ((counted, caught),) = _pooled_catches(parts, method, [threshold], model, periods)
        recall[method] = caught / counted if counted else math.nan
    return ValidationRecall(recall["model"], recall["logistic"], counted)


def _recall_curve(
    parts: Judged, model: FaultModel, periods: PredictionPeriods
) -> tuple[list[float], list[float], int]:
    """Recall at >= the warning time of the validation failures that carried a precursor, at a grid of
    thresholds from the median validation score up (with the chosen threshold among them): (thresholds,
    recall, failures counted). Empty when the log says of no failure that it carried a precursor."""
    finite = np.concatenate([p.scores["model"][p.present & ~np.isnan(p.scores["model"])] for p, _ in parts])
    if finite.size == 0:
        return [], [], 0
    # Alerts live in the top of the scores: the grid is fine there (and takes the highest scores).
    top = np.unique(finite)[-40:]
    quantiles = np.quantile(finite, np.concatenate([np.linspace(0.5, 0.99, 20), np.linspace(0.99, 1.0, 41)]))
    grid = np.unique(np.concatenate([quantiles, top, [model.threshold]]))
    grid = grid[grid < 1.0]
    totals = _pooled_catches(parts, "model", grid.tolist(), model, periods)
    counted = totals[0][0] if totals else 0
    if counted == 0:
        return [], [], 0
    recall = [caught / counted for _, caught in totals]
    return [float(t) for t in grid], recall, counted


def _score_part(part: _Validation, model: FaultModel, masked: tuple[str, ...]) -> ScoredPeriod:
    """One validation part scored (a top-level function: it runs in other processes too)."""
    return score_period(part.dataset, model, part.nodes, part.start_s, part.end_s, masked_inputs=masked)


def _choose_thresholds(
    parts: Sequence[_Validation],
    model: FaultModel,
    config: TrainConfig,
    periods: PredictionPeriods,
    dask_client: Any = None,
) -> tuple[FalseAlarms, Judged, Judged]:
    """Sets the model's thresholds, each the lowest that keeps the validation parts' false alarms,
    pooled, within the budget; returns the false alarms at each and the scored validation parts.
    A cluster with only dcgm-exporter's defaults scores differently: it gets its own threshold,
    chosen the same way with those inputs blanked."""
    calls = [(part, model, masked) for masked in ((), tuple(DCGM_DEFAULT_MISSING)) for part in parts]
    scored = map_worlds(_score_part, calls, jobs=config.jobs, client=dask_client)
    full: Judged = [(p, part.dataset.failures) for p, part in zip(scored[: len(parts)], parts, strict=True)]
    masked: Judged = [(p, part.dataset.failures) for p, part in zip(scored[len(parts) :], parts, strict=True)]

    def chosen(judged: Judged, method: str) -> tuple[float, float]:
        return choose_threshold_pooled(
            judged,
            method,
            model.policy,
            NODE_LEVEL_MODES,
            config.false_alarm_budget,
            periods,
            floor=LOGISTIC_FLOOR if method == "logistic" else MODE_FLOOR,
        )

    model.threshold, model_fa = chosen(full, "model")
    model.logistic_threshold, logistic_fa = chosen(full, "logistic")
    model.dcgm_default_threshold, dcgm_fa = chosen(masked, "model")
    return FalseAlarms(model_fa, logistic_fa, dcgm_fa), full, masked


@dataclass(frozen=True)
class _BlendChoice:
    """What the validation worlds said of the booster alone and of the blend, and which serves."""

    blend: bool  # the blend serves
    booster_recall: float
    blend_recall: float
    false_alarms: float  # the served risk's, per 1,000 GPU-days on validation
    dcgm_false_alarms: float


def _fit_blend(model: FaultModel, rows: _Sampled) -> tuple[float, float, float]:
    """(a, b, c): risk = sigmoid(a * logit(booster) + b + c * logistic log-odds), fit like Platt's
    scaling on the validation rows (positives counted 1/A times): the two learners stacked."""
    x = rows.x[rows.val]
    raw = _logit(np.asarray(model.booster.predict(x)))
    linear = model.logistic.logit(x.astype(np.float64))
    y, w = rows.y[rows.val], rows.w[rows.val]
    w = np.where(y, w / rows.acceleration[rows.val], w)
    stack = LogisticRegression(C=1e6, max_iter=1000).fit(
        np.column_stack([raw, linear]), y, sample_weight=w / w.mean()
    )
    return float(stack.coef_[0][0]), float(stack.intercept_[0]), float(stack.coef_[0][1])


def _blended(
    period: ScoredPeriod, calibration: tuple[float, float], blend: tuple[float, float, float]
) -> np.ndarray:
    """The blend's risk on a scored period, from the booster's calibrated risk (inverted through
    its calibration) and the logistic baseline's probability there: no second pass over the data.
    The logistic's log-odds beyond +-36 (a probability of 1 in float64) read as 36."""
    a, b = calibration
    risk = np.clip(period.scores["model"], 1e-300, 1 - 1e-16)
    raw = (np.log(risk / (1 - risk)) - b) / a
    p = np.clip(period.scores["logistic"], 1e-300, 1 - 1e-16)
    z = blend[0] * raw + blend[1] + blend[2] * np.log(p / (1 - p))
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


def _choose_blend(
    rows: _Sampled,
    model: FaultModel,
    full: Judged,
    masked: Judged,
    config: TrainConfig,
    periods: PredictionPeriods,
) -> _BlendChoice | None:
    """Serve the booster stacked with the logistic baseline when, on the validation worlds pooled and at
    the same false-alarm budget, it catches more of the failures that carried a precursor than the
    booster alone (LightGBM has not always beaten logistic regression: docs/model.md). Sets the
    model's calibration, blend and thresholds when it does. None: the calibration cannot be inverted."""
    if abs(model.calibration[0]) < 1e-6 or not rows.val.any():
        return None
    blend = _fit_blend(model, rows)
    for period, _ in full:
        period.scores["blend"] = _blended(period, model.calibration, blend)

    def chosen(judged: Judged) -> tuple[float, float]:
        return choose_threshold_pooled(
            judged,
            "blend",
            model.policy,
            NODE_LEVEL_MODES,
            config.false_alarm_budget,
            periods,
            floor=MODE_FLOOR,
        )

    threshold, false_alarms = chosen(full)
    ((counted, booster_caught),) = _pooled_catches(full, "model", [model.threshold], model, periods)
    ((_, blend_caught),) = _pooled_catches(full, "blend", [threshold], model, periods)
    booster_recall = booster_caught / counted if counted else math.nan
    blend_recall = blend_caught / counted if counted else math.nan
    serve = blend_caught > booster_caught
    dcgm_false_alarms = math.nan
    if serve:  # the dcgm-default periods matter only then
        for period, _ in masked:
            period.scores["blend"] = _blended(period, model.calibration, blend)
        model.dcgm_default_threshold, dcgm_false_alarms = chosen(masked)
        model.calibration, model.blend, model.threshold = (blend[0], blend[1]), blend[2], threshold
        for period, _ in full:  # what the recall curve and the validation recall read from here on
            period.scores["model"] = period.scores["blend"]
    log.info(
        "validation recall at the budget: booster %.3f, blend with logistic regression %.3f: serving the %s",
        booster_recall,
        blend_recall,
        "blend" if serve else "booster",
    )
    return _BlendChoice(serve, booster_recall, blend_recall, false_alarms, dcgm_false_alarms)


def _reference_rows(fit: np.ndarray, seed: int) -> np.ndarray:
    """The fit rows the drift reference is built from: all of them, or a seeded uniform sample of
    `_REFERENCE_ROWS` (weights kept, so still the whole population's deciles). At 64 worlds the fit
    rows are 4.3M: taking them all copied 6 GB and sorted every column of them, minutes on one core,
    for deciles that half a million rows give to a tenth of a percentile."""
    where = np.flatnonzero(fit)
    if len(where) <= _REFERENCE_ROWS:
        return where
    return np.sort(np.random.default_rng(seed + 2).choice(where, _REFERENCE_ROWS, replace=False))


def _logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(p, 1e-9, 1 - 1e-9)
    return np.asarray(np.log(q / (1 - q)))


def _trimmed(booster: lgb.Booster, best: int) -> lgb.Booster:
    """The booster cut at its best iteration, so every later predict uses it without asking."""
    return lgb.Booster(model_str=booster.model_to_string(num_iteration=best))


def _fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray, seed: int) -> Logistic:
    """Median imputation, standardisation and a regularised linear model on the fit rows, worked on in
    place (float32 `x` is changed: pass a copy) and summarised in blocks of columns or rows: at 64
    worlds the rows are gigabytes, and numpy's nanmedian and std each made a full copy (std's in
    float64), which ran the machine out of memory."""
    z = np.asarray(x, dtype=np.float32)  # x is changed in place: callers pass a copy (rows.x[rows.fit])
    z[~np.isfinite(z)] = np.nan
    medians = np.zeros(z.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column no row has (a group never collected)
        for lo in range(0, z.shape[1], _COLUMN_BLOCK):
            medians[lo : lo + _COLUMN_BLOCK] = np.nanmedian(z[:, lo : lo + _COLUMN_BLOCK], axis=0)
    medians = np.where(np.isnan(medians), 0.0, medians)
    for lo in range(0, len(z), _ROW_BLOCK):
        block = z[lo : lo + _ROW_BLOCK]
        missing = np.isnan(block)
        block[missing] = np.broadcast_to(medians.astype(np.float32), block.shape)[missing]
    means = np.zeros(z.shape[1])
    for lo in range(0, len(z), _ROW_BLOCK):
        means += z[lo : lo + _ROW_BLOCK].sum(axis=0, dtype=np.float64)
    means /= max(len(z), 1)
    squares = np.zeros(z.shape[1])
    for lo in range(0, len(z), _ROW_BLOCK):
        squares += ((z[lo : lo + _ROW_BLOCK] - means) ** 2).sum(axis=0)
    scales = np.sqrt(squares / max(len(z), 1))
    scales = np.where(scales > 0, scales, 1.0)
    for lo in range(0, len(z), _ROW_BLOCK):
        block = z[lo : lo + _ROW_BLOCK]
        block -= means.astype(np.float32)
        block /= scales.astype(np.float32)
        np.clip(block, -20, 20, out=block)
    clf = LogisticRegression(C=0.1, max_iter=500, random_state=seed).fit(z, y, sample_weight=w)
    return Logistic(medians, means, scales, clf.coef_[0].astype(np.float64), float(clf.intercept_[0]))


_COLUMN_BLOCK = 16  # columns a median is taken over at once
_ROW_BLOCK = 65_536  # rows imputed, summed and standardised at once


def _config_record(config: TrainConfig) -> dict[str, JsonScalar]:
    """The config as the manifest records it (JSON scalars: the exclusions joined by commas)."""
    record: dict[str, JsonScalar] = {}
    for key, value in asdict(config).items():
        if key in ("world_weights", "warm_start", "node_history") and not value:
            continue  # recorded only when given: a model trained before the setting reads the same
        if key == "world_weights":
            record[key] = ",".join(f"{w:g}" for w in value)
        elif key == "booster_params":
            record[key] = ",".join(f"{k}={v}" for k, v in value)
        else:
            record[key] = ",".join(value) if isinstance(value, tuple | list) else value
    return record


def _training_data(datasets: Sequence[Dataset]) -> TrainingData:
    """The card's record of the training data: the one dataset, or each world (the validation last)."""
    if len(datasets) == 1:
        return TrainingData(path=str(datasets[0].path), manifest=_data_summary(datasets[0]))
    summaries = [_data_summary(d) for d in datasets]
    manifest: dict[str, object] = {
        "kind": "worlds",
        "worlds": [s.get("world") for s in summaries if s.get("world") is not None],
        "datasets": [str(d.path) for d in datasets],
        "validation": str(datasets[-1].path),
        "gpu_days": sum(_number(s.get("gpu_days")) for s in summaries),
    }
    boosted = {
        str(d.path): s["mode_acceleration"]
        for d, s in zip(datasets, summaries, strict=True)
        if "mode_acceleration" in s
    }
    if boosted:  # the worlds that drew some modes more often (their rows weighted back)
        manifest["mode_acceleration"] = boosted
    return TrainingData(path=str(datasets[-1].path), manifest=manifest)


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _data_summary(dataset: Dataset) -> dict[str, object]:
    keep = (
        "kind",
        "config",
        "seed",
        "acceleration",
        "mode_acceleration",
        "start",
        "end",
        "gpu_days",
        "rows",
        "failure_counts",
        "world",
    )
    return {k: dataset.manifest[k] for k in keep if k in dataset.manifest}
