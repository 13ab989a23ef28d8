"""`faultcast train` and `faultcast evaluate`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultcast.cli.types import Subcommands, duration

if TYPE_CHECKING:  # the model package loads on demand: `faultcast --help` stays quick
    from faultcast.model.manifest import ModelManifest


def add_parsers(commands: Subcommands) -> None:
    """Add `faultcast train` and `faultcast evaluate`."""
    train = commands.add_parser(
        "train", help="train the failure-prediction model on telemetry and a failure log"
    )
    train.add_argument(
        "--data", type=Path, required=True, help="a `faultcast simulate` output (or an import)"
    )
    train.add_argument("--out", type=Path, required=True, help="the model directory to write")
    train.add_argument("--horizon", type=duration, default=1800.0, help="predict failures this far ahead")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--negative-rate", type=float, default=0.02, help="share of negative rows sampled")
    train.add_argument(
        "--false-alarm-budget", type=float, default=0.5, help="per 1,000 GPU-days on validation"
    )
    train.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="train the booster on this Dask cluster (tcp://host:8786) through lightgbm.dask",
    )
    train.set_defaults(handler=run_train)

    evaluate = commands.add_parser("evaluate", help="event-level evaluation on held-out nodes and weeks")
    evaluate.add_argument("--model", type=Path, required=True)
    evaluate.add_argument("--data", type=Path, required=True)
    evaluate.add_argument("--json", type=Path, help="write the metrics here")
    evaluate.add_argument(
        "--warning-time",
        type=duration,
        default=300.0,
        help="minimal warning time: a failure counts as caught only when warned at least this early",
    )
    evaluate.add_argument(
        "--prediction-period",
        type=duration,
        default=7200.0,
        help="an alert counts as true when its failure comes within this after it (else premature or false)",
    )
    evaluate.set_defaults(handler=run_evaluate)


def run_train(args: argparse.Namespace) -> int:
    """`faultcast train`: train on a data directory, write the model; returns the exit status."""
    from faultcast.model.dataset import DataError, open_dataset
    from faultcast.model.train import TrainConfig, train

    try:
        dataset = open_dataset(args.data)
        config = TrainConfig(
            horizon_s=args.horizon,
            seed=args.seed,
            negative_rate=args.negative_rate,
            false_alarm_budget=args.false_alarm_budget,
        )
        client = None
        if args.dask_scheduler:
            from distributed import Client

            client = Client(args.dask_scheduler)
        model = train(dataset, args.out, config, dask_client=client)
    except (DataError, ValueError) as exc:
        print(f"faultcast train: {exc}", file=sys.stderr)
        return 2
    print(trained_summary(args.out, model.card))
    return 0


def trained_summary(out: Path, card: ModelManifest) -> str:
    """The line `faultcast train` prints: what training measured, from the manifest it wrote."""
    m, timings = card.metrics, card.timings_s
    if m is None or timings is None or m.validation_false_alarms_per_1000_gpu_days is None:
        return f"wrote {out}: threshold {card.threshold:.4f}"  # `save` always records these: not reached
    false_alarms = m.validation_false_alarms_per_1000_gpu_days.model
    return (
        f"wrote {out}: {m.training_rows:,} rows ({m.training_positives:,} positive), "
        f"{m.best_iteration} trees, threshold {card.threshold:.4f} "
        f"({false_alarms:.2f} false alarms per 1,000 GPU-days "
        f"on {m.validation_gpu_days:.0f} validation GPU-days), "
        f"in {timings.total_s:.0f} s"
    )


def run_evaluate(args: argparse.Namespace) -> int:
    """`faultcast evaluate`: the event-level evaluation on held-out data, as a table or JSON."""
    from faultcast.model.artifact import ModelError, load
    from faultcast.model.dataset import DataError, open_dataset
    from faultcast.model.evaluate import held_out_report, json_safe
    from faultcast.model.outcomes import PredictionPeriods

    try:
        model = load(args.model)
        dataset = open_dataset(args.data)
    except (ModelError, DataError) as exc:
        print(f"faultcast evaluate: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if not 0 <= args.warning_time < args.prediction_period:
        print(
            "faultcast evaluate: the warning time must be shorter than the prediction period", file=sys.stderr
        )
        return 2
    report, _ = held_out_report(dataset, model, PredictionPeriods(args.warning_time, args.prediction_period))
    report["evaluation_seconds"] = time.perf_counter() - started
    text = json.dumps(json_safe(report), indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(render_table(report))
    return 0


def _fmt(value: object, pct: bool = False) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def render_table(report: dict[str, Any]) -> str:
    """The evaluation report as the Markdown table the README shows (model and baselines side by side)."""
    d = report["definitions"]
    warning, period = d["warning_s"] / 60, d["period_s"] / 60
    rows = [
        ("model", report["model"]),
        ("model, dcgm-exporter defaults only", report["model_dcgm_default_metrics"]),
        ("logistic regression", report["logistic"]),
        ("rules (DCGM + NVSentinel)", report["rules"]),
    ]
    lines = [
        f"held-out: {report['test_gpu_days']:.0f} GPU-days, {report['test_failures']} failures; minimal warning "
        f"{warning:.0f} min, prediction period {period:.0f} min",
        f"| method | recall >={warning:.0f} min, predictable modes | recall >={warning:.0f} min | recall >=1 min "
        "| lead p10 / median / p90 (min) | false alarms / 1,000 GPU-days | of which premature | of which false "
        "| alert precision | PR-AUC |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in rows:
        leads = " / ".join(_fmt(m[k]) for k in ("p10_lead_min", "median_lead_min", "p90_lead_min"))
        lines.append(
            f"| {name} | {_fmt(m['recall_5min_predictable'], True)} | {_fmt(m['recall_5min'], True)} "
            f"| {_fmt(m['recall_1min'], True)} | {leads} | {_fmt(m['false_alarms_per_1000_gpu_days'])} "
            f"| {_fmt(m['premature_alarms_per_1000_gpu_days'])} | {_fmt(m['false_only_alarms_per_1000_gpu_days'])} "
            f"| {_fmt(m['alert_precision'], True)} | {_fmt(m['pr_auc'])} |"
        )
    lines.append(
        f"recall at >={warning:.0f} min by mode (model): "
        + ", ".join(f"{mode} {_fmt(v, True)}" for mode, v in report["model"]["recall_by_mode"].items())
    )
    return "\n".join(lines)
