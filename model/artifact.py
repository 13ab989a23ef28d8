"""The model artifact: a directory holding the LightGBM models, the calibration, the logistic
baseline and a manifest that says what they expect. Loading checks every file's checksum and the
feature schema, and refuses a corrupt or mismatched artifact with a clear error.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from faultcast import __version__
from faultcast.catalogue import CATALOGUE_VERSION, SCHEMA_HASH
from faultcast.model import threshold_file
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.incidents import AlertPolicy
from faultcast.model.manifest import (
    FORMAT,
    TTF_BUCKETS_S,
    CatalogueStamp,
    FeatureSchema,
    JsonScalar,
    ModelError,
    ModelManifest,
    SplitRecord,
    Timings,
    TrainingData,
    TrainingMetrics,
    finite_number,
    refuse,
)
from faultcast.model.risk_range import check_threshold, risk_range

# Imported from here by callers since before model.manifest existed.
__all__ = ["TTF_BUCKETS_S", "FaultModel", "Logistic", "ModelError", "git_revision", "load", "save"]


# Rows of a logistic scoring computed together: 1,024 rows of 363 features are 3 MB, within a cache.
_LOGIT_BLOCK_ROWS = 1024


@dataclass(frozen=True)
class Logistic:
    """Logistic regression on the same features: median imputation, standardisation, linear model."""

    medians: np.ndarray
    means: np.ndarray
    scales: np.ndarray
    coef: np.ndarray
    intercept: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(rows,) probability from (rows, features); NaN features take the training medians."""
        z = self.logit(features)
        return np.asarray(1.0 / (1.0 + np.exp(-z)))

    def logit(self, features: np.ndarray) -> np.ndarray:
        """(rows,) the linear score (the probability's log-odds), clipped to +-50."""
        z = np.empty(len(features))
        # A block of rows at a time: its five passes then stay in the CPU's cache, where a whole
        # evaluation batch (64 steps of a thousand GPUs, 190 MB) went to memory for each: 4-5x faster
        # (bench/scoring_floor.py), the same figures (each row's score depends on that row alone).
        for lo in range(0, len(features), _LOGIT_BLOCK_ROWS):
            hi = lo + _LOGIT_BLOCK_ROWS
            x = np.where(np.isnan(features[lo:hi]), self.medians, features[lo:hi])
            # In place: the same arithmetic without three more arrays the size of the block.
            x -= self.means
            x /= self.scales
            np.clip(x, -20, 20, out=x)
            # Each row's own sum, not a matrix product: BLAS blocks a product by the batch's size, so
            # a row's score moved in the last bits with the rows beside it; this one depends on the row
            # alone (a scoring split over processes is then the same scoring: model/evaluation/score_jobs.py).
            z[lo:hi] = np.multiply(x, self.coef, out=x).sum(axis=1)
        z += self.intercept
        return np.asarray(np.clip(z, -50, 50))

    def logit_range(self) -> tuple[float, float]:
        """The lowest and highest log-odds it can give: every standardised feature is clipped to +-20."""
        reach = 20.0 * float(np.abs(self.coef).sum())
        return max(self.intercept - reach, -50.0), min(self.intercept + reach, 50.0)

    def to_json(self) -> dict[str, list[float] | float]:
        """The JSON object logistic.json holds (arrays as lists)."""
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(self).items()}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Logistic:
        """The inverse of `to_json`; KeyError, ValueError or TypeError for another shape."""
        arrays = [np.asarray(data[k], dtype=np.float64) for k in ("medians", "means", "scales", "coef")]
        return Logistic(arrays[0], arrays[1], arrays[2], arrays[3], float(data["intercept"]))


@dataclass
class FaultModel:
    """A trained model: its heads, the settings serving needs, and (once saved or loaded) its
    manifest. `threshold` is the one that serves: a threshold file's, else the trained one."""

    booster: lgb.Booster
    calibration: tuple[float, float]  # Platt scaling: risk = sigmoid(a * logit(raw) + b)
    mode_booster: lgb.Booster | None
    modes: list[str]
    ttf_booster: lgb.Booster | None
    feature_config: FeatureConfig
    feature_names: tuple[str, ...]
    horizon_s: float
    threshold: float
    policy: AlertPolicy
    logistic: Logistic
    logistic_threshold: float
    dcgm_default_threshold: float  # for clusters that only collect dcgm-exporter's default metrics
    saved: ModelManifest | None = None  # set by `save` and `load`; read it through `card`
    threshold_choice: threshold_file.ChosenThreshold | None = None  # the threshold file that serves, if any
    # The protect tier's threshold (a threshold file's), below `threshold`: alerts open there and buy
    # cheap protection; None: one tier, alerts open at `threshold`.
    protect_threshold: float | None = None
    # The weight of the logistic baseline's log-odds in the risk (a blend, chosen on the validation
    # worlds where it catches more at the budget than the booster alone); 0: the booster alone.
    blend: float = 0.0

    @property
    def open_threshold(self) -> float:
        """Where alerts open: the protect tier's threshold when there is one, else `threshold`."""
        return self.protect_threshold if self.protect_threshold is not None else self.threshold

    @property
    def card(self) -> ModelManifest:
        """The typed manifest of a saved or loaded model; raises ModelError on one still in training."""
        if self.saved is None:
            raise ModelError("this model has no manifest yet: `save` writes it")
        return self.saved

    def raw(self, features: np.ndarray) -> np.ndarray:
        """The risk booster's uncalibrated score per row (see `risk` for the probability)."""
        return np.asarray(self.booster.predict(features), dtype=np.float64)

    def risk(self, features: np.ndarray) -> np.ndarray:
        """Calibrated probability of a failure within the horizon: Platt scaling of the booster's
        score, plus the logistic baseline's log-odds at weight `blend` when the model is a blend."""
        a, b = self.calibration
        raw = np.clip(self.raw(features), 1e-9, 1 - 1e-9)
        z = a * np.log(raw / (1 - raw)) + b
        if self.blend:
            z = z + self.blend * self.logistic.logit(features)
        return np.asarray(1.0 / (1.0 + np.exp(-z)))

    def mode_probabilities(self, features: np.ndarray) -> np.ndarray:
        """(rows, modes): which failure it would be, given that one comes."""
        if self.mode_booster is None:
            return np.full((len(features), len(self.modes)), 1.0 / max(len(self.modes), 1))
        return np.asarray(self.mode_booster.predict(features), dtype=np.float64).reshape(len(features), -1)

    def risk_within(self, features: np.ndarray, risk: np.ndarray | None = None) -> np.ndarray:
        """(rows, 3): risk of failing within 5, 15 and 30 minutes (`risk`: the rows' risk, when
        already known)."""
        risk = self.risk(features) if risk is None else risk
        if self.ttf_booster is None:
            return np.repeat(risk[:, None], len(TTF_BUCKETS_S), axis=1)
        buckets = np.asarray(self.ttf_booster.predict(features), dtype=np.float64).reshape(len(features), -1)
        return risk[:, None] * np.cumsum(buckets, axis=1)

    def contributions(self, features: np.ndarray, top: int = 5) -> list[list[tuple[str, float, float]]]:
        """The `top` features pushing each row's raw score up: (name, value, contribution)."""
        contrib = np.asarray(self.booster.predict(features, pred_contrib=True))[:, :-1]
        out = []
        for row, values in zip(contrib, features, strict=True):
            order = np.argsort(-row)[:top]
            out.append([(self.feature_names[i], float(values[i]), float(row[i])) for i in order])
        return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_revision() -> str:
    """The checkout's commit, or "unknown" outside a git checkout (recorded in the manifest)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def save(
    model: FaultModel,
    out: Path,
    *,
    training_data: TrainingData | None = None,
    split: SplitRecord | None = None,
    train_config: Mapping[str, JsonScalar] | None = None,
    metrics: TrainingMetrics | None = None,
    timings_s: Timings | None = None,
) -> ModelManifest:
    """Write the artifact to `out` (created if need be): the heads, the calibration, the logistic
    baseline, then manifest.json with their checksums and what training recorded. Sets and returns
    the model's manifest."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "model.txt": model.booster.model_to_string(),
        "calibration.json": json.dumps(_calibration_json(model)),
        "logistic.json": json.dumps(model.logistic.to_json()),
    }
    if model.mode_booster is not None:
        files["mode.txt"] = model.mode_booster.model_to_string()
    if model.ttf_booster is not None:
        files["ttf.txt"] = model.ttf_booster.model_to_string()
    for name, text in files.items():
        (out / name).write_text(text)
    # The values go in as the model holds them (no float() or list()): the file stays byte for byte
    # what it was when the manifest was a dict.
    card = ModelManifest(
        format=FORMAT,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        faultcast_version=__version__,
        git_revision=git_revision(),
        catalogue=CatalogueStamp(version=CATALOGUE_VERSION, schema_hash=f"{SCHEMA_HASH:#018x}"),
        features=FeatureSchema(
            names=tuple(model.feature_names),
            hash=FeatureEngine(model.feature_config, 1).schema_hash,
            cadence_s=model.feature_config.cadence_s,
            windows_s=tuple(model.feature_config.windows_s),
            gpus_per_node=model.feature_config.gpus_per_node,
        ),
        horizon_s=model.horizon_s,
        threshold=model.threshold,
        logistic_threshold=model.logistic_threshold,
        dcgm_default_threshold=model.dcgm_default_threshold,
        alert_policy=model.policy,
        modes=tuple(model.modes),
        ttf_buckets_s=TTF_BUCKETS_S,
        files={name: _sha256(out / name) for name in sorted(files)},
        training_data=training_data,
        split=split,
        train_config=train_config,
        metrics=metrics,
        timings_s=timings_s,
    )
    (out / "manifest.json").write_text(json.dumps(card.to_json(), indent=2, default=_json_default) + "\n")
    model.saved = card
    return card


def _calibration_json(model: FaultModel) -> dict[str, object]:
    """calibration.json: Platt's slope and intercept; a blend adds the logistic log-odds' weight."""
    a, b = model.calibration
    if not model.blend:
        return {"method": "platt", "a": a, "b": b}
    return {"method": "platt+logistic", "a": a, "b": b, "logistic": model.blend}


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON: {type(value).__name__}")


def load(path: Path) -> FaultModel:
    """Load and check an artifact; raises ModelError saying what is wrong."""
    manifest_path = path / "manifest.json"
    raw = _read_manifest(path, manifest_path)
    card = ModelManifest.from_json(manifest_path, raw)
    _check_files(path, card.files)
    engine = FeatureEngine(card.features.config, 1)
    _check_schema(path, card, engine)
    booster, mode, ttf, (calibration, blend), logistic = _read_heads(path, card.files)
    _check_boosters(path, manifest_path, len(engine.names), (booster, mode, ttf), card.modes)
    threshold, choice = card.threshold, _threshold_choice(path, card)
    if choice is not None:  # the trained threshold stays in `card`; what serves is the file's
        threshold = choice.threshold
    low, _ = risk_range(booster, calibration, logistic.logit_range() if blend else None, blend)
    source = path / threshold_file.FILE if choice is not None else manifest_path
    check_threshold(threshold, low, str(source))
    if choice is not None and choice.protect_threshold is not None:
        check_threshold(choice.protect_threshold, low, f"{source} (protect_threshold)")
    return FaultModel(
        booster=booster,
        calibration=calibration,
        mode_booster=mode,
        modes=list(card.modes),
        ttf_booster=ttf,
        feature_config=card.features.config,
        feature_names=engine.names,
        horizon_s=card.horizon_s,
        threshold=threshold,
        policy=card.alert_policy,
        logistic=logistic,
        logistic_threshold=card.logistic_threshold,
        dcgm_default_threshold=card.dcgm_default_threshold,
        blend=blend,
        saved=card,
        threshold_choice=choice,
        protect_threshold=choice.protect_threshold if choice is not None else None,
    )


def _read_manifest(path: Path, manifest_path: Path) -> dict[str, Any]:
    """manifest.json's JSON object, unchecked."""
    if not manifest_path.is_file():
        raise ModelError(f"{path} is not a faultcast model: manifest.json is missing")
    try:
        raw = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{manifest_path} is corrupt: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelError(f"{manifest_path} is corrupt: expected a JSON object, got {type(raw).__name__}")
    return raw


def _check_schema(path: Path, card: ModelManifest, engine: FeatureEngine) -> None:
    """The model's features and catalogue are this faultcast's."""
    if card.features.hash != engine.schema_hash or engine.names != card.features.names:
        raise ModelError(
            f"{path}: built for feature schema {card.features.hash}, this faultcast computes "
            f"{engine.schema_hash}; retrain the model with this version (faultcast train)"
        )
    if card.catalogue.version != CATALOGUE_VERSION:
        raise ModelError(
            f"{path}: built on metric catalogue {card.catalogue.version}, this faultcast has {CATALOGUE_VERSION}"
        )


Heads = tuple[
    lgb.Booster, lgb.Booster | None, lgb.Booster | None, tuple[tuple[float, float], float], Logistic
]


def _read_heads(path: Path, files: Mapping[str, str]) -> Heads:
    """The risk, mode and time-to-failure boosters, the calibration and the logistic baseline."""
    try:
        booster = lgb.Booster(model_str=(path / "model.txt").read_text())
        mode = lgb.Booster(model_str=(path / "mode.txt").read_text()) if "mode.txt" in files else None
        ttf = lgb.Booster(model_str=(path / "ttf.txt").read_text()) if "ttf.txt" in files else None
        calibration = _calibration(path / "calibration.json")
        logistic = Logistic.from_json(json.loads((path / "logistic.json").read_text()))
    except (lgb.basic.LightGBMError, json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, ModelError):
            raise
        raise ModelError(f"{path}: cannot read the model: {exc}") from exc
    return booster, mode, ttf, calibration, logistic


def _threshold_choice(path: Path, card: ModelManifest) -> threshold_file.ChosenThreshold | None:
    """The threshold file beside the model, when there is one for it."""
    try:
        return threshold_file.read(path, card.files["model.txt"])
    except threshold_file.ThresholdFileError as exc:
        raise ModelError(str(exc)) from exc


def _check_files(path: Path, files: Mapping[str, str]) -> None:
    """Each file the manifest lists is there, with the SHA-256 it records."""
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise ModelError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise ModelError(f"{path}: {name} is corrupt (its checksum differs from the manifest's)")


def _calibration(where: Path) -> tuple[tuple[float, float], float]:
    """Platt's slope and intercept, and the blend's weight of the logistic log-odds (0 when absent):
    finite, or every risk is NaN, which alerting reads as 'low'."""
    data = json.loads(where.read_text())
    if not isinstance(data, dict):
        refuse(where, "calibration", data, "a JSON object with numbers a and b")
    slope = finite_number(where, data, "a", low=-math.inf, allowed="a finite number (Platt's slope)")
    intercept = finite_number(where, data, "b", low=-math.inf, allowed="a finite number (Platt's intercept)")
    blend = 0.0
    if "logistic" in data:
        blend = finite_number(
            where, data, "logistic", low=-math.inf, allowed="a finite number (the logistic log-odds' weight)"
        )
    return (slope, intercept), blend


def _check_boosters(
    path: Path,
    where: Path,
    features: int,
    heads: tuple[lgb.Booster, lgb.Booster | None, lgb.Booster | None],
    modes: tuple[str, ...],
) -> None:
    """Each head (risk, mode, time to failure) takes the schema's features and gives the outputs the
    manifest says: a mismatch would fail in the scorer on every step rather than here."""
    for name, head in zip(("model.txt", "mode.txt", "ttf.txt"), heads, strict=True):
        if head is not None and head.num_feature() != features:
            raise ModelError(f"{path}: {name} takes {head.num_feature()} features, the schema has {features}")
    mode, ttf = heads[1], heads[2]
    if mode is not None and mode.num_model_per_iteration() != len(modes):
        refuse(
            where, "modes", list(modes), f"{mode.num_model_per_iteration()} names, one per class of mode.txt"
        )
    if ttf is not None and ttf.num_model_per_iteration() != len(TTF_BUCKETS_S):
        raise ModelError(
            f"{path}: ttf.txt gives {ttf.num_model_per_iteration()} time buckets, this faultcast reads "
            f"{len(TTF_BUCKETS_S)}; retrain the model (faultcast train)"
        )
