"""`faultcast calibrate`: set the serving threshold from a fleet's own recent history, and say how far
the fleet sits from what the model was trained on (faultcast.model.training.calibrate describes the method)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from faultcast.cli.paths import create_parents, missing_file, missing_input, refuse
from faultcast.cli.types import Subcommands

if TYPE_CHECKING:
    from faultcast.model.evaluation.visibility import Visibility


def add_parser(commands: Subcommands) -> None:
    """Register `faultcast calibrate`."""
    p = commands.add_parser(
        "calibrate",
        help="set the alert threshold from a fleet's own history (false-alarm budget), report drift",
        description=__doc__,
    )
    p.add_argument("--model", type=Path, required=True, help="the model directory")
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="the fleet's history: a data directory (`faultcast import-prometheus` or `simulate`)",
    )
    p.add_argument(
        "--failures",
        type=Path,
        help="a failure log to use instead of the data's failures.csv (same columns); without failures "
        "every incident on the history counts as a false alarm",
    )
    p.add_argument(
        "--budget",
        type=float,
        help="false alarms per 1,000 GPU-days to hold (default: the model's training budget)",
    )
    p.add_argument("--seed", type=int, default=0, help="the node bootstrap's and the drift sample's seed")
    p.add_argument("--json", type=Path, help="also write every figure here as JSON ('-': stdout only)")
    p.add_argument(
        "--apply",
        action="store_true",
        help="write the threshold beside the model (threshold.json): the service serves it from its "
        "next start or reload",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    """Calibrate, print the summary (or the JSON to stdout with --json -), apply when asked. Exit
    status: 0, or 2 when the model, the data or the history cannot be used."""
    from faultcast.model.artifact import ModelError
    from faultcast.model.features.offline import DataError
    from faultcast.model.threshold_file import ThresholdFileError
    from faultcast.model.training.calibrate import CalibrationError, apply, calibrate, summary

    clash = _model_file(args.model, args.json)  # first: nothing of the model is ever at risk
    if clash:
        print(f"faultcast calibrate: --json {args.json} would overwrite the model's {clash}", file=sys.stderr)
        return 2
    why = missing_input([("--model", args.model), ("--data", args.data)]) or missing_file(
        [("--failures", args.failures)]
    )
    if why is None and args.json not in (None, Path("-")):
        why = create_parents([("--json", args.json)])
    if why is not None:
        return refuse("calibrate", why)
    try:
        result = calibrate(
            args.model, args.data, failures_path=args.failures, budget=args.budget, seed=args.seed
        )
    except (ModelError, DataError, CalibrationError, OSError) as exc:
        print(f"faultcast calibrate: {exc}", file=sys.stderr)
        return 2
    figures = result.to_json()
    seen = _visibility(args.model, args.data)
    if seen is not None:
        figures["visibility"] = seen.to_json()
    document = json.dumps(figures, indent=1)
    if args.json == Path("-"):
        print(document)
    else:
        print(summary(result))
        if seen is not None:
            print(seen.render())
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(document + "\n")
    if args.apply:
        try:
            path = apply(result)
        except (ModelError, ThresholdFileError, OSError) as exc:
            print(f"faultcast calibrate: cannot apply: {exc}", file=sys.stderr)
            return 2
        print(
            f"applied: {path} (the service serves threshold {result.threshold:.4f} from its next start or reload)",
            file=sys.stderr if args.json == Path("-") else sys.stdout,
        )
    return 0


def _visibility(model: Path, data: Path) -> Visibility | None:
    """What the model can see in the data (faultcast.model.evaluation.visibility); None, with a line on stderr,
    when the report cannot be made (the calibration stands without it)."""
    from faultcast.model.artifact import ModelError
    from faultcast.model.evaluation.visibility import of_data

    try:
        return of_data(model, data)
    except (ModelError, OSError, ValueError) as exc:
        print(f"faultcast calibrate: no visibility report: {exc}", file=sys.stderr)
        return None


# What a model directory holds beside the files its manifest lists (model/artifact.py, threshold_file.py,
# drift.py, recall_curve.py): none of them may be written over by a report.
_MODEL_OWN = ("manifest.json", "threshold.json", "reference.json", "recall_curve.json")


def _model_file(model: Path, target: Path | None) -> str | None:
    """The name of the model's own file `target` would overwrite, if it would."""
    if target is None or target == Path("-") or target.resolve().parent != model.resolve():
        return None
    listed: set[str] = set(_MODEL_OWN)
    try:
        files = json.loads((model / "manifest.json").read_text()).get("files", {})
        listed |= set(files) if isinstance(files, dict) else set()
    except (OSError, ValueError, AttributeError):
        pass  # no readable manifest: calibrate will say so; the fixed names still stand
    return target.name if target.name in listed else None
