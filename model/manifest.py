"""What a model's `manifest.json` says, as types: built by training, written by `artifact.save`,
parsed and checked by `artifact.load`, read by attribute (`FaultModel.card`).

The manifest is not checksummed (it holds the other files' checksums), so whoever can write the
model directory can write any value into it: `ModelManifest.from_json` checks each value serving
reads for type and range, and refuses a bad one with the file, the key, the value and what is
allowed. A JSON bool is refused where a number is expected (Python's bool is an int), and so is a
number written as a string. What training records for people (data, split, metrics, timings) is
checked for type only. The sections and fields older manifests lack may be absent (they still load);
any other field of a section that is there must be there and well-formed, or the model is refused
(the old loader ignored those; a half-written record is more likely tampering than history).

`to_json` gives the manifest in the order and shape it has always had on disk, so a model written
today is byte for byte what was written before these types existed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn, TypeGuard

from faultcast.model.evaluation.outcomes import PredictionPeriods
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.history import has_history
from faultcast.model.incidents import AlertPolicy
from faultcast.schemas import current_data_manifest

FORMAT = "faultcast-model/1"
TTF_BUCKETS_S = (300.0, 900.0, 1800.0)  # risk within 5, 15 and 30 minutes
MODEL_FILES = frozenset({"model.txt", "mode.txt", "ttf.txt", "calibration.json", "logistic.json"})
REQUIRED_FILES = ("model.txt", "calibration.json", "logistic.json")  # `save` always writes these
# Bounds on what a manifest may say, beyond which a value is a typo or an attack, never a setting:
MAX_GPUS_PER_NODE = 64  # HGX/DGX nodes have 8, DGX-2 16; more would size per-slot arrays by a typo
MAX_WINDOW_STEPS = 10_000  # a feature window's ring buffer, per GPU (a week of minutes)
# The grid's step: collectors sample at most once a second, so a finer grid only adds steps without
# samples, and a tiny one turns every sample's step number into an overflow (1e-300 s: every Push
# failed) or into millions of steps per sample (1e-6 s: one sample froze the service).
MIN_CADENCE_S = 1.0
MAX_HORIZON_STEPS = 10_000  # horizon_s / cadence_s: the alert policy's k and the labels count steps in it
MAX_POLICY_STEPS = 1_000_000  # clear_steps and dark_steps: ~2 years of minutes; the API sends uint32
NEVER_SLACK = 1e-6  # training's "never" threshold is 1.0, or 1e-9 above a top risk that may be 1.0

JsonScalar = str | int | float | bool | None


class ModelError(ValueError):
    """The artifact cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class CatalogueStamp:
    """The metric catalogue the model was built on (`faultcast.catalogue`)."""

    version: str
    schema_hash: str  # written as 0x and 16 hex digits


@dataclass(frozen=True)
class FeatureSchema:
    """The features the model takes, in column order, and the settings that computed them."""

    names: tuple[str, ...]
    hash: str  # FeatureEngine.schema_hash: names and settings together
    cadence_s: float
    windows_s: tuple[float, ...]
    gpus_per_node: int

    @property
    def config(self) -> FeatureConfig:
        """The feature engine's settings these name."""
        return FeatureConfig(
            cadence_s=self.cadence_s,
            windows_s=self.windows_s,
            gpus_per_node=self.gpus_per_node,
            node_history=has_history(self.names),  # the names carry the choice: no format change
        )


@dataclass(frozen=True)
class TrainingData:
    """Where the training data came from: its path and part of its own manifest.json (the data
    directory's, which `model.dataset` reads; kept here as the JSON object it is)."""

    path: str
    manifest: Mapping[str, object]


@dataclass(frozen=True)
class SplitRecord:
    """Which nodes and days training held out (`faultcast evaluate` scores those on the same data)."""

    train_nodes: tuple[str, ...]
    test_nodes: tuple[str, ...]
    validation_start_unix_s: float
    test_start_unix_s: float


@dataclass(frozen=True)
class FalseAlarms:
    """False alarms per 1,000 GPU-days on the validation slice, at each chosen threshold."""

    model: float
    logistic: float
    model_dcgm_default: float | None  # absent from manifests older than the dcgm-default threshold


@dataclass(frozen=True)
class ValidationRecall:
    """Recall at >= the warning time of the validation failures that carried a precursor, for the
    model and the logistic baseline each at its own threshold (the same false-alarm budget): the
    leave-world-out comparison training's choices are judged by. NaN: no such failure."""

    model: float
    logistic: float
    failures: int  # the validation failures that carried a precursor


@dataclass(frozen=True)
class TrainingMetrics:
    """What training measured. The None fields are absent from older manifests."""

    training_rows: int
    training_positives: int
    best_iteration: int
    trained_on: str | None  # "local" or "dask"
    validation_gpu_days: float
    prediction_periods: PredictionPeriods | None
    validation_false_alarms_per_1000_gpu_days: FalseAlarms | None
    dropped_columns_for_dcgm_default: tuple[str, ...]
    validation_recall_5min_predictable: ValidationRecall | None = None  # absent from older manifests
    # Cross-validation over groups of worlds: each fold's best iteration (empty: no folds, or older).
    fold_best_iterations: tuple[int, ...] = ()
    validation_worlds: int = 1  # how many worlds (or slices) the validation pooled
    # Which risk serves: "booster", or "blend" (stacked with the logistic baseline); None: older.
    served: str | None = None
    # The validation recall at the budget of the booster alone and of the blend (None: not compared).
    validation_recall_booster: float | None = None
    validation_recall_blend: float | None = None


@dataclass(frozen=True)
class Timings:
    """Seconds each stage of training took."""

    feature_build_s: float
    training_s: float
    threshold_selection_s: float
    total_s: float


@dataclass(frozen=True)
class ModelManifest:
    """A model directory's manifest.json. Field order is the file's key order; an optional field
    that is None is absent from the file."""

    format: str
    created_at: str | None  # ISO 8601, UTC, to the second
    faultcast_version: str | None
    git_revision: str | None  # "unknown" outside a git checkout
    catalogue: CatalogueStamp
    features: FeatureSchema
    horizon_s: float
    threshold: float  # the trained threshold (a threshold file may serve another: FaultModel.threshold)
    logistic_threshold: float
    dcgm_default_threshold: float  # the threshold when an older manifest lacks it
    alert_policy: AlertPolicy
    modes: tuple[str, ...]
    ttf_buckets_s: tuple[float, ...]
    files: Mapping[str, str]  # file name -> SHA-256, hex
    training_data: TrainingData | None = None
    split: SplitRecord | None = None
    train_config: Mapping[str, JsonScalar] | None = None  # TrainConfig's fields (model.train)
    metrics: TrainingMetrics | None = None
    timings_s: Timings | None = None

    def to_json(self) -> dict[str, object]:
        """The JSON object manifest.json holds."""
        # asdict keeps field order and nests the nested dataclasses as the file nests them.
        return {k: v for k, v in asdict(self).items() if v is not None}

    @staticmethod
    def from_json(where: Path, data: object) -> ModelManifest:
        """Parse and check manifest.json's content (`where`: the file, for messages); raises
        ModelError naming the first bad field. Every value is checked before any is used: a bad one
        must not size arrays or reach serving. The files themselves are checked by `artifact.load`."""
        if not isinstance(data, dict):
            raise ModelError(f"{where} is corrupt: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ModelError(
                f"{where.parent}: format {data.get('format')!r}, this faultcast reads {FORMAT!r}"
            )
        files = _files(where, data.get("files", _MISSING))
        features = _features(where, _section(where, data, "features"))
        cadence = features.cadence_s
        horizon = finite_number(where, data, "horizon_s", low=0.0, allowed="a number of seconds > 0")
        if not cadence <= horizon <= MAX_HORIZON_STEPS * cadence:
            allowed = f"from one to {MAX_HORIZON_STEPS} scoring steps (features.cadence_s = {cadence:g})"
            refuse(where, "horizon_s", horizon, allowed)
        threshold = _trained_threshold(where, data, "threshold")
        # The buckets are this code's (alert content reads TTF_BUCKETS_S): a model built for others is refused.
        if data.get("ttf_buckets_s", list(TTF_BUCKETS_S)) != list(TTF_BUCKETS_S):
            allowed = f"{list(TTF_BUCKETS_S)}, the time buckets this faultcast reads"
            refuse(where, "ttf_buckets_s", data["ttf_buckets_s"], allowed)
        policy = _policy(where, _section(where, data, "alert_policy"), horizon, cadence)
        logistic_threshold = _trained_threshold(where, data, "logistic_threshold")
        dcgm_default_threshold = (
            _trained_threshold(where, data, "dcgm_default_threshold")
            if "dcgm_default_threshold" in data
            else threshold  # an older manifest lacks it
        )
        modes = _modes(where, data.get("modes", _MISSING))
        catalogue = _section(where, data, "catalogue")
        return ModelManifest(
            format=FORMAT,
            created_at=_optional_text(where, data, "created_at"),
            faultcast_version=_optional_text(where, data, "faultcast_version"),
            git_revision=_optional_text(where, data, "git_revision"),
            catalogue=CatalogueStamp(
                version=_text(where, catalogue, "catalogue.version"),
                schema_hash=_text(where, catalogue, "catalogue.schema_hash"),
            ),
            features=features,
            horizon_s=horizon,
            threshold=threshold,
            logistic_threshold=logistic_threshold,
            dcgm_default_threshold=dcgm_default_threshold,
            alert_policy=policy,
            modes=modes,
            ttf_buckets_s=TTF_BUCKETS_S,
            files=files,
            training_data=_training_data(where, data),
            split=_split(where, data),
            train_config=_train_config(where, data),
            metrics=_metrics(where, data),
            timings_s=_timings(where, data),
        )


# -- checking what a manifest says ------------------------------------------------------------

_MISSING = object()


def refuse(where: Path, key: str, value: object, allowed: str) -> NoReturn:
    """Raise ModelError: `where`'s `key` holds `value` (cut short), and what it must be."""
    shown = "missing" if value is _MISSING else repr(value)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."  # the value is the attacker's: cut it
    raise ModelError(
        f"{where}: {key} is {shown}, it must be {allowed}; fix the file or retrain the model (faultcast train)"
    )


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _section(where: Path, data: Mapping[str, object], key: str) -> dict[str, object]:
    """A JSON object under `key` (dotted: its name in messages)."""
    value = data.get(_leaf(key), _MISSING)
    if not isinstance(value, dict):
        refuse(where, key, value, "a JSON object")
    return value


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number: not a bool (an int in Python), not a string, not NaN or infinite."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def finite_number(
    where: Path,
    data: Mapping[str, object],
    key: str,
    *,
    low: float,
    allowed: str,
    high: float = math.inf,
) -> float:
    """A finite JSON number strictly above `low` and strictly under `high`; `key`: its dotted name.
    Raises ModelError naming `where` and `key`."""
    value = data.get(_leaf(key), _MISSING)
    if not _is_number(value):
        refuse(where, key, value, f"{allowed}, written as a finite JSON number (not a string or a bool)")
    if not low < value < high:
        refuse(where, key, value, allowed)
    return float(value)


def _whole(where: Path, data: Mapping[str, object], key: str, low: int, high: int, why: str = "") -> int:
    """A JSON integer (not a bool, not 2.0) in [low, high]."""
    value = data.get(_leaf(key), _MISSING)
    if isinstance(value, bool) or not isinstance(value, int):
        allowed = f"a JSON integer (not a string, a bool or a fraction) from {low} to {high}{why}"
        refuse(where, key, value, allowed)
    if not low <= value <= high:
        refuse(where, key, value, f"a whole number from {low} to {high}{why}")
    return value


def _features(where: Path, data: Mapping[str, object]) -> FeatureSchema:
    cadence_allowed = f"a number of seconds >= {MIN_CADENCE_S:g} (collectors sample at most once a second)"
    cadence = finite_number(where, data, "features.cadence_s", low=0.0, allowed=cadence_allowed)
    if cadence < MIN_CADENCE_S:
        refuse(where, "features.cadence_s", cadence, cadence_allowed)
    windows = _windows(where, data.get("windows_s", _MISSING), cadence)
    gpus = _whole(where, data, "features.gpus_per_node", 1, MAX_GPUS_PER_NODE)
    names = data.get("names", _MISSING)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        refuse(where, "features.names", names, "a list of feature names")
    return FeatureSchema(
        names=tuple(names),
        hash=_text(where, data, "features.hash"),
        cadence_s=cadence,
        windows_s=windows,
        gpus_per_node=gpus,
    )


def _windows(where: Path, value: object, cadence: float) -> tuple[float, ...]:
    """Feature windows: increasing, finite, each from one step (a shorter window would be one step
    anyway, its name a lie) to MAX_WINDOW_STEPS steps (its ring buffer, per GPU)."""
    allowed = (
        f"a non-empty list of increasing numbers of seconds, from one to {MAX_WINDOW_STEPS} steps "
        f"of features.cadence_s = {cadence:g}"
    )
    if not isinstance(value, list) or not value or not all(_is_number(w) and w > 0 for w in value):
        refuse(where, "features.windows_s", value, allowed)
    if (
        any(b <= a for a, b in itertools.pairwise(value))
        or value[0] < cadence
        or value[-1] / cadence > MAX_WINDOW_STEPS
    ):
        refuse(where, "features.windows_s", value, allowed)
    return tuple(float(w) for w in value)


def _policy(where: Path, data: Mapping[str, object], horizon: float, cadence: float) -> AlertPolicy:
    """The alert policy; a key an older manifest lacks takes today's default."""
    default = AlertPolicy()
    # k scores in a row take k steps: an alert that cannot open within the horizon predicts nothing.
    most_k = int(horizon // cadence)
    k = default.k
    if "k" in data:
        why = f" (k scores at features.cadence_s = {cadence:g} must fit in horizon_s = {horizon:g})"
        k = _whole(where, data, "alert_policy.k", 1, most_k, why)
    clear = default.clear_steps
    if "clear_steps" in data:
        clear = _whole(where, data, "alert_policy.clear_steps", 1, MAX_POLICY_STEPS)
    dark = default.dark_steps
    if "dark_steps" in data:
        dark = _whole(where, data, "alert_policy.dark_steps", 1, MAX_POLICY_STEPS)
    ratio = default.hold_ratio
    if "hold_ratio" in data:
        # The hold level (threshold x ratio) sits at or under the threshold: 0 never clears on risk.
        allowed = "a number in (0, 1]"
        ratio = finite_number(where, data, "alert_policy.hold_ratio", low=0.0, allowed=allowed)
        if ratio > 1.0:
            refuse(where, "alert_policy.hold_ratio", ratio, allowed)
    return AlertPolicy(k=k, clear_steps=clear, hold_ratio=ratio, dark_steps=dark)


def _trained_threshold(where: Path, data: Mapping[str, object], key: str) -> float:
    """A calibrated probability above 0 (0 would alert on every score). Up to 1 + NEVER_SLACK, not
    under 1: when no threshold keeps validation's false alarms within the budget, training writes
    1.0, or a hair above the top risk, for "never" (outcomes.choose_threshold), and such a model
    must still load for evaluation and for `faultcast goodput --apply` to give it a threshold."""
    allowed = "a calibrated probability in (0, 1] (1: training's 'never', no threshold met its budget)"
    return finite_number(where, data, key, low=0.0, high=1.0 + NEVER_SLACK, allowed=allowed)


def _modes(where: Path, value: object) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(m, str) and m for m in value)
        or len(set(value)) != len(value)
    ):
        refuse(where, "modes", value, "a non-empty list of distinct failure-mode names")
    return tuple(value)


def _files(where: Path, value: object) -> dict[str, str]:
    """The manifest's file list: only the artifact's own files, each with a SHA-256 (compared with
    the files by `artifact.load`), the required ones present."""
    allowed = f"an object from file names ({', '.join(sorted(MODEL_FILES))}) to their SHA-256"
    if not isinstance(value, dict) or not all(
        name in MODEL_FILES and isinstance(digest, str) for name, digest in value.items()
    ):
        refuse(where, "files", value, allowed)
    for name in REQUIRED_FILES:
        if name not in value:
            raise ModelError(f"{where.parent}: the manifest lists no {name}")
    return dict(value)


# -- what training recorded: checked for type, absent in parts from older manifests ----------


def _text(where: Path, data: Mapping[str, object], key: str) -> str:
    value = data.get(_leaf(key), _MISSING)
    if not isinstance(value, str):
        refuse(where, key, value, "a string")
    return value


def _optional_text(where: Path, data: Mapping[str, object], key: str) -> str | None:
    return _text(where, data, key) if _leaf(key) in data else None


def _measured(where: Path, data: Mapping[str, object], key: str) -> float:
    """A JSON number, NaN and infinities allowed (a measurement, not a setting)."""
    value = data.get(_leaf(key), _MISSING)
    if isinstance(value, bool) or not isinstance(value, int | float):
        refuse(where, key, value, "a JSON number")
    return float(value)


def _count(where: Path, data: Mapping[str, object], key: str) -> int:
    return _whole(where, data, key, 0, 2**63 - 1)


def _names(where: Path, data: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = data.get(_leaf(key), _MISSING)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        refuse(where, key, value, "a list of strings")
    return tuple(value)


def _training_data(where: Path, data: Mapping[str, object]) -> TrainingData | None:
    if "training_data" not in data:
        return None
    section = _section(where, data, "training_data")
    return TrainingData(
        path=_text(where, section, "training_data.path"),
        manifest=current_data_manifest(_section(where, section, "training_data.manifest")),
    )


def _split(where: Path, data: Mapping[str, object]) -> SplitRecord | None:
    if "split" not in data:
        return None
    section = _section(where, data, "split")
    return SplitRecord(
        train_nodes=_names(where, section, "split.train_nodes"),
        test_nodes=_names(where, section, "split.test_nodes"),
        validation_start_unix_s=_measured(where, section, "split.validation_start_unix_s"),
        test_start_unix_s=_measured(where, section, "split.test_start_unix_s"),
    )


def _train_config(where: Path, data: Mapping[str, object]) -> dict[str, JsonScalar] | None:
    if "train_config" not in data:
        return None
    section = _section(where, data, "train_config")
    for key, value in section.items():
        if not isinstance(value, str | int | float | bool | type(None)):
            refuse(where, f"train_config.{key}", value, "a JSON number, string, bool or null")
    return {
        key: value for key, value in section.items() if isinstance(value, str | int | float | bool | None)
    }


def _metrics(where: Path, data: Mapping[str, object]) -> TrainingMetrics | None:
    if "metrics" not in data:
        return None
    m = _section(where, data, "metrics")
    periods = None
    if "prediction_periods" in m:
        p = _section(where, m, "metrics.prediction_periods")
        periods = PredictionPeriods(
            *(
                _measured(where, p, f"metrics.prediction_periods.{k}")
                for k in ("warning_s", "period_s", "false_after_s")
            )
        )
    false_alarms = None
    key = "metrics.validation_false_alarms_per_1000_gpu_days"
    if _leaf(key) in m:
        fa = _section(where, m, key)
        false_alarms = FalseAlarms(
            model=_measured(where, fa, f"{key}.model"),
            logistic=_measured(where, fa, f"{key}.logistic"),
            model_dcgm_default=(
                _measured(where, fa, f"{key}.model_dcgm_default") if "model_dcgm_default" in fa else None
            ),
        )
    recall = None
    key = "metrics.validation_recall_5min_predictable"
    if _leaf(key) in m and m[_leaf(key)] is not None:
        r = _section(where, m, key)
        recall = ValidationRecall(
            model=_measured(where, r, f"{key}.model"),
            logistic=_measured(where, r, f"{key}.logistic"),
            failures=_count(where, r, f"{key}.failures"),
        )
    return TrainingMetrics(
        training_rows=_count(where, m, "metrics.training_rows"),
        training_positives=_count(where, m, "metrics.training_positives"),
        best_iteration=_count(where, m, "metrics.best_iteration"),
        trained_on=_optional_text(where, m, "metrics.trained_on"),
        validation_gpu_days=_measured(where, m, "metrics.validation_gpu_days"),
        prediction_periods=periods,
        validation_false_alarms_per_1000_gpu_days=false_alarms,
        dropped_columns_for_dcgm_default=_names(where, m, "metrics.dropped_columns_for_dcgm_default"),
        validation_recall_5min_predictable=recall,
        fold_best_iterations=_counts(where, m, "metrics.fold_best_iterations"),
        validation_worlds=_count(where, m, "metrics.validation_worlds") if "validation_worlds" in m else 1,
        served=_optional_text(where, m, "metrics.served"),
        validation_recall_booster=_optional_measured(where, m, "metrics.validation_recall_booster"),
        validation_recall_blend=_optional_measured(where, m, "metrics.validation_recall_blend"),
    )


def _optional_measured(where: Path, data: Mapping[str, object], key: str) -> float | None:
    """A measurement that older manifests lack (None there, and where it was null: NaN)."""
    if data.get(_leaf(key)) is None:
        return None
    return _measured(where, data, key)


def _counts(where: Path, data: Mapping[str, object], key: str) -> tuple[int, ...]:
    """A list of whole numbers; empty where an older manifest lacks it."""
    value = data.get(_leaf(key), [])
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        refuse(where, key, value, "a list of whole numbers")
    return tuple(int(v) for v in value)


def _timings(where: Path, data: Mapping[str, object]) -> Timings | None:
    if "timings_s" not in data:
        return None
    t = _section(where, data, "timings_s")
    return Timings(
        *(
            _measured(where, t, f"timings_s.{k}")
            for k in ("feature_build_s", "training_s", "threshold_selection_s", "total_s")
        )
    )
