"""A model's content digest: one SHA-256 that two trainings share when they trained the same model.

`artifact.save` records when, where and on what checkout a model was written, beside what it is; two
runs of one recipe on the same data differ in those fields only. The digest is the SHA-256 of a
canonical JSON (sorted keys, no spaces) of:

- manifest.json without the fields that vary from run to run or machine to machine:
  `created_at`, `git_revision`, `faultcast_version` (a release that leaves the model alone keeps its
  digest) and `timings_s`; in `train_config`, `rows_cache` (a path) and `jobs` (how many processes
  replayed the worlds); in `training_data`, every path: `path`, and in its `manifest` `datasets` and
  `validation`, with `mode_acceleration` (keyed by path) kept as its values in the datasets' order.
  What the data was stays in: each world's id and parameters, the twin's settings, its GPU-days and
  failure counts.
- the SHA-256 of each file the manifest lists, read from disk (a changed model.txt changes the digest
  even where the manifest was left as it was), and of the files beside the model that serving or
  `faultcast calibrate` reads when they are there: threshold.json, reference.json and
  recall_curve.json (the last without `basis.measured_on`, which names the validation data's paths).

Any other file in the directory (a DIGEST file, a README) is not part of it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FORMAT = "faultcast-model-digest/1"
# Top-level manifest fields that say when and where a model was written, not what it is.
VOLATILE = ("created_at", "git_revision", "faultcast_version", "timings_s")
VOLATILE_TRAIN_CONFIG = ("rows_cache", "jobs")
DATA_PATHS = ("datasets", "validation")
# Read beside the model when present (model/threshold_file.py, evaluation/drift.py, training/recall_curve.py).
SIDECARS = ("threshold.json", "reference.json", "recall_curve.json")


class DigestError(ValueError):
    """The directory is no model whose digest can be taken; the message says why."""


def content_digest(path: Path) -> str:
    """The model directory's content digest (64 hex digits); DigestError when it has no readable
    manifest or lacks a file the manifest lists."""
    manifest = _json(path / "manifest.json")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise DigestError(f"{path}/manifest.json lists no files: not a faultcast model")
    contents = {name: _sha256_of(path, str(name)) for name in sorted(files)}
    for name in SIDECARS:
        if (path / name).is_file():
            contents[name] = _sidecar_sha256(path / name)
    record = {"format": FORMAT, "manifest": stable_manifest(manifest), "contents": contents}
    return hashlib.sha256(canonical(record)).hexdigest()


def stable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without its run- and machine-dependent fields (a copy; see the module's docstring)."""
    out = {k: v for k, v in manifest.items() if k not in VOLATILE}
    config = out.get("train_config")
    if isinstance(config, dict):
        out["train_config"] = {k: v for k, v in config.items() if k not in VOLATILE_TRAIN_CONFIG}
    data = out.get("training_data")
    if isinstance(data, dict):
        out["training_data"] = _stable_data(data)
    return out


def _stable_data(data: dict[str, Any]) -> dict[str, Any]:
    """training_data without paths: the data is named by what it holds, not where it lay."""
    out = {k: v for k, v in data.items() if k != "path"}
    manifest = out.get("manifest")
    if isinstance(manifest, dict):
        kept = {k: v for k, v in manifest.items() if k not in DATA_PATHS}
        boosted = kept.get("mode_acceleration")
        if isinstance(boosted, dict) and isinstance(manifest.get("datasets"), list):
            # Keyed by each world's path: its factors in the datasets' order say the same.
            order = [str(p) for p in manifest["datasets"]]
            kept["mode_acceleration"] = [boosted[p] for p in order if p in boosted]
        out["manifest"] = kept
    return out


def canonical(value: object) -> bytes:
    """`value` as canonical JSON bytes: sorted keys, no whitespace, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DigestError(f"{path.parent} is not a faultcast model: manifest.json is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DigestError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise DigestError(f"{path} is not a JSON object")
    return data


def _sha256_of(path: Path, name: str) -> str:
    file = path / name
    if not file.is_file():
        raise DigestError(f"{path}: {name} is missing (manifest.json lists it)")
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _sidecar_sha256(file: Path) -> str:
    """A file beside the model; recall_curve.json without the paths it was measured on."""
    if file.name != "recall_curve.json":
        return hashlib.sha256(file.read_bytes()).hexdigest()
    curve = _json(file)
    basis = curve.get("basis")
    if isinstance(basis, dict):
        curve = {**curve, "basis": {k: v for k, v in basis.items() if k != "measured_on"}}
    return hashlib.sha256(canonical(curve)).hexdigest()
