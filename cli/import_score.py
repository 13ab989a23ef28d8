"""`faultcast import-prometheus` and `faultcast score`: real history in, the alerts a model would raise out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from faultcast.cli.paths import create, create_parents, missing_file, missing_input, refuse, uncreatable
from faultcast.cli.types import Subcommands, duration, limit


def add_parsers(commands: Subcommands) -> None:
    """Add `faultcast import-prometheus` and `faultcast score`."""
    imp = commands.add_parser(
        "import-prometheus",
        help="turn a running Prometheus (--url) or a range-query export (dcgm-exporter's classic or DCGM 4.6's "
        "canonical names) and a failure log into training data",
    )
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--export",
        type=Path,
        help="a /api/v1/query_range JSON answer, a JSON list of them, or a directory of .json files",
    )
    source.add_argument(
        "--url",
        help="a Prometheus server (http://host:9090): its series read through query_range, with each step's "
        "min/max/mean of the summarised gauges (min/avg/max_over_time) where the raw series is finer",
    )
    imp.add_argument(
        "--since",
        default="7d",
        help="with --url: the first time to read (unix seconds, ISO 8601, or a duration before now; default 7d)",
    )
    imp.add_argument("--until", default="now", help="with --url: the last time to read (default now)")
    imp.add_argument(
        "--step",
        type=duration,
        default=60.0,
        help="with --url: the grid step, and the span each summary covers (default 60s, the model's cadence)",
    )
    imp.add_argument(
        "--fetch-dir",
        type=Path,
        help="with --url: where the answers are kept as export files (default OUT/prometheus-export); a rerun "
        "after an interruption fetches only what is missing",
    )
    imp.add_argument(
        "--bearer-token-file",
        type=Path,
        help="with --url: a file holding a bearer token for a Prometheus behind authentication (basic auth: "
        "http://user:password@host:9090)",
    )
    imp.add_argument(
        "--attempts",
        type=int,
        default=5,
        help="with --url: tries of each call before giving up, 1 s, 2 s, 4 s ... apart (default 5)",
    )
    imp.add_argument(
        "--request-deadline",
        type=duration,
        default=300.0,
        help="with --url: the most one call may take, its answer read whole, its retries and the waits "
        "between them included; a server that sends a byte now and then is cut off (default 5m)",
    )
    imp.add_argument(
        "--fetch-deadline",
        type=duration,
        default=3600.0,
        help="with --url: the most the whole fetch may take, however slowly the server answers; past it "
        "the import stops, and the same command resumes the fetch (default 1h)",
    )
    imp.add_argument(
        "--max-answer-mib",
        type=int,
        default=128,
        help="with --url: the largest answer read, in MiB (default 128; the fetch sizes its queries to "
        "answers of some 25 to 45 MiB, and one takes about seven times its size in memory)",
    )
    imp.add_argument(
        "--points",
        type=int,
        default=11_000,
        help="with --url: evaluation points per query at most (default 11000, Prometheus's limit per series)",
    )
    imp.add_argument(
        "--failures",
        type=Path,
        help="failure log CSV: timestamp,node,gpu,mode[,xid,uuid,description] (gpu empty: the whole node); "
        "without it the data can be scored but not trained on",
    )
    imp.add_argument("--out", type=Path, required=True, help="the data directory to write")
    imp.add_argument(
        "--interval",
        type=duration,
        help="with --export: the grid step (default: the median spacing of the samples)",
    )
    imp.add_argument("--gpus-per-node", type=int, help="default: the highest gpu label + 1")
    imp.add_argument(
        "--node-label",
        action="append",
        default=[],
        help="label naming the node, tried before Hostname, hostname and instance (repeatable)",
    )
    imp.add_argument(
        "--frozen-after",
        type=limit,
        default=3600.0,
        help="a GPU whose every gauge stays bit-identical this long is a frozen exporter: those samples "
        "are written as missing (default 1h; 0 or off keeps them)",
    )
    imp.add_argument(
        "--spill-dir",
        type=Path,
        help="where the import spills samples while it streams (about 20 bytes a sample; default: the "
        "system's temporary directory)",
    )
    imp.set_defaults(handler=run_import)

    score = commands.add_parser("score", help="list the alerts a model would have raised on a data directory")
    score.add_argument("--model", type=Path, required=True, help="a `faultcast train` output")
    score.add_argument("--data", type=Path, required=True, help="an import or a `faultcast simulate` output")
    score.add_argument("--csv", type=Path, help="also write the alerts here")
    score.set_defaults(handler=run_score)


def run_import(args: argparse.Namespace) -> int:
    """`faultcast import-prometheus`: a Prometheus export and a failure log to a data directory."""
    from faultcast.model.features.offline import DataError
    from faultcast.model.importers.prometheus import DEFAULT_NODE_LABELS, import_prometheus

    labels = (*args.node_label, *(label for label in DEFAULT_NODE_LABELS if label not in args.node_label))
    why = (
        (
            f"--export {args.export}: no such file or directory"
            if args.export and not args.export.exists()
            else None
        )
        or missing_file([("--failures", args.failures), ("--bearer-token-file", args.bearer_token_file)])
        or uncreatable([("--out", args.out), ("--fetch-dir", args.fetch_dir)])
        or create([("--spill-dir", args.spill_dir)])
    )
    if why is not None:
        return refuse("import-prometheus", why)
    try:
        export, cadence = args.export, args.interval
        if args.url is not None:
            export, cadence = _fetch(args), args.step
        manifest = import_prometheus(
            export,
            args.failures,
            args.out,
            cadence_s=cadence,
            gpus_per_node=args.gpus_per_node,
            node_labels=labels,
            frozen_after_s=args.frozen_after,
            spill_dir=args.spill_dir,
        )
    except DataError as exc:
        print(f"faultcast import-prometheus: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output or spill folder that cannot be made or written
        print(f"faultcast import-prometheus: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "faultcast import-prometheus: interrupted; the same command resumes a --url fetch",
            file=sys.stderr,
        )
        return 130
    print(describe_import(args.out, manifest))
    return 0


def _fetch(args: argparse.Namespace) -> Path:
    """`--url`: the server's series into the fetch folder (resumed when it holds part of this fetch)."""
    from faultcast.model.features.offline import DataError
    from faultcast.model.importers.fetch import parse_time
    from faultcast.model.importers.prometheus import fetch_prometheus

    if args.interval is not None and args.interval != args.step:
        raise DataError("with --url the grid step is --step; --interval is for --export")
    until = parse_time(args.until)
    since = parse_time(args.since, now=until)
    folder = args.fetch_dir if args.fetch_dir is not None else args.out / "prometheus-export"
    if folder.resolve() == args.out.resolve():
        raise DataError("--fetch-dir must not be --out: the answers go in a folder of their own")
    from faultcast.model.importers.fetch import Client

    if args.attempts < 1:
        raise DataError(f"--attempts must be at least 1, got {args.attempts}")
    token = args.bearer_token_file.read_text().strip() if args.bearer_token_file else None
    if not (args.request_deadline > 0 and args.fetch_deadline > 0 and args.max_answer_mib >= 1):
        raise DataError(
            "--request-deadline and --fetch-deadline must be positive and --max-answer-mib at least 1"
        )
    client = Client(
        args.url,
        attempts=args.attempts,
        bearer_token=token,
        deadline_s=args.request_deadline,
        fetch_deadline_s=args.fetch_deadline,
        max_answer_bytes=args.max_answer_mib << 20,
    )
    report = fetch_prometheus(args.url, since, until, args.step, folder, points=args.points, client=client)
    print(
        f"read {client.shown}: {report.answers_fetched} answers fetched, {report.answers_reused} kept from an "
        f"earlier run, {report.retries} retries, {report.series:,} series; into {folder}"
    )
    if report.summarised:
        print(
            f"step summaries (min/max/mean over each {args.step:g} s step) of: {', '.join(report.summarised)}"
        )
    if report.coarse:
        print(
            f"no step summaries of {', '.join(report.coarse)}: scraped no finer than the step "
            "(scrape every 10 s or faster for the model's step features)"
        )
    return Path(folder)


def describe_import(out: Path, manifest: dict[str, Any]) -> str:
    """What an import wrote, in a few lines for the console."""
    config, rows = manifest["config"], manifest["rows"]
    lines = [
        f"wrote {out}: {manifest['gpus']} GPUs on {config['nodes']} nodes, {config['days'] * 24:.1f} h at "
        f"{config['cadence_s']:g} s ({rows['telemetry']:,} telemetry rows, {rows['network']:,} network rows, "
        f"{rows['failures']} failures)",
        f"mapped {len(manifest['mapped'])} catalogue metrics; derived {len(manifest['derived'])}; "
        f"missing {len(manifest['missing']['telemetry'])} GPU and {len(manifest['missing']['network'])} "
        "network metrics (the model treats them as absent)",
    ]
    summaries = manifest.get("step_summaries", {}).get("gpus", {})
    if summaries:
        lines.append(
            f"step summaries (each step's min, max, mean and scrapes) on {max(summaries.values())} GPUs: "
            + ", ".join(sorted({c.rsplit("_step_", 1)[0] for c in summaries if "_step_" in c}))
        )
    if manifest["samples_not_finite"]:
        lines.append(f"{manifest['samples_not_finite']:,} NaN/Inf samples became missing values")
    for series, how in manifest.get("units_converted", {}).items():
        lines.append(f"{series} converted to the catalogue's unit: {how}")
    not_used = manifest.get("not_used", {})
    if not_used:
        total = sum(entry["series"] for entry in not_used.values())
        lines.append(f"not used: {total} series of {len(not_used)} names:")
        for name, entry in list(not_used.items())[:12]:
            lines.append(f"  {name} ({entry['series']}): {entry['why']}")
        if len(not_used) > 12:
            lines.append(f"  ... and {len(not_used) - 12} more names (manifest.json, not_used)")
    frozen = manifest.get("frozen", {})
    if frozen.get("samples_blanked"):
        lines.append(
            f"frozen exporters: {frozen['samples_blanked']:,} GPU-steps of {frozen['gpus']} GPUs written as "
            f"missing (every gauge bit-identical for over {frozen['threshold_s'] / 60:g} min):"
        )
        for node, entry in frozen["by_node"].items():
            lines.append(
                f"  {node}: {entry['gpus']} GPUs, {entry['spans']} spans, {entry['hours']:.1f} GPU-hours"
            )
    if manifest.get("nodes_without_gpus"):
        shown = ", ".join(manifest["nodes_without_gpus"][:5])
        lines.append(
            f"{len(manifest['nodes_without_gpus'])} nodes have network series but no GPU series ({shown}...): "
            "do the exporters name nodes differently? (--node-label)"
        )
    if manifest["failures_outside_data"]:
        lines.append(f"{manifest['failures_outside_data']} failures fall outside the exported time range")
    if not manifest["failure_log"]:
        lines.append("no failure log: the data can be scored, not trained or evaluated on")
    return "\n".join(lines)


def run_score(args: argparse.Namespace) -> int:
    """`faultcast score`: the alerts a model would have raised on a data directory."""
    from faultcast.model.artifact import ModelError
    from faultcast.model.evaluation.batch_alerts import render_table, score, summary, write_csv
    from faultcast.model.features.offline import DataError

    why = missing_input([("--model", args.model), ("--data", args.data)]) or create_parents(
        [("--csv", args.csv)]
    )
    if why is not None:
        return refuse("score", why)
    note = cadence_note(args.model, args.data)
    if note:
        print(note)
    try:
        alerts = score(args.model, args.data)
    except (DataError, ModelError) as exc:
        print(f"faultcast score: {exc}", file=sys.stderr)
        return 2
    if alerts:
        print(render_table(alerts))
    print(summary(alerts))
    from faultcast.model.evaluation.visibility import of_data  # what the model could see in the data

    print(of_data(args.model, args.data).render())
    if args.csv:
        write_csv(alerts, args.csv)
        print(f"wrote {args.csv}")
    return 0


def cadence_note(model_dir: Path, data_dir: Path) -> str | None:
    """A note when the data's cadence (its manifest) differs from the one the model was trained at
    (its manifest's feature config), else None; None too when either manifest cannot say (scoring
    then reports what is wrong)."""
    import json

    from faultcast.schemas import current_data_manifest

    try:
        model = json.loads((model_dir / "manifest.json").read_text())
        data = current_data_manifest(json.loads((data_dir / "manifest.json").read_text()))
        model_cadence = float(model["features"]["cadence_s"])
        data_cadence = float(data["config"]["cadence_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if data_cadence == model_cadence:
        return None
    ratio = data_cadence / model_cadence
    if ratio > 1:
        effect = (
            f"{ratio:g} times the model's {model_cadence:g} s: scoring lays the data on the model's grid, "
            f"where only about one step in {ratio:g} has a sample"
        )
    else:
        effect = (
            f"finer than the model's {model_cadence:g} s: scoring keeps the last sample of each "
            f"{model_cadence:g} s step and leaves the rest"
        )
    return f"note: the data's cadence is {data_cadence:g} s, {effect} (scores may differ from training's)"
