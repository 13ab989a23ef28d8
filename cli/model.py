"""`faultcast train` and `faultcast evaluate`."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultcast.cli import model_digest
from faultcast.cli.paths import create_parents, missing_input, refuse, uncreatable
from faultcast.cli.types import Subcommands, duration

if TYPE_CHECKING:  # the model package loads on demand: `faultcast --help` stays quick
    from faultcast.model.manifest import ModelManifest


def add_parsers(commands: Subcommands) -> None:
    """Add `faultcast train`, `faultcast evaluate` and `faultcast model-digest`."""
    train = commands.add_parser(
        "train", help="train the failure-prediction model on telemetry and a failure log"
    )
    train.add_argument(
        "--data",
        type=Path,
        required=True,
        action="append",
        help="a `faultcast simulate` output (or an import); repeat for several worlds: the last one "
        "validates (early stopping, calibration, thresholds), the others train",
    )
    train.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="feature names (fnmatch, e.g. 'gpu_temp_*') the booster may not use; repeatable",
    )
    train.add_argument(
        "--booster-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=_booster_param,
        help="a LightGBM parameter of the risk booster over faultcast's defaults; repeatable (across worlds "
        "leave-world-out validation chose num_leaves=15 min_data_in_leaf=200 lambda_l2=10 feature_fraction=0.5)",
    )
    train.add_argument(
        "--hard-negative-rate",
        type=float,
        default=0.0,
        help="share kept of the healthy rows on which a shipped rule fires (look-alikes of a failing part)",
    )
    train.add_argument(
        "--ignore-before-failure",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="leave out of training the rows this long before a failure that carried a precursor, beyond "
        "the 30-min horizon (a precursor already running there is no negative), e.g. 2h; default 0: none",
    )
    train.add_argument(
        "--sample-seed",
        type=int,
        help="seed of the negatives' sampling (default: --seed); fixed while --seed varies, the rows stay "
        "the same and only the booster's randomness changes",
    )
    train.add_argument(
        "--rows-cache",
        metavar="DIR",
        help="keep each world's sampled rows here, and reuse them when the data, features and sampling "
        "are the same (trying booster settings or exclusions without replaying the worlds)",
    )
    train.add_argument(
        "--validation-worlds",
        type=_positive,
        default=1,
        metavar="N",
        help="across worlds: the last N --data validate, pooled (calibration, thresholds, the validation "
        "recall); default 1",
    )
    train.add_argument(
        "--folds",
        type=_positive,
        default=1,
        help="across worlds: early stopping by cross-validation over this many groups of the training "
        "worlds, then one booster on all of them (default 1: early stopping on the validation worlds)",
    )
    train.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        help="worlds replayed at once by local processes (without --dask-scheduler; with it, the "
        "cluster's workers replay them)",
    )
    train.add_argument(
        "--balance-modes",
        action="store_true",
        help="weigh each failure mode's positive rows alike in the booster (rare modes up to 10x)",
    )
    train.add_argument(
        "--node-history",
        action="store_true",
        help="add the node-history features: each GPU's and node's own failures before each row, from the "
        "data's failure log (online: the service's label log; docs/model.md)",
    )
    train.add_argument(
        "--no-blend",
        action="store_true",
        help="serve the booster alone, even where stacking it with the logistic baseline catches more of "
        "the validation failures at the same false-alarm budget",
    )
    train.add_argument(
        "--no-monotone",
        action="store_true",
        help="let the booster treat more hardware errors as less risk where the data says so",
    )
    train.add_argument(
        "--out", type=Path, required=True, help="the model directory to write (created when missing)"
    )
    train.add_argument("--horizon", type=duration, default=1800.0, help="predict failures this far ahead")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--negative-rate", type=float, default=0.02, help="share of negative rows sampled")
    train.add_argument(
        "--false-alarm-budget", type=float, default=0.5, help="per 1,000 GPU-days on validation"
    )
    train.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="run on this Dask cluster (tcp://host:8786): each world's replay on its workers, and the "
        "booster through lightgbm.dask (without --folds)",
    )
    train.set_defaults(handler=run_train)

    evaluate = commands.add_parser(
        "evaluate",
        help="event-level evaluation on the data the model never trained on, with intervals and baselines "
        "matched to its false-alarm rate",
    )
    evaluate.add_argument("--model", type=Path, help="the model directory (default: the shipped model)")
    evaluate.add_argument(
        "--data",
        type=Path,
        required=True,
        action="append",
        help="data to measure recall on (repeat for several: each is reported, then all pooled)",
    )
    evaluate.add_argument(
        "--false-alarm-data",
        type=Path,
        action="append",
        default=[],
        help="data to measure false alarms on at the same thresholds, typically a twin at --acceleration 1 "
        "(repeatable: pooled)",
    )
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
    evaluate.add_argument(
        "--resamples", type=int, default=1000, help="bootstrap resamples of the nodes for the 95%% intervals"
    )
    evaluate.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap")
    evaluate.add_argument(
        "--reference",
        action="append",
        default=[],
        type=_reference,
        metavar="DATA_DIR=MODEL_DIR",
        help="the in-world ceiling of one --data: a model trained with the same recipe on other fleets of that "
        "data's world (bench/ceiling.sh); its recall at the model's false alarms is the ceiling, and the "
        "model's recall is reported as a share of it (repeatable, one per --data)",
    )
    evaluate.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        help="scorings run at once by local processes, each dataset's nodes split among them when there "
        "are more processes than scorings (the figures are the same whatever the number)",
    )
    evaluate.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="score on this Dask cluster (tcp://host:8786) instead, split for all its worker threads",
    )
    evaluate.set_defaults(handler=run_evaluate)
    model_digest.add_parser(commands)


def _dask_client(address: str | None) -> Any:
    """A client of the Dask scheduler at `address`; None without one."""
    if not address:
        return None
    from distributed import Client

    return Client(address)


def _of_worlds(dataset: Any, world_ids: Sequence[str]) -> bool:
    """Whether the data was drawn from one of these worlds (its manifest's world id)."""
    from faultcast.model.evaluation.worlds import world_of

    world = world_of(dataset.manifest)
    return world is not None and world.id in world_ids


def _positive(text: str) -> int:
    """A whole number of at least 1, for argparse."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _booster_param(text: str) -> tuple[str, float | int | str]:
    """NAME=VALUE, the value a number where it reads as one."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            continue
    return name, value


def _reference(text: str) -> tuple[Path, Path]:
    """DATA_DIR=MODEL_DIR."""
    data, sep, model = text.partition("=")
    if not sep or not data or not model:
        raise argparse.ArgumentTypeError(f"{text!r} is not DATA_DIR=MODEL_DIR")
    return Path(data), Path(model)


def references_by_data(pairs: list[tuple[Path, Path]], data: list[Path]) -> dict[Path, Path]:
    """--reference as {resolved data dir: model dir}; ValueError when a DATA_DIR is not one of --data
    or has two references."""
    given = {p.resolve() for p in data}
    out: dict[Path, Path] = {}
    for where, model in pairs:
        key = where.resolve()
        if key not in given:
            raise ValueError(f"--reference {where}={model}: {where} is not one of the --data directories")
        if key in out:
            raise ValueError(f"--reference: {where} has two references ({out[key]} and {model})")
        out[key] = model
    return out


def run_train(args: argparse.Namespace) -> int:
    """`faultcast train`: train on a data directory, write the model; returns the exit status."""
    from faultcast.model.features.offline import DataError, open_dataset
    from faultcast.model.training.train import TrainConfig, train

    cache = Path(args.rows_cache) if args.rows_cache else None
    why = missing_input([("--data", path) for path in args.data]) or uncreatable(
        [("--out", args.out), ("--rows-cache", cache)]
    )
    if why is not None:  # before minutes of replay: the model is written at the end
        return refuse("train", why)
    try:
        datasets = [open_dataset(path) for path in args.data]
        config = TrainConfig(
            horizon_s=args.horizon,
            seed=args.seed,
            negative_rate=args.negative_rate,
            false_alarm_budget=args.false_alarm_budget,
            monotone_errors=not args.no_monotone,
            exclude=tuple(args.exclude),
            rows_cache=args.rows_cache,
            hard_negative_rate=args.hard_negative_rate,
            ignore_before_failure_s=args.ignore_before_failure,
            booster_params=tuple(args.booster_param),
            sample_seed=args.sample_seed,
            validation_worlds=args.validation_worlds,
            folds=args.folds,
            jobs=args.jobs,
            blend=not args.no_blend,
            balance_modes=args.balance_modes,
            node_history=args.node_history,
        )
        client = _dask_client(args.dask_scheduler)
        model = train(datasets, args.out, config, dask_client=client)
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
    recall = m.validation_recall_5min_predictable
    judged = (
        f"; recall >=5 min of its {recall.failures} failures with a precursor: model {recall.model:.1%}, "
        f"logistic regression at the same budget {recall.logistic:.1%}"
        if recall is not None and recall.failures
        else ""
    )
    served = ""
    if (
        m.served is not None
        and m.validation_recall_booster is not None
        and m.validation_recall_blend is not None
    ):
        served = (
            f"; serving the {m.served} (booster alone {m.validation_recall_booster:.1%}, stacked with "
            f"logistic regression {m.validation_recall_blend:.1%})"
        )
    folds = (
        f", early stopping over {len(m.fold_best_iterations)} folds of worlds"
        if m.fold_best_iterations
        else ""
    )
    return (
        f"wrote {out}: {m.training_rows:,} rows ({m.training_positives:,} positive), "
        f"{m.best_iteration} trees{folds}, threshold {card.threshold:.3g} "
        f"({false_alarms:.2f} false alarms per 1,000 GPU-days "
        f"on {m.validation_gpu_days:.0f} validation GPU-days{judged}{served}), "
        f"in {timings.total_s:.0f} s"
    )


def run_evaluate(args: argparse.Namespace) -> int:
    """`faultcast evaluate`: the event-level evaluation on held-out data, as a table or JSON."""
    from faultcast.model.artifact import ModelError, load
    from faultcast.model.evaluation.evaluate import Scored, evaluate, json_safe, pooled_report
    from faultcast.model.evaluation.outcomes import PredictionPeriods
    from faultcast.model.evaluation.score_jobs import score_datasets
    from faultcast.model.features.offline import DataError, Dataset, open_dataset
    from faultcast.model.shipped import shipped_model_dir

    if not 0 <= args.warning_time < args.prediction_period:
        print(
            "faultcast evaluate: the warning time must be shorter than the prediction period", file=sys.stderr
        )
        return 2
    if args.resamples < 1:
        print("faultcast evaluate: --resamples must be at least 1", file=sys.stderr)
        return 2
    from faultcast.model.evaluation.ceiling import (
        CeilingError,
        check_reference,
        measure_ceiling,
        pooled_ceiling,
    )

    why = missing_input(
        [
            ("--model", args.model),
            *(("--data", path) for path in args.data),
            *(("--false-alarm-data", path) for path in args.false_alarm_data),
            *(("--reference", path) for pair in args.reference for path in pair),
        ]
    ) or create_parents([("--json", args.json)])
    if why is not None:
        return refuse("evaluate", why)
    try:
        model = load(args.model if args.model is not None else shipped_model_dir())
        datasets = [open_dataset(path) for path in args.data]
        apart = [open_dataset(path) for path in args.false_alarm_data]
        wanted = references_by_data(args.reference, args.data)
        references = {key: (load(where), where) for key, where in wanted.items()}
        checks = {}
        for d in datasets:  # refused before anything is scored
            if d.path.resolve() in references:
                ref, where = references[d.path.resolve()]
                checks[d.path.resolve()] = check_reference(d, ref.card.training_data, where, apart)
    except (ModelError, DataError, ValueError) as exc:  # CeilingError is a ValueError
        print(f"faultcast evaluate: {exc}", file=sys.stderr)
        return 2
    from faultcast.model.evaluation.evaluate import WARMUP_S

    short = [d.path for d in (*datasets, *apart) if d.end_s - d.start_s <= WARMUP_S]
    if short:
        print(
            f"faultcast evaluate: nothing to score in {', '.join(map(str, short))}: the data must run longer "
            f"than the features' {WARMUP_S / 3600:g} h warm-up",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    periods = PredictionPeriods(args.warning_time, args.prediction_period)
    resampling = (args.resamples, args.bootstrap_seed)
    # Every scoring at once (data given both ways is scored once), in --jobs processes or on the cluster.
    distinct = list({d.path.resolve(): d for d in (*apart, *datasets)}.values())
    # A reference scores its dataset and the false-alarm data of its own world(s) (ceiling._apart).
    apart_paths = {d.path.resolve() for d in apart}
    wanted_by_reference = [
        (
            references[key][0],
            [
                d
                for d in distinct
                if d.path.resolve() == key
                or (d.path.resolve() in apart_paths and _of_worlds(d, check.world_ids))
            ],
        )
        for key, check in checks.items()
    ]
    client = _dask_client(args.dask_scheduler)
    all_scored, by_reference = score_datasets(
        distinct, model, wanted_by_reference, processes=args.jobs, client=client
    )
    scored: dict[Path, Scored] = {s.dataset.path.resolve(): s for s in all_scored}
    reference_scores = dict(zip(checks, by_reference, strict=True))

    def scored_once(dataset: Dataset) -> Scored:
        return scored[dataset.path.resolve()]

    scored_apart = [scored_once(d) for d in apart]
    done = [evaluate(scored_once(d), model, periods, scored_apart, *resampling) for d in datasets]
    ceilings, with_reference = [], []
    try:
        for d, e in zip(datasets, done, strict=True):
            if d.path.resolve() in references:
                with_reference.append(str(d.path))
                ref, where = references[d.path.resolve()]
                ceiling = measure_ceiling(
                    scored_once(d), e, ref, where, periods, scored_apart, *resampling,
                    done=reference_scores[d.path.resolve()],
                )  # fmt: skip
                e.report["ceiling"] = ceiling.report
                ceilings.append(ceiling)
    except CeilingError as exc:
        print(f"faultcast evaluate: {exc}", file=sys.stderr)
        return 2
    report: dict[str, Any]
    if len(done) == 1:
        report = done[0].report  # one dataset: the report as it always was
    else:
        report = {
            "definitions": done[0].report["definitions"],
            "datasets": [e.report for e in done],
            "pooled": pooled_report(done, *resampling),
        }
        if ceilings:  # over the datasets that have a reference (all of them, or say which)
            every = len(ceilings) == len(done)
            report["pooled"]["ceiling"] = pooled_ceiling(ceilings, with_reference, every, *resampling)
    report["evaluation_seconds"] = time.perf_counter() - started
    text = json.dumps(json_safe(report), indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    tables = [render_table(e.report) for e in done]
    if len(done) > 1:
        tables.append(render_pooled(report["pooled"], args.warning_time / 60))
    print("\n\n".join(tables))
    return 0


def _rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The method rows of a report, in its order: the entries that carry a label."""
    return [(v["label"], v) for v in report.values() if isinstance(v, dict) and "label" in v]


def _fmt(value: object, pct: bool = False) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def _count(value: object) -> str:
    return str(value) if isinstance(value, int) else "-"


def _cell(m: dict[str, Any], key: str, pct: bool = False) -> str:
    """A figure and its interval, "81.8% (69.7-89.8)"; a false-alarm rate of zero with its upper bound."""
    value = m.get(key)
    upper = m.get("false_alarms_upper95_per_1000_gpu_days")
    if key == "false_alarms_per_1000_gpu_days" and value == 0 and isinstance(upper, int | float):
        return f"{_fmt(value)} (< {upper:.2f})"
    lo, hi = m.get("ci95", {}).get(key) or (None, None)
    if not isinstance(lo, int | float) or not isinstance(hi, int | float) or _fmt(value) == "-":
        return _fmt(value, pct)
    scale, digits = (100.0, 1) if pct else (1.0, 2)
    return f"{_fmt(value, pct)} ({scale * lo:.{digits}f}-{scale * hi:.{digits}f})"


def _setting(m: dict[str, Any]) -> str:
    scale, threshold = m.get("scale"), m.get("threshold")
    if isinstance(scale, int | float):
        return f"x{scale:g}"
    return f"{threshold:.4g}" if isinstance(threshold, int | float) else "-"


def _table(rows: list[tuple[str, dict[str, Any]]], warning_min: float) -> list[str]:
    w = f"{warning_min:.0f}"
    lines = [
        f"| method | setting | recall >={w} min, predictable | recall >={w} min, all | recall >=1 min "
        "| lead p10 / median / p90 (min) | false alarms / 1,000 GPU-days | of which premature | of which false "
        "| alerts: true / late | alert precision | PR-AUC |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in rows:
        if m.get("within_target") is False:
            name += " (no setting reached it: the fewest false alarms)"
        leads = (
            f"{_fmt(m.get('p10_lead_min'))} / {_cell(m, 'median_lead_min')} / {_fmt(m.get('p90_lead_min'))}"
        )
        lines.append(
            f"| {name} | {_setting(m)} | {_cell(m, 'recall_5min_predictable', True)} "
            f"| {_cell(m, 'recall_5min', True)} | {_cell(m, 'recall_1min', True)} | {leads} "
            f"| {_cell(m, 'false_alarms_per_1000_gpu_days')} | {_cell(m, 'premature_alarms_per_1000_gpu_days')} "
            f"| {_cell(m, 'false_only_alarms_per_1000_gpu_days')} "
            f"| {_count(m.get('true_alarms'))} / {_count(m.get('late_alarms'))} "
            f"| {_cell(m, 'alert_precision', True)} | {_fmt(m.get('pr_auc'))} |"
        )
    return lines


def _mode_table(rows: list[tuple[str, dict[str, Any]]], warning_min: float) -> list[str]:
    """Per failure mode, every method: of the failures that carried a precursor, how many it caught at
    >= the warning time, and their median lead (minutes)."""
    rows = [(name, m) for name, m in rows if "by_mode" in m]
    if not rows:
        return []
    modes = sorted({mode for _, m in rows for mode in m["by_mode"]})
    lines = [
        f"by mode: caught >={warning_min:.0f} min of the failures that carried a precursor (median lead, min)",
        "| mode | failures | with a precursor | " + " | ".join(name for name, _ in rows) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in rows) + " |",
    ]
    for mode in modes:
        first = next(m["by_mode"][mode] for _, m in rows if mode in m["by_mode"])
        cells = []
        for _, m in rows:
            t = m["by_mode"].get(mode)
            if t is None or not t["predictable"]:
                cells.append("-")
                continue
            lead = f" ({t['median_lead_min']:.0f})" if t["predictable_caught"] else ""
            cells.append(f"{t['predictable_caught']}/{t['predictable']}{lead}")
        lines.append(
            f"| {mode} | {first['failures']} | {_count(first['predictable'])} | " + " | ".join(cells) + " |"
        )
    return lines


def _acceleration(source: dict[str, Any]) -> str:
    a = source.get("acceleration")
    return f"acceleration {a:g}" if isinstance(a, int | float) else "acceleration unknown"


def _data_line(report: dict[str, Any]) -> str:
    data, world = report["data"], report["world"]
    parts = [_acceleration(data)]
    if world.get("id"):
        seed = f", seed {world['seed']}" if world.get("seed") is not None else ""
        parts.append(f"world {world['id']} ({world.get('family')}{seed})")
    unseen = {True: "yes", False: "no", None: "unknown"}[world.get("unseen_world")]
    how = f", by {world['compared_by']}" if world.get("compared_by") else ""
    parts.append(f"unseen by the model: {unseen}{how}")
    return f"data: {data['path']} ({'; '.join(parts)})"


def _false_alarm_lines(block: dict[str, Any]) -> list[str]:
    sources = ", ".join(f"{d['path']} ({_acceleration(d)})" for d in block["data"])
    methods = block["methods"]
    first = next(iter(methods.values()))
    lines = [
        f"false alarms measured apart, at the same settings: {sources}; {first['gpu_days']:.0f} GPU-days "
        f"on {first['nodes']} nodes",
        "| method | false alarms / 1,000 GPU-days | of which premature | of which false | alerts |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in methods.values():
        lines.append(
            f"| {m['label']} | {_cell(m, 'false_alarms_per_1000_gpu_days')} "
            f"| {_cell(m, 'premature_alarms_per_1000_gpu_days')} "
            f"| {_cell(m, 'false_only_alarms_per_1000_gpu_days')} | {m['alerts']} |"
        )
    return lines


def render_table(report: dict[str, Any]) -> str:
    """One dataset's evaluation as Markdown: what was evaluated (leave-world-out or the training
    world), each method as shipped and the baselines matched to the model's false-alarm rate, every
    figure with its 95% interval, the false alarms measured apart, and the notes."""
    d = report["definitions"]
    warning, period = d["warning_s"] / 60, d["period_s"] / 60
    ceiling = report.get("ceiling")
    lines = [
        f"{report['world']['evaluation']}: {report['test_gpu_days']:.0f} GPU-days on "
        f"{len(report['test_nodes'])} nodes, {report['test_failures']} failures; minimal warning "
        f"{warning:.0f} min, prediction period {period:.0f} min",
        _data_line(report),
        f"(lo-hi): {d['ci95']}",
        *_table(_rows(report) + _ceiling_rows(ceiling), warning),
        "",
        *_mode_table(_rows(report) + _ceiling_rows(ceiling), warning),
    ]
    if ceiling:
        lines += _ceiling_lines(ceiling, warning)
    if report.get("false_alarm_data"):
        lines += ["", *_false_alarm_lines(report["false_alarm_data"])]
    lines += [f"note: {note}" for note in report.get("notes", [])]
    return "\n".join(lines)


def render_pooled(pooled: dict[str, Any], warning_min: float) -> str:
    """The pooled summary of several datasets as Markdown."""
    unseen = ", ".join("unknown" if u is None else str(u).lower() for u in pooled["unseen_world"])
    paths = ", ".join(d["path"] for d in pooled["data"])
    ceiling = pooled.get("ceiling")
    beside = ceiling if ceiling and ceiling.get("every_dataset", True) else None  # the same data only
    lines = [
        f"pooled over {len(pooled['data'])} datasets ({paths}; unseen world: {unseen}): "
        f"{pooled['test_gpu_days']:.0f} GPU-days, {pooled['test_failures']} failures; a matched row sums "
        "each dataset's own match",
        *_table(_rows(pooled) + _ceiling_rows(beside), warning_min),
        "",
        *_mode_table(_rows(pooled) + _ceiling_rows(beside), warning_min),
    ]
    if ceiling and beside is None:
        rows = [(ceiling["model"]["label"], ceiling["model"]), *_ceiling_rows(ceiling)]
        lines += [
            "",
            f"the in-world ceiling pooled over the {len(ceiling['data'])} datasets with a reference "
            f"({', '.join(ceiling['data'])}):",
            *_table(rows, warning_min),
        ]
    if ceiling:
        lines += _ceiling_lines(ceiling, warning_min)
    return "\n".join(lines)


def _ceiling_rows(block: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """The in-world ceiling's rows for the method table: the reference at its own threshold and matched."""
    if not block:
        return []
    return [(block[key]["label"], block[key]) for key in ("own_threshold", "matched") if key in block]


def _ceiling_lines(block: dict[str, Any], warning_min: float) -> list[str]:
    """What the ceiling is, the model's share of it, and the per-mode rows beside it."""
    w = f"{warning_min:.0f}"
    share = block["share_of_ceiling"]
    lo, hi = share.get("ci95") or (None, None)
    spread = f" ({100 * lo:.1f}-{100 * hi:.1f})" if lo is not None and hi is not None else ""
    lines = []
    ref = block.get("reference")
    if ref:
        worlds = ", ".join(ref["training_worlds"])
        size = ref.get("training_gpu_days")
        days = f", {size:,.0f} GPU-days" if isinstance(size, int | float) else ""
        lines.append(
            f"in-world ceiling: reference {ref['model']}, trained on world {worlds} "
            f"({len(ref['training_data'])} datasets{days}; a lower bound of what is learnable)"
        )
    lines.append(
        f"share of the in-world ceiling (the model's recall >={w} min of predictable failures over the "
        f"reference's at no more false alarms than the model): {_fmt(share['recall_5min_predictable'], True)}"
        f"{spread}; over the reference at its own threshold: {_fmt(share['own_threshold'], True)}"
    )
    apart = block.get("false_alarm_data")
    if apart:
        methods = apart["methods"]
        lines.append(
            "the ceiling's false alarms on the false-alarm data: "
            + ", ".join(
                f"{m['label']} {_cell(m, 'false_alarms_per_1000_gpu_days')}" for m in methods.values()
            )
            + " per 1,000 GPU-days"
        )
    lines += [
        f"| mode | failures | with a precursor | model recall >={w} min | ceiling recall >={w} min "
        "| share of ceiling |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, m in block["by_mode"].items():
        lines.append(
            f"| {mode} | {m['failures']} | {_count(m['predictable'])} | {_fmt(m['model_recall'], True)} "
            f"| {_fmt(m['ceiling_recall'], True)} | {_fmt(m['share_of_ceiling'], True)} |"
        )
    return lines
