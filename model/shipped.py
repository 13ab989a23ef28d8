"""The shipped model: a generic model trained at scale on the fleet twin (bench/shipped_model.sh),
carried in the package as `faultcast.model`'s data (model/shipped_model/), and the default of every
command that takes `--model` to serve or evaluate. Its `DIGEST` file holds its content digest
(model/digest.py), which a reproduction of the recipe must match.

Found through importlib.resources, so it is the same in a wheel and in the strict editable install
(whose links to package data are made at install time: pyproject.toml's package-data lists it).
Loading nothing heavy here: the command line asks for the path before it loads LightGBM.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from faultcast.model.manifest import ModelError

DIRECTORY = "shipped_model"
DIGEST_FILE = "DIGEST"
MISSING = "the shipped model is missing from this install: reinstall faultcast, or give --model"


class ShippedModelMissingError(ModelError):
    """The install carries no shipped model (or not all of it)."""


def shipped_model_dir() -> Path:
    """The shipped model's directory; ShippedModelMissingError when this install lacks it."""
    where = resources.files("faultcast.model") / DIRECTORY
    # A wheel unpacked on disk or the editable install's links: a real directory. A zipped install has
    # no path to give the service (it reads the files by path), so it counts as missing.
    if not isinstance(where, Path) or not (where / "manifest.json").is_file():
        raise ShippedModelMissingError(MISSING)
    return where


def shipped_digest() -> str:
    """The content digest the shipped model was published with (its DIGEST file's one line)."""
    file = shipped_model_dir() / DIGEST_FILE
    try:
        text = file.read_text().strip()
    except FileNotFoundError:
        raise ShippedModelMissingError(f"{MISSING} ({DIGEST_FILE} is not there)") from None
    return text
