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
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from faultcast import __version__
from faultcast.catalogue import CATALOGUE_VERSION, SCHEMA_HASH
from faultcast.model import threshold_file
from faultcast.model.features import FeatureConfig, FeatureEngine
from faultcast.model.incidents import AlertPolicy

FORMAT = "faultcast-model/1"
TTF_BUCKETS_S = (300.0, 900.0, 1800.0)  # risk within 5, 15 and 30 minutes


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
    if manifest.get("format") != FORMAT:
        raise ModelError(f"{path}: format {manifest.get('format')!r}, this faultcast reads {FORMAT!r}")
    for name, digest in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise ModelError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise ModelError(f"{path}: {name} is corrupt (its checksum differs from the manifest's)")
    if "model.txt" not in manifest.get("files", {}):
        raise ModelError(f"{path}: the manifest lists no model.txt")
    features = manifest["features"]
    config = FeatureConfig(
        cadence_s=float(features["cadence_s"]),
        windows_s=tuple(float(w) for w in features["windows_s"]),
        gpus_per_node=int(features["gpus_per_node"]),
    )
    engine = FeatureEngine(config, 1)
    if features["hash"] != engine.schema_hash or list(engine.names) != features["names"]:
        raise ModelError(
            f"{path}: built for feature schema {features['hash']}, this faultcast computes {engine.schema_hash}; "
            "retrain the model with this version (faultcast train)"
        )
    if manifest["catalogue"]["version"] != CATALOGUE_VERSION:
        raise ModelError(f"{path}: built on metric catalogue {manifest['catalogue']['version']}, "
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
        calibration = json.loads((path / "calibration.json").read_text())
        logistic = Logistic.from_json(json.loads((path / "logistic.json").read_text()))
    except (lgb.basic.LightGBMError, json.JSONDecodeError, KeyError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read the model: {exc}") from exc
    if booster.num_feature() != len(engine.names):
        raise ModelError(
            f"{path}: the model takes {booster.num_feature()} features, the schema has {len(engine.names)}"
        )
    # Policy fields an older manifest lacks take today's defaults.
    policy = AlertPolicy(**{f.name: manifest["alert_policy"][f.name] for f in fields(AlertPolicy)
                            if f.name in manifest["alert_policy"]})  # fmt: skip
    threshold = float(manifest["threshold"])
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
        calibration=(float(calibration["a"]), float(calibration["b"])),
        mode_booster=mode,
        modes=list(manifest["modes"]),
        ttf_booster=ttf,
        feature_config=config,
        feature_names=engine.names,
        horizon_s=float(manifest["horizon_s"]),
        threshold=threshold,
        policy=policy,
        logistic=logistic,
        logistic_threshold=float(manifest["logistic_threshold"]),
        dcgm_default_threshold=float(manifest.get("dcgm_default_threshold", manifest["threshold"])),
        manifest=manifest,
    )
