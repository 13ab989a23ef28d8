"""Which prior serves a fleet's retrain better (issue 42, item 4): none, weighted twin rows, or a warm start
from the shipped model, each judged on later weeks of the same fleet that no retrain saw.

    nice -n 10 .venv/bin/python bench/prior_compare.py --family independent --world-seed 3 --seed 1 \\
        --nodes 12 --gpus-per-node 4 --train-weeks 2 --eval-weeks 2 --out out/retrain/prior-compare.json

One fleet of one world (family, world seed, seed) over train + eval weeks at `--acceleration`. Its first
`--train-weeks` are seeded into a service's archive (service/archive/seed.py) and its label log gets the
failures the service would have labelled (service/label_seed.py: fatal Xids, InfiniBand ports; no
precursor_s, as on a real fleet). `faultcast retrain` (window: the train weeks; holdout: the last one)
then trains three challengers on the same archive and labels:

- `none`: the fleet's rows alone;
- `twin`: beside one twin world (`--prior-family`, drawn here), its rows weighed by `--prior-weight`;
- `warm`: the shipped model's risk booster boosted on with the fleet's rows (`--warm-start`).

The shipped model (static) is measured beside them. Each is scored on the eval weeks and judged against
the world's full failure log (truth): recall of the failures that carried a precursor, warned >= 5 min
ahead, with a 95% bootstrap interval by node, (1) at the model's own threshold (what it would serve, its
false alarms beside) and (2) at the same false-alarm budget on the eval weeks for all (each model's
lowest threshold whose false alarms there stay within `--budget` per 1,000 GPU-days), with the paired
bootstrap interval (same nodes resampled for both) of each prior's recall minus `none`'s.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel, load
from faultcast.model.evaluation.evaluate import WARMUP_S, json_safe, score_period
from faultcast.model.evaluation.intervals import NodeTallies, resample_weights, weighted_figures
from faultcast.model.evaluation.matching import Setting
from faultcast.model.evaluation.outcomes import DEFAULT_PERIODS, ScoredPeriod, choose_threshold
from faultcast.model.evaluation.rows import Row, intervals, measure
from faultcast.model.features.offline import Dataset, open_dataset
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.service.archive.seed import seed_archive
from faultcast.service.label_seed import failure_time_ns, service_label
from faultcast.service.state.store import StateStore

DAY_S = 86_400.0
RECALL = "recall_5min_predictable"


def _faultcast(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faultcast", *args], capture_output=True, text=True, check=False
    )


def _simulate(
    out: Path, family: str, world_seed: int, seed: int, nodes: int, g: int, days: float, a: float
) -> Path:
    if not (out / "manifest.json").exists():
        done = _faultcast(
            "simulate", "--family", family, "--world-seed", str(world_seed), "--seed", str(seed),
            "--nodes", str(nodes), "--gpus-per-node", str(g), "--days", f"{days:g}",
            "--acceleration", f"{a:g}", "--out", str(out),
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"faultcast simulate failed: {done.stderr[-2000:]}")
    return out


def _retrain(
    state: Path, archive: Path, out: Path, args: argparse.Namespace, flags: list[str]
) -> subprocess.Popen[str]:
    """`faultcast retrain` started in the background (the three run at once, at the bench's own niceness),
    its output beside OUT."""
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "faultcast", "retrain", "--state-dir", str(state),
        "--archive", str(archive), "--out", str(out), "--window", f"{args.train_weeks * 7}d",
        "--holdout", "7d", "--seed", str(args.seed), *flags,
    ]  # fmt: skip
    log = out.with_name(out.name + ".log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)


def _measured(
    period: ScoredPeriod, data: Dataset, model: FaultModel, threshold: float, resamples: int
) -> tuple[dict[str, Any], NodeTallies]:
    row = Row("model", "model", Setting("model", threshold, model.policy))
    found = measure(row, period, data.failures, DEFAULT_PERIODS)
    ci = intervals(found.tallies, resamples)["ci95"]
    m = found.metrics
    figures = {
        "threshold": threshold,
        RECALL: m[RECALL],
        f"{RECALL}_ci95": ci[RECALL],
        "predictable": m["failures_predictable"],
        "predictable_caught": int(found.tallies.predictable_caught.sum()),
        "false_alarms": m["false_alarms"],
        "false_alarms_per_1000_gpu_days": m["false_alarms_per_1000_gpu_days"],
        "false_alarms_per_1000_gpu_days_ci95": ci["false_alarms_per_1000_gpu_days"],
    }
    return figures, found.tallies


def _paired(a: NodeTallies, b: NodeTallies, resamples: int) -> tuple[float, float]:
    """95% interval of a's recall of predictable failures minus b's, the same nodes resampled for both."""
    weights = resample_weights(len(a.gpu_days), resamples)
    diff = weighted_figures(a, weights)[RECALL] - weighted_figures(b, weights)[RECALL]
    diff = diff[np.isfinite(diff)]
    return (
        (float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))) if diff.size else (math.nan,) * 2
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    weeks = args.train_weeks + args.eval_weeks
    fleet_dir = _simulate(
        work / "fleet", args.family, args.world_seed, args.seed, args.nodes, args.gpus_per_node, weeks * 7,
        args.acceleration,
    )  # fmt: skip
    twin_dir = _simulate(
        work / "twin-prior", args.prior_family, args.prior_world_seed, args.seed, args.prior_nodes,
        args.gpus_per_node, args.prior_days, args.acceleration,
    )  # fmt: skip
    timings: dict[str, float] = {"simulate_s": time.perf_counter() - started}
    data = open_dataset(fleet_dir)
    train_end = data.start_s + args.train_weeks * 7 * DAY_S
    # The train weeks reach the archive; the labels the service would have recorded, the label log.
    archive, state = work / "archive", work / "state"
    for old in (archive, state):
        shutil.rmtree(old, ignore_errors=True)
    state.mkdir(parents=True)
    days = {
        time.strftime("%Y-%m-%d", time.gmtime(data.start_s + k * DAY_S)) for k in range(args.train_weeks * 7)
    }
    seed_archive(fleet_dir, archive, data.cadence_s, days)
    with (fleet_dir / "failures.csv").open(newline="", encoding="utf-8") as handle:
        log = list(csv.DictReader(handle))
    labels = [
        label for r in log if failure_time_ns(r) < train_end * 1e9 and (label := service_label(r)) is not None
    ]
    store = StateStore.in_dir(state)
    try:
        store.labels.add(labels, "prior-compare")
    finally:
        store.close()
    t0 = time.perf_counter()
    models = work / "models"
    priors = {
        "none": [],
        "twin": ["--prior", str(twin_dir), "--prior-weight", f"{args.prior_weight:g}"],
        "warm": ["--warm-start", str(args.shipped)],
    }
    todo = {n: f for n, f in priors.items() if not (args.reuse and (models / n / "manifest.json").exists())}
    running = {name: _retrain(state, archive, models / name, args, flags) for name, flags in todo.items()}
    said = {name: proc.wait() for name, proc in running.items()}
    timings["retrain_s"] = time.perf_counter() - t0
    for name, rc in said.items():
        if rc:
            raise SystemExit(f"retrain {name} failed: {(models / f'{name}.log').read_text()[-2000:]}")
    # Every model on the eval weeks, against the full failure log.
    t0 = time.perf_counter()
    candidates = {"static": args.shipped, **{name: models / name for name in priors}}
    nodes = list(range(len(data.nodes)))
    start = max(train_end, data.start_s + WARMUP_S)
    results: dict[str, Any] = {}
    tallies: dict[str, dict[str, NodeTallies]] = {}
    for name, path in candidates.items():
        model = load(path)
        period = score_period(data, model, nodes, start, data.end_s)
        own, own_t = _measured(period, data, model, model.threshold, args.resamples)
        matched, _ = choose_threshold(
            period, data.failures, "model", model.policy, NODE_LEVEL_MODES, args.budget, DEFAULT_PERIODS
        )
        at_budget, budget_t = _measured(period, data, model, matched, args.resamples)
        card = model.card.metrics
        results[name] = {
            "own_threshold": own,
            "at_budget": at_budget,
            "trees": model.booster.current_iteration(),
            "validation_recall": asdict(card.validation_recall_5min_predictable)
            if card and card.validation_recall_5min_predictable
            else None,
            "eval_gpu_days": period.gpu_days,
        }
        tallies[name] = {"own": own_t, "budget": budget_t}
        print(f"{name}: {json.dumps(json_safe(results[name]))}", flush=True)
    for name in ("twin", "warm", "static"):
        results[name]["vs_none_at_budget_ci95"] = _paired(
            tallies[name]["budget"], tallies["none"]["budget"], args.resamples
        )
    timings["score_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - started
    eval_failures = [r for r in log if failure_time_ns(r) >= start * 1e9]
    report: dict[str, Any] = json_safe(
        {
            "world": {
                "family": args.family, "world_seed": args.world_seed, "seed": args.seed, "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node, "train_weeks": args.train_weeks,
                "eval_weeks": args.eval_weeks, "acceleration": args.acceleration,
                "prior": {"family": args.prior_family, "world_seed": args.prior_world_seed,
                          "nodes": args.prior_nodes, "days": args.prior_days, "weight": args.prior_weight},
                "shipped": str(args.shipped), "budget_per_1000_gpu_days": args.budget,
            },
            "labels_seen": len(labels),
            "train_failures": sum(1 for r in log if failure_time_ns(r) < train_end * 1e9),
            "eval_failures": len(eval_failures),
            "eval_failures_with_precursor": sum(1 for r in eval_failures if float(r["precursor_s"] or 0) > 0),
            "models": results,
            "timings": timings,
        }
    )  # fmt: skip
    return report


def _pct(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.0f}%"


def table(report: dict[str, Any]) -> str:
    """The markdown table of the report."""
    lines = [
        "| prior | recall pred. >= 5 min, own threshold [95%] | FA / 1k GPU-days (own) | recall at the budget "
        "[95%] | minus none's [95%, paired] | trees |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in report["models"].items():
        own, budget = m["own_threshold"], m["at_budget"]
        lo, hi = own[f"{RECALL}_ci95"]
        blo, bhi = budget[f"{RECALL}_ci95"]
        diff = m.get("vs_none_at_budget_ci95")
        paired = f"[{100 * diff[0]:+.0f}, {100 * diff[1]:+.0f}] pts" if diff else "-"
        lines.append(
            f"| {name} | {_pct(own[RECALL])} ({own['predictable_caught']}/{own['predictable']}) "
            f"[{_pct(lo)}, {_pct(hi)}] | {own['false_alarms_per_1000_gpu_days']:.1f} | "
            f"{_pct(budget[RECALL])} ({budget['predictable_caught']}/{budget['predictable']}) "
            f"[{_pct(blo)}, {_pct(bhi)}] | {paired} | {m['trees']} |"
        )
    return "\n".join(lines)


def main() -> None:
    from faultcast.model.shipped import shipped_model_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["independent", "faultcast-twin"], default="independent")
    p.add_argument("--world-seed", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=12)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--train-weeks", type=int, default=2, help="weeks in the archive (the last holds out)")
    p.add_argument("--eval-weeks", type=int, default=2, help="later weeks no retrain sees")
    p.add_argument("--acceleration", type=float, default=400.0)
    p.add_argument("--prior-family", default="faultcast-twin")
    p.add_argument("--prior-world-seed", type=int, default=201)
    p.add_argument("--prior-nodes", type=int, default=8)
    p.add_argument("--prior-days", type=float, default=7.0)
    p.add_argument("--prior-weight", type=float, default=1.0)
    p.add_argument("--budget", type=float, default=5.0, help="false alarms per 1,000 GPU-days, eval weeks")
    p.add_argument("--shipped", type=Path, default=None, help="the shipped model (default: the package's)")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--reuse", action="store_true", help="keep the challengers a run before trained in --work")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.train_weeks < 2:
        p.error("--train-weeks must be at least 2: one to fit on, the last held out")
    args.shipped = args.shipped or shipped_model_dir()
    args.work = args.work or args.out.with_suffix(".work")
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(json.dumps(report["timings"]), flush=True)


if __name__ == "__main__":
    main()
