"""The model artifact: a directory holding the LightGBM models, the calibration, the logistic
baseline and a manifest that says what they expect. Loading checks every file's checksum and the
feature schema, and refuses a corrupt or mismatched artifact with a clear error.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import math
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeGuard

import lightgbm as lgb
import numpy as np

from faultcast import __version__
from faultcast.catalogue import CATALOGUE_VERSION, SCHEMA_HASH
from faultcast.model import threshold_file
from faultcast.model.features import FeatureConfig, FeatureEngine
from faultcast.model.incidents import AlertPolicy

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


class ModelError(ValueError):
    """The artifact cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Logistic:
    """Logistic regression on the same features: median imputation, standardisation, linear model."""

    medians: np.ndarray
    means: np.ndarray
    scales: np.ndarray
    coef: np.ndarray
    intercept: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = np.where(np.isnan(features), self.medians, features)
        z = np.clip((x - self.means) / self.scales, -20, 20) @ self.coef + self.intercept
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -50, 50))))

    def to_json(self) -> dict[str, Any]:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in vars(self).items()}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Logistic:
        arrays = [np.asarray(data[k], dtype=np.float64) for k in ("medians", "means", "scales", "coef")]
        return Logistic(arrays[0], arrays[1], arrays[2], arrays[3], float(data["intercept"]))


@dataclass(frozen=True)
class Settings:
    """The manifest's values that serving uses, checked (see `check_settings`)."""

    feature_config: FeatureConfig
    horizon_s: float
    threshold: float
    policy: AlertPolicy
    logistic_threshold: float
    dcgm_default_threshold: float
    modes: list[str]


@dataclass
class FaultModel:
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
    manifest: dict[str, Any]

    def raw(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(features), dtype=np.float64)

    def risk(self, features: np.ndarray) -> np.ndarray:
        """Calibrated probability of a failure within the horizon."""
        a, b = self.calibration
        raw = np.clip(self.raw(features), 1e-9, 1 - 1e-9)
        return np.asarray(1.0 / (1.0 + np.exp(-(a * np.log(raw / (1 - raw)) + b))))

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
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def save(model: FaultModel, out: Path, extra: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "model.txt": model.booster.model_to_string(),
        "calibration.json": json.dumps(
            {"method": "platt", "a": model.calibration[0], "b": model.calibration[1]}
        ),
        "logistic.json": json.dumps(model.logistic.to_json()),
    }
    if model.mode_booster is not None:
        files["mode.txt"] = model.mode_booster.model_to_string()
    if model.ttf_booster is not None:
        files["ttf.txt"] = model.ttf_booster.model_to_string()
    for name, text in files.items():
        (out / name).write_text(text)
    manifest = {
        "format": FORMAT,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "faultcast_version": __version__,
        "git_revision": git_revision(),
        "catalogue": {"version": CATALOGUE_VERSION, "schema_hash": f"{SCHEMA_HASH:#018x}"},
        "features": {
            "names": list(model.feature_names),
            "hash": FeatureEngine(model.feature_config, 1).schema_hash,
            "cadence_s": model.feature_config.cadence_s,
            "windows_s": list(model.feature_config.windows_s),
            "gpus_per_node": model.feature_config.gpus_per_node,
        },
        "horizon_s": model.horizon_s,
        "threshold": model.threshold,
        "logistic_threshold": model.logistic_threshold,
        "dcgm_default_threshold": model.dcgm_default_threshold,
        "alert_policy": asdict(model.policy),
        "modes": model.modes,
        "ttf_buckets_s": list(TTF_BUCKETS_S),
        "files": {name: _sha256(out / name) for name in sorted(files)},
        **extra,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=_json_default) + "\n")
    model.manifest = manifest


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON: {type(value).__name__}")


def load(path: Path) -> FaultModel:
    """Load and check an artifact; raises ModelError saying what is wrong."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise ModelError(f"{path} is not a faultcast model: manifest.json is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{manifest_path} is corrupt: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ModelError(f"{manifest_path} is corrupt: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise ModelError(f"{path}: format {manifest.get('format')!r}, this faultcast reads {FORMAT!r}")
    _check_files(path, manifest_path, manifest.get("files"))
    # Every value is checked before any is used: a bad one must not size arrays or reach serving.
    settings = check_settings(manifest_path, manifest)
    config, features = settings.feature_config, manifest["features"]
    engine = FeatureEngine(config, 1)
    if features.get("hash") != engine.schema_hash or list(engine.names) != features.get("names"):
        raise ModelError(
            f"{path}: built for feature schema {features.get('hash')}, this faultcast computes "
            f"{engine.schema_hash}; retrain the model with this version (faultcast train)"
        )
    catalogue = _section(manifest_path, manifest, "catalogue")
    if catalogue.get("version") != CATALOGUE_VERSION:
        raise ModelError(f"{path}: built on metric catalogue {catalogue.get('version')}, "
                         f"this faultcast has {CATALOGUE_VERSION}")  # fmt: skip
    try:
        booster = lgb.Booster(model_str=(path / "model.txt").read_text())
        mode = (
            lgb.Booster(model_str=(path / "mode.txt").read_text())
            if "mode.txt" in manifest["files"]
            else None
        )
        ttf = (
            lgb.Booster(model_str=(path / "ttf.txt").read_text()) if "ttf.txt" in manifest["files"] else None
        )
        calibration = _calibration(path / "calibration.json")
        logistic = Logistic.from_json(json.loads((path / "logistic.json").read_text()))
    except (lgb.basic.LightGBMError, json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, ModelError):
            raise
        raise ModelError(f"{path}: cannot read the model: {exc}") from exc
    _check_boosters(path, manifest_path, len(engine.names), (booster, mode, ttf), settings.modes)
    threshold = settings.threshold
    try:
        chosen = threshold_file.read(path, str(manifest["files"]["model.txt"]))
    except threshold_file.ThresholdFileError as exc:
        raise ModelError(str(exc)) from exc
    if chosen is not None:
        # The trained threshold stays in the manifest; what serves is recorded beside it.
        threshold = float(chosen["threshold"])
        manifest = {**manifest, "threshold_file": {"threshold": threshold, "trained_threshold": manifest["threshold"],
                                                    "basis": chosen.get("basis", {})}}  # fmt: skip
    return FaultModel(
        booster=booster,
        calibration=calibration,
        mode_booster=mode,
        modes=settings.modes,
        ttf_booster=ttf,
        feature_config=config,
        feature_names=engine.names,
        horizon_s=settings.horizon_s,
        threshold=threshold,
        policy=settings.policy,
        logistic=logistic,
        logistic_threshold=settings.logistic_threshold,
        dcgm_default_threshold=settings.dcgm_default_threshold,
        manifest=manifest,
    )


# -- checking what a manifest says ------------------------------------------------------------
#
# The manifest is not checksummed (it holds the other files' checksums), so whoever can write the
# model directory can write any value into it: each one serving reads is checked for type and range
# here, and refused with the file, the key, the value and what is allowed. A JSON bool is refused
# where a number is expected (Python's bool is an int), and so is a number written as a string.


def check_settings(where: Path, manifest: dict[str, Any]) -> Settings:
    """The manifest's serving settings, each checked; raises ModelError naming the first bad one."""
    features = _section(where, manifest, "features")
    cadence_allowed = f"a number of seconds >= {MIN_CADENCE_S:g} (collectors sample at most once a second)"
    cadence = _number(where, features, "features.cadence_s", low=0.0, allowed=cadence_allowed)
    if cadence < MIN_CADENCE_S:
        _refuse(where, "features.cadence_s", cadence, cadence_allowed)
    windows = _windows(where, features.get("windows_s", _MISSING), cadence)
    gpus = _whole(where, features, "features.gpus_per_node", 1, MAX_GPUS_PER_NODE)
    horizon = _number(where, manifest, "horizon_s", low=0.0, allowed="a number of seconds > 0")
    if not cadence <= horizon <= MAX_HORIZON_STEPS * cadence:
        _refuse(where, "horizon_s", horizon,
                f"from one to {MAX_HORIZON_STEPS} scoring steps (features.cadence_s = {cadence:g})")  # fmt: skip
    threshold = _trained_threshold(where, manifest, "threshold")
    # The buckets are this code's (alert content reads TTF_BUCKETS_S): a model built for others is refused.
    if manifest.get("ttf_buckets_s", list(TTF_BUCKETS_S)) != list(TTF_BUCKETS_S):
        _refuse(where, "ttf_buckets_s", manifest["ttf_buckets_s"],
                f"{list(TTF_BUCKETS_S)}, the time buckets this faultcast reads")  # fmt: skip
    return Settings(
        feature_config=FeatureConfig(cadence_s=cadence, windows_s=windows, gpus_per_node=gpus),
        horizon_s=horizon,
        threshold=threshold,
        policy=_policy(where, _section(where, manifest, "alert_policy"), horizon, cadence),
        logistic_threshold=_trained_threshold(where, manifest, "logistic_threshold"),
        dcgm_default_threshold=(
            _trained_threshold(where, manifest, "dcgm_default_threshold")
            if "dcgm_default_threshold" in manifest
            else threshold  # an older manifest lacks it
        ),
        modes=_modes(where, manifest.get("modes", _MISSING)),
    )


_MISSING = object()


def _refuse(where: Path, key: str, value: object, allowed: str) -> NoReturn:
    shown = "missing" if value is _MISSING else repr(value)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."  # the value is the attacker's: cut it
    raise ModelError(
        f"{where}: {key} is {shown}, it must be {allowed}; fix the file or retrain the model (faultcast train)"
    )


def _section(where: Path, manifest: dict[str, Any], key: str) -> dict[str, Any]:
    value = manifest.get(key, _MISSING)
    if not isinstance(value, dict):
        _refuse(where, key, value, "a JSON object")
    return value


def _number(
    where: Path,
    data: dict[str, Any],
    key: str,
    *,
    low: float,
    allowed: str,
    high: float = math.inf,
) -> float:
    """A finite JSON number strictly above `low` and strictly under `high`; `key`: its dotted name."""
    value = data.get(key.rsplit(".", 1)[-1], _MISSING)
    if not _is_number(value):
        _refuse(where, key, value, f"{allowed}, written as a finite JSON number (not a string or a bool)")
    if not low < value < high:
        _refuse(where, key, value, allowed)
    return float(value)


def _whole(where: Path, data: dict[str, Any], key: str, low: int, high: int, why: str = "") -> int:
    """A JSON integer (not a bool, not 2.0) in [low, high]."""
    value = data.get(key.rsplit(".", 1)[-1], _MISSING)
    if isinstance(value, bool) or not isinstance(value, int):
        _refuse(
            where,
            key,
            value,
            f"a JSON integer (not a string, a bool or a fraction) from {low} to {high}{why}",
        )
    if not low <= value <= high:
        _refuse(where, key, value, f"a whole number from {low} to {high}{why}")
    return value


def _windows(where: Path, value: object, cadence: float) -> tuple[float, ...]:
    """Feature windows: increasing, finite, each from one step (a shorter window would be one step
    anyway, its name a lie) to MAX_WINDOW_STEPS steps (its ring buffer, per GPU)."""
    allowed = (f"a non-empty list of increasing numbers of seconds, from one to {MAX_WINDOW_STEPS} steps "
               f"of features.cadence_s = {cadence:g}")  # fmt: skip
    if not isinstance(value, list) or not value or not all(_is_number(w) and w > 0 for w in value):
        _refuse(where, "features.windows_s", value, allowed)
    if (
        any(b <= a for a, b in itertools.pairwise(value))
        or value[0] < cadence
        or value[-1] / cadence > MAX_WINDOW_STEPS
    ):
        _refuse(where, "features.windows_s", value, allowed)
    return tuple(float(w) for w in value)


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number: not a bool (an int in Python), not a string, not NaN or infinite."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _policy(where: Path, data: dict[str, Any], horizon: float, cadence: float) -> AlertPolicy:
    """The alert policy; a key an older manifest lacks takes today's default."""
    default = AlertPolicy()
    # k scores in a row take k steps: an alert that cannot open within the horizon predicts nothing.
    most_k = int(horizon // cadence)
    k = default.k
    if "k" in data:
        k = _whole(where, data, "alert_policy.k", 1, most_k,
                   f" (k scores at features.cadence_s = {cadence:g} must fit in horizon_s = {horizon:g})")  # fmt: skip
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
        ratio = _number(where, data, "alert_policy.hold_ratio", low=0.0, allowed=allowed)
        if ratio > 1.0:
            _refuse(where, "alert_policy.hold_ratio", ratio, allowed)
    return AlertPolicy(k=k, clear_steps=clear, hold_ratio=ratio, dark_steps=dark)


def _trained_threshold(where: Path, manifest: dict[str, Any], key: str) -> float:
    """A calibrated probability above 0 (0 would alert on every score). Up to 1 + NEVER_SLACK, not
    under 1: when no threshold keeps validation's false alarms within the budget, training writes
    1.0, or a hair above the top risk, for "never" (outcomes.choose_threshold), and such a model
    must still load for evaluation and for `faultcast goodput --apply` to give it a threshold."""
    allowed = "a calibrated probability in (0, 1] (1: training's 'never', no threshold met its budget)"
    return _number(where, manifest, key, low=0.0, high=1.0 + NEVER_SLACK, allowed=allowed)


def _modes(where: Path, value: object) -> list[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(m, str) and m for m in value)
        or len(set(value)) != len(value)
    ):
        _refuse(where, "modes", value, "a non-empty list of distinct failure-mode names")
    return list(value)


def _check_files(path: Path, where: Path, files: object) -> None:
    """The manifest's file list: only the artifact's own files, each with a SHA-256 that matches."""
    allowed = f"an object from file names ({', '.join(sorted(MODEL_FILES))}) to their SHA-256"
    if not isinstance(files, dict) or not all(
        name in MODEL_FILES and isinstance(digest, str) for name, digest in files.items()
    ):
        _refuse(where, "files", files, allowed)
    for name in REQUIRED_FILES:
        if name not in files:
            raise ModelError(f"{path}: the manifest lists no {name}")
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise ModelError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise ModelError(f"{path}: {name} is corrupt (its checksum differs from the manifest's)")


def _calibration(where: Path) -> tuple[float, float]:
    """Platt's slope and intercept: finite, or every risk is NaN, which alerting reads as 'low'."""
    data = json.loads(where.read_text())
    if not isinstance(data, dict):
        _refuse(where, "calibration", data, "a JSON object with numbers a and b")
    slope = _number(where, data, "a", low=-math.inf, allowed="a finite number (Platt's slope)")
    return slope, _number(where, data, "b", low=-math.inf, allowed="a finite number (Platt's intercept)")


def _check_boosters(
    path: Path, where: Path, features: int, heads: tuple[lgb.Booster, lgb.Booster | None, lgb.Booster | None],
    modes: list[str],
) -> None:  # fmt: skip
    """Each head (risk, mode, time to failure) takes the schema's features and gives the outputs the
    manifest says: a mismatch would fail in the scorer on every step rather than here."""
    for name, head in zip(("model.txt", "mode.txt", "ttf.txt"), heads, strict=True):
        if head is not None and head.num_feature() != features:
            raise ModelError(f"{path}: {name} takes {head.num_feature()} features, the schema has {features}")
    mode, ttf = heads[1], heads[2]
    if mode is not None and mode.num_model_per_iteration() != len(modes):
        _refuse(where, "modes", modes, f"{mode.num_model_per_iteration()} names, one per class of mode.txt")
    if ttf is not None and ttf.num_model_per_iteration() != len(TTF_BUCKETS_S):
        raise ModelError(
            f"{path}: ttf.txt gives {ttf.num_model_per_iteration()} time buckets, this faultcast reads "
            f"{len(TTF_BUCKETS_S)}; retrain the model (faultcast train)"
        )
