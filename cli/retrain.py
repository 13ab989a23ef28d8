"""`faultcast retrain`: a challenger model from the fleet's own history and labels, with twin worlds as
a prior, every choice made on the newest days held out.

The service's archive (its settled days) and its label log (failures from FAILED events, harvested logs
and operators; censored spans of drained predictions) become two data directories: the older days of
the window, which train, and the newest `--holdout` days, which validate (early stopping, calibration,
thresholds at the false-alarm budget). Two kinds of prior, alone or together: `--prior` worlds (twin data)
train beside the fleet's days, their rows weighed by `--prior-weight`; `--warm-start [MODEL]` continues
boosting a model's risk booster (by default the one serving: the registry's, else the shipped model) on
the fleet's rows. The result is a model directory with its card, like `faultcast train`'s;
`faultcast models add` registers it as a challenger.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from faultcast.cli.types import Subcommands, duration

if TYPE_CHECKING:
    from faultcast.service.state.store import StateStore

log = logging.getLogger(__name__)
DAY_S = 86_400.0
SERVING = "serving"  # --warm-start without a model: the one the service serves


def add_parser(commands: Subcommands) -> None:
    """Register `faultcast retrain`."""
    parser = commands.add_parser(
        "retrain",
        help="train a challenger on the fleet's own archive and label log (twin worlds as a prior)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="the service's state directory")
    parser.add_argument("--archive", type=Path, help="the service's archive (default: STATE_DIR/archive)")
    parser.add_argument("--out", type=Path, required=True, help="the challenger's model directory")
    parser.add_argument(
        "--window", type=duration, default=90 * DAY_S, help="how much of the newest history to learn from"
    )
    parser.add_argument(
        "--holdout", type=duration, default=14 * DAY_S, help="the newest days every choice is made on"
    )
    parser.add_argument(
        "--prior",
        type=Path,
        action="append",
        default=[],
        help="a twin world (faultcast simulate output) trained on beside the fleet's days; repeatable",
    )
    parser.add_argument(
        "--prior-weight",
        type=float,
        default=1.0,
        help="the weight of each prior world's rows (the fleet's: 1)",
    )
    parser.add_argument(
        "--warm-start",
        nargs="?",
        const=SERVING,
        metavar="MODEL",
        help="continue boosting MODEL's risk booster on the fleet's rows (no MODEL: the serving model, "
        "the registry's or else the shipped one)",
    )
    parser.add_argument(
        "--node-history",
        action="store_true",
        help="add the node-history features (each GPU's and node's own failures from the label log); "
        "the service computes them from its label log for such a model",
    )
    parser.add_argument(
        "--horizon", type=duration, default=1800.0, help="how far ahead a failure labels a sample"
    )
    parser.add_argument("--negative-rate", type=float, default=0.02, help="share of healthy rows kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="worlds replayed at once")
    parser.add_argument(
        "--booster-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a LightGBM parameter of the risk booster (as `faultcast train`); repeatable",
    )
    parser.set_defaults(handler=run_retrain)


def run_retrain(args: argparse.Namespace) -> int:
    """Build the window's data directories, train, print the card's summary; 2 on bad input."""
    from faultcast.cli.model import _booster_param, trained_summary
    from faultcast.model.features.offline import DataError, open_dataset
    from faultcast.model.training.train import TrainConfig, train
    from faultcast.service.archive.window import choose_window, write_view
    from faultcast.service.archive.writer import settled_days
    from faultcast.service.state.db import StateError
    from faultcast.service.state.store import DATABASE_NAME, StateStore
    from faultcast.service.training_labels import training_labels

    archive = args.archive or args.state_dir / "archive"
    database = args.state_dir / DATABASE_NAME
    try:
        if not database.exists():
            raise ValueError(f"no state database in {args.state_dir} ({DATABASE_NAME})")
        if not (archive / "manifest.json").exists():
            raise ValueError(f"{archive} holds no archive (no settled day: serve with its archive on first)")
        cadence = float(json.loads((archive / "manifest.json").read_text())["config"]["cadence_s"])
        window = choose_window(list(settled_days(archive)), args.window / DAY_S, args.holdout / DAY_S)
        params = tuple(_booster_param(p) for p in args.booster_param)
        if args.prior_weight <= 0:
            raise ValueError(f"--prior-weight must be positive, not {args.prior_weight}")
        store = StateStore(database)
        try:
            labels = training_labels(store, args.horizon)
            warm = _warm_start(args.warm_start, store)
        finally:
            store.close()
        work = args.out.with_name(args.out.name + ".window")
        shutil.rmtree(work, ignore_errors=True)
        fit = write_view(archive, window.fit, labels, work / "fit", cadence_s=cadence)
        holdout = write_view(archive, window.holdout, labels, work / "holdout", cadence_s=cadence)
        datasets = [open_dataset(p) for p in args.prior] + [open_dataset(fit), open_dataset(holdout)]
    except (ValueError, OSError, KeyError, StateError, DataError, argparse.ArgumentTypeError) as exc:
        print(f"faultcast retrain: {exc}", file=sys.stderr)
        return 2
    weights = (args.prior_weight,) * len(args.prior) + (1.0, 1.0)
    config = TrainConfig(
        horizon_s=args.horizon,
        cadence_s=cadence,
        negative_rate=args.negative_rate,
        seed=args.seed,
        jobs=args.jobs,
        validation_worlds=1,
        booster_params=params,
        world_weights=weights if args.prior else (),
        warm_start=str(warm.resolve()) if warm is not None else None,
        node_history=args.node_history,
    )
    log.info(
        "retraining on %d days of the fleet (%s to %s), holding out %d (%s to %s), %d prior worlds, %s",
        len(window.fit), window.fit[0], window.fit[-1], len(window.holdout), window.holdout[0],
        window.holdout[-1], len(args.prior), f"warm start from {warm}" if warm else "no warm start",
    )  # fmt: skip
    try:
        model = train(datasets, args.out, config)
    except ValueError as exc:  # too few failures in the window or the holdout: says which
        print(f"faultcast retrain: {exc}", file=sys.stderr)
        return 2
    print(trained_summary(args.out, model.card))
    return 0


def _warm_start(given: str | None, store: StateStore) -> Path | None:
    """The model directory to continue from: None without --warm-start, the given one, or (without a
    model) the serving model: the registry's when it has one intact, else the shipped model."""
    from faultcast.model.shipped import shipped_model_dir
    from faultcast.service.model_registry import choose_at_start, of_store

    if given is None:
        return None
    if given != SERVING:
        return Path(given)
    return choose_at_start(shipped_model_dir(), of_store(store))
