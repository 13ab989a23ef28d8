"""`faultcast serve`'s flags default to the service's own configuration: a serve started without
flags runs with `ServiceConfig()`, field by field, nested parts included, and each flag fills the
field it names. A default changed in one place and not the other fails here."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from faultcast.cli.app import build_parser
from faultcast.cli.serve import service_config
from faultcast.service.config import ServiceConfig

# Each flag that fills a ServiceConfig field, with a value other than the default, and that field
# (dotted: a nested config's).
FLAGS = {
    "--grace": ("17s", "grace_s", 17.0),
    "--remediation-attempts": ("2", "retry.max_attempts", 2),
    "--remediation-backoff": ("3s", "retry.initial_s", 3.0),
    "--remediation-backoff-max": ("40s", "retry.max_s", 40.0),
    "--silent-after": ("9", "silent_after_steps", 9),
    "--failure-grace": ("5s", "silence_grace_s", 5.0),
    "--keepalive": ("3s", "keepalive_s", 3.0),
    "--failure-hold": ("70s", "failure_hold_s", 70.0),
    "--incident": ("2h", "incident_s", 7200.0),
    "--checkpoint-every": ("4", "checkpoint_steps", 4),
    "--max-drains": ("2", "max_drains", 2),
    "--drain-window": ("10m", "drain_window_s", 600.0),
    "--max-clock-skew": ("30s", "limits.max_future_s", 30.0),
    "--max-sample-age": ("1h", "limits.max_age_s", 3600.0),
    "--archive-days": ("30", "archive_days", 30.0),
    "--retrain-every": ("7d", "retrain_every_s", 7 * 86400.0),
}


def _parsed(tmp_path: Path, *flags: str) -> argparse.Namespace:
    required = ["--model", str(tmp_path / "model"), "--state-dir", str(tmp_path / "state")]
    return build_parser().parse_args(["serve", *required, *flags])


def _fields(config: object, prefix: str = "") -> dict[str, object]:
    """Every leaf field of a (nested) dataclass, by dotted name."""
    out: dict[str, object] = {}
    for field in dataclasses.fields(config):  # type: ignore[arg-type]  # a dataclass instance
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= _fields(value, f"{prefix}{field.name}.")
        else:
            out[f"{prefix}{field.name}"] = value
    return out


def test_serve_without_flags_runs_with_the_services_default_configuration(tmp_path: Path) -> None:
    built = _fields(service_config(_parsed(tmp_path)))
    default = _fields(ServiceConfig())
    assert built.keys() == default.keys()
    drifted = {name: (built[name], default[name]) for name in default if built[name] != default[name]}
    assert drifted == {}, "flag default != ServiceConfig's (flag, config):"


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_each_flag_defaults_to_its_field_and_sets_that_field_alone(flag: str, tmp_path: Path) -> None:
    text, name, value = FLAGS[flag]
    default = _fields(ServiceConfig())
    dest = flag.removeprefix("--").replace("-", "_")
    assert getattr(_parsed(tmp_path), dest) == default[name]
    assert value != default[name]  # else the next check proves nothing
    built = _fields(service_config(_parsed(tmp_path, flag, text)))
    assert built == default | {name: value}


def test_the_serve_flags_still_parse_without_the_model_package(tmp_path: Path) -> None:
    # The flags read their defaults from service/config.py: that must not load LightGBM (tests/test_cli.py).
    code = (
        "import sys; from faultcast.cli.app import build_parser; "
        f"build_parser().parse_args(['serve', '--model', {str(tmp_path)!r}, '--state-dir', {str(tmp_path)!r}]); "
        "print(sorted(m for m in ('lightgbm', 'sklearn', 'pandas', 'pyarrow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
