"""The fleet learning loop over weeks (issue 42's measurement): a deployment replayed week by week on a
fleet the shipped model never saw, labels arriving only as the service would see them.

    .venv/bin/python bench/fleet_loop.py --family independent --world-seed 3 --seed 1 \\
        --nodes 16 --gpus-per-node 4 --weeks 4 --acceleration 400 --out out/fleet-loop/independent-3-1.json

One world (family, world seed), one fleet of it (seed) over `weeks` x 7 days at `acceleration`, and the same
world's calm fleet (another seed) at acceleration 1 to count false alarms as a real fleet would raise them.
Week by week:

- the serving model (at first the shipped one, `--shipped`) serves the week; its figures on the week:
  recall of the failures that carried a precursor, warned at least 5 min ahead (with a 95% interval by
  node), and its false alarms per 1,000 GPU-days on the calm fleet at its threshold; beside it the static
  shipped model and the oracle (below), measured the same way;
- a challenger waiting for its shadow is scored on the same week (the shadow window) and judged by the
  service's own rule (service/shadow_compare.py) on the labels the service saw that week: the challenger
  is set to the threshold where its false alarms over the window are the serving model's or fewer (the
  serving model's false-alarm rate), and promoted only when it then catches more failures and the 90%
  paired bootstrap interval of the difference in catches lies above zero; it serves from the next week,
  at that threshold;
- at the week's end its days are seeded into the service's archive (service/archive/seed.py) and the
  label log gets the week's failures the service would have labelled (`service_label`); from the end of
  the second week, `faultcast retrain` (window: every week so far; holdout: the last week) trains the
  challenger shadowed the next week, and, on the same days with every failure of the world's log as its
  labels (the same data volume), the oracle measured the next week.

Labels as the service sees them (`service_label`): a failure whose Xid NVIDIA's catalogue calls a failure
of the GPU (faultcast.failure_signs.FATAL_XIDS: the service's FAILED event on the Xid counter, its mode
read from the catalogue as the service reads it), and an InfiniBand failure (its port leaves ACTIVE: a
node-level FAILED event). Not labels: application Xids (13, 43: software), a host failure (a silent node
is no label alone), NCCL timeouts (a trainer's report), silent data corruption and failures without an Xid
(nothing in the samples says they happened). The figures are measured against the world's full failure
log (truth); only training and the shadow see the service's labels.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from faultcast.model.artifact import FaultModel, load
from faultcast.model.evaluation.evaluate import WARMUP_S, json_safe, score_period
from faultcast.model.evaluation.matching import Setting
from faultcast.model.evaluation.outcomes import DEFAULT_PERIODS, ScoredPeriod
from faultcast.model.evaluation.rows import Row, intervals, measure
from faultcast.model.features.offline import Dataset, open_dataset
from faultcast.modes import FailureMode
from faultcast.service.archive.seed import seed_archive
from faultcast.service.label_seed import failure_time_ns, service_label
from faultcast.service.shadow_compare import Comparison, compare
from faultcast.service.state.labels import FailureLabel, LabelSource
from faultcast.service.state.models import ShadowStep
from faultcast.service.state.store import StateStore

WEEK_S = 7 * 86_400.0
DAY_S = 86_400.0
HORIZON_S = 1800.0  # retrain's default: how far ahead a failure labels a sample


@dataclass(frozen=True)
class Serving:
    """A model as it serves: its directory, the threshold it alerts at, and a name for the table."""

    name: str
    path: Path
    threshold: float


@dataclass
class Models:
    """Loaded models and their scorings, kept while the run needs them (each model is scored once per
    week and once on the calm fleet)."""

    loaded: dict[Path, FaultModel] = field(default_factory=dict)
    scored: dict[tuple[Path, str], ScoredPeriod] = field(default_factory=dict)

    def model(self, path: Path) -> FaultModel:
        if path not in self.loaded:
            self.loaded[path] = load(path)
        return self.loaded[path]

    def score(self, path: Path, key: str, data: Dataset, start_s: float, end_s: float) -> ScoredPeriod:
        if (path, key) not in self.scored:
            nodes = list(range(len(data.nodes)))
            self.scored[path, key] = score_period(data, self.model(path), nodes, start_s, end_s)
        return self.scored[path, key]


def oracle_label(row: dict[str, str]) -> FailureLabel:
    """Every failure of the world's log, with its true mode (the oracle's label log)."""
    return FailureLabel(
        row["node"], int(row["gpu"]) if row["gpu"] else -1, FailureMode(row["mode"]), failure_time_ns(row),
        LabelSource.HARVESTED, uuid=row["uuid"], xid=int(float(row["xid"])) if row["xid"] else 0,
    )  # fmt: skip


def _faultcast(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a faultcast command (the CLI an operator runs), its output kept for the log."""
    return subprocess.run(
        [sys.executable, "-m", "faultcast", *args], capture_output=True, text=True, check=False
    )


def _simulate(args: argparse.Namespace, out: Path, *, seed: int, days: float, acceleration: float) -> Path:
    if not (out / "manifest.json").exists():
        done = _faultcast(
            "simulate", "--family", args.family, "--world-seed", str(args.world_seed), "--seed", str(seed),
            "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node), "--days", f"{days:g}",
            "--acceleration", f"{acceleration:g}", "--out", str(out),
        )  # fmt: skip
        if done.returncode:
            raise SystemExit(f"faultcast simulate failed: {done.stderr[-2000:]}")
        print(done.stdout.strip().splitlines()[-1], flush=True)
    return out


def _retrain(state: Path, archive: Path, out: Path, weeks: int, args: argparse.Namespace) -> tuple[bool, str]:
    """`faultcast retrain` on every week so far, the last held out: (trained, what it said last); its
    whole output is kept beside the model (OUT.log)."""
    shutil.rmtree(out, ignore_errors=True)
    flags = [f for p in args.prior for f in ("--prior", str(p))]
    if args.prior:
        flags += ["--prior-weight", f"{args.prior_weight:g}"]
    done = _faultcast(
        "retrain", "--state-dir", str(state), "--archive", str(archive), "--out", str(out),
        "--window", f"{weeks * 7}d", "--holdout", "7d", "--seed", str(args.seed), *flags,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".log").write_text(done.stdout + done.stderr)
    said = (done.stderr if done.returncode else done.stdout).strip().splitlines() or ["no output"]
    return done.returncode == 0, said[-1]


def _days(start_s: float, end_s: float) -> set[str]:
    return {
        dt.datetime.fromtimestamp(start_s + k * DAY_S, tz=dt.UTC).strftime("%Y-%m-%d")
        for k in range(math.ceil((end_s - start_s) / DAY_S))
    }


def _figures(
    period: ScoredPeriod, data: Dataset, model: FaultModel, threshold: float, resamples: int
) -> dict[str, Any]:
    """Recall of predictable failures >= 5 min ahead (and of all), with 95% intervals, on `period`."""
    row = Row("model", "model", Setting("model", threshold, model.policy))
    measured = measure(row, period, data.failures, DEFAULT_PERIODS)
    ci = intervals(measured.tallies, resamples)["ci95"]
    m = measured.metrics
    return {
        "recall_5min_predictable": m["recall_5min_predictable"],
        "recall_5min_predictable_ci95": ci["recall_5min_predictable"],
        "recall_5min": m["recall_5min"],
        "recall_5min_ci95": ci["recall_5min"],
        "failures": m["failures"],
        "failures_caught": m["failures_caught"],
        "false_alarms_accelerated": m["false_alarms"],
    }


def _calm_figures(
    period: ScoredPeriod, calm: Dataset, model: FaultModel, threshold: float, resamples: int
) -> dict[str, Any]:
    """False alarms per 1,000 GPU-days on the calm fleet (acceleration 1) at `threshold`."""
    row = Row("model", "model", Setting("model", threshold, model.policy))
    measured = measure(row, period, calm.failures, DEFAULT_PERIODS)
    spread = intervals(measured.tallies, resamples)
    return {
        "false_alarms_per_1000_gpu_days": measured.metrics["false_alarms_per_1000_gpu_days"],
        "false_alarms_per_1000_gpu_days_ci95": spread["ci95"]["false_alarms_per_1000_gpu_days"],
        "false_alarms_upper95_per_1000_gpu_days": spread["false_alarms_upper95_per_1000_gpu_days"],
        "calm_false_alarms": measured.metrics["false_alarms"],
        "calm_gpu_days": float(measured.tallies.gpu_days.sum()),
    }


def _shadow_steps(serving: ScoredPeriod, challenger: ScoredPeriod, data: Dataset) -> list[ShadowStep]:
    """Each node's step under both models: the highest GPU risk of each, as the service's shadow keeps."""
    g = serving.gpus_per_node

    def per_node(period: ScoredPeriod) -> np.ndarray:
        risk = period.scores["model"].reshape(len(period.times_s), len(period.nodes), g)
        with np.errstate(all="ignore"):
            return np.where(
                np.all(np.isnan(risk), axis=2), np.nan, np.nanmax(np.nan_to_num(risk, nan=-1.0), axis=2)
            )

    a, b = per_node(serving), per_node(challenger)
    steps = []
    for i, t in enumerate(serving.times_s):
        for j, n in enumerate(serving.nodes):
            if math.isfinite(a[i, j]) and math.isfinite(b[i, j]):
                steps.append(ShadowStep(data.nodes[n], int(t * 1e9), float(a[i, j]), float(b[i, j])))
    return steps


def _judge(
    serving: ScoredPeriod,
    challenger: ScoredPeriod,
    data: Dataset,
    labels: list[FailureLabel],
    serving_threshold: float,
    challenger_threshold: float,
) -> tuple[Comparison, bool]:
    """The shadow's verdict on the challenger at the serving model's false alarms (module docstring)."""
    steps = _shadow_steps(serving, challenger, data)
    failures = [(f.node, f.time_ns) for f in labels]
    cadence = data.cadence_s
    own = compare(
        steps, failures, [], serving_threshold=serving_threshold, challenger_threshold=challenger_threshold,
        horizon_s=HORIZON_S, cadence_s=cadence,
    )  # fmt: skip
    if not math.isfinite(own.matched.threshold):
        return own, False
    matched = compare(
        steps, failures, [], serving_threshold=serving_threshold, challenger_threshold=own.matched.threshold,
        horizon_s=HORIZON_S, cadence_s=cadence,
    )  # fmt: skip
    return matched, matched.better and matched.extra_caught_low > 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole replay; returns every figure (also written to --out)."""
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    fleet_dir = _simulate(
        args, work / "fleet", seed=args.seed, days=args.weeks * 7, acceleration=args.acceleration
    )
    calm_dir = _simulate(args, work / "calm", seed=args.seed + 1000, days=args.calm_days, acceleration=1.0)
    simulated_s = time.perf_counter() - started
    data, calm = open_dataset(fleet_dir), open_dataset(calm_dir)
    with (fleet_dir / "failures.csv").open(newline="", encoding="utf-8") as handle:
        log = list(csv.DictReader(handle))
    seen = [(r, label) for r in log if (label := service_label(r)) is not None]
    archive, state, oracle_state = work / "archive", work / "state", work / "oracle-state"
    for old in (archive, state, oracle_state, work / "models"):
        shutil.rmtree(old, ignore_errors=True)
    state.mkdir(parents=True)
    oracle_state.mkdir(parents=True)
    models = Models()
    static = Serving("shipped", args.shipped, load(args.shipped).threshold)
    serving = static
    pending: Serving | None = None  # the challenger waiting for its shadow week
    oracle: Serving | None = None
    calm_start = calm.start_s + WARMUP_S
    weeks: list[dict[str, Any]] = []
    timings = {"simulate_s": simulated_s, "score_s": 0.0, "retrain_s": 0.0, "seed_s": 0.0}

    def figures(who: Serving, key: str, start: float, end: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        model = models.model(who.path)
        period = models.score(who.path, key, data, start, end)
        calm_period = models.score(who.path, "calm", calm, calm_start, calm.end_s)
        timings["score_s"] += time.perf_counter() - t0
        return {
            "model": who.name, "threshold": who.threshold,
            **_figures(period, data, model, who.threshold, args.resamples),
            **_calm_figures(calm_period, calm, model, who.threshold, args.resamples),
        }  # fmt: skip

    for w in range(args.weeks):
        week_start = data.start_s + w * WEEK_S
        week_end = min(week_start + WEEK_S, data.end_s)
        start = max(week_start, data.start_s + WARMUP_S)
        key = f"week-{w + 1}"
        row: dict[str, Any] = {
            "week": w + 1,
            "labels_seen": sum(1 for _, f in seen if week_start * 1e9 <= f.time_ns < week_end * 1e9),
            "serving": figures(serving, key, start, week_end),
            "static": figures(static, key, start, week_end),
            "oracle": figures(oracle, key, start, week_end) if oracle is not None else None,
            "shadow": None,
        }
        promoted: Serving | None = None
        if pending is not None:
            t0 = time.perf_counter()
            a = models.score(serving.path, key, data, start, week_end)
            b = models.score(pending.path, key, data, start, week_end)
            timings["score_s"] += time.perf_counter() - t0
            labels = [f for _, f in seen if week_start * 1e9 <= f.time_ns < week_end * 1e9]
            verdict, promote = _judge(a, b, data, labels, serving.threshold, pending.threshold)
            row["shadow"] = {
                "challenger": pending.name, "promoted": promote, "summary": verdict.summary(),
                "serving_caught": verdict.serving.caught, "serving_false_alarms": verdict.serving.false_alarms,
                "challenger_caught": verdict.challenger.caught,
                "challenger_false_alarms": verdict.challenger.false_alarms,
                "challenger_threshold": verdict.challenger.threshold, "failures": verdict.failures,
                "extra_caught_90": [verdict.extra_caught_low, verdict.extra_caught_high],
                "challenger_on_the_week": figures(
                    Serving(pending.name, pending.path, verdict.challenger.threshold), key, start, week_end
                ),
            }  # fmt: skip
            if promote:
                promoted = Serving(pending.name, pending.path, verdict.challenger.threshold)
            pending = None
        # The week ends: its days reach the archive, its labels the label logs.
        t0 = time.perf_counter()
        seed_archive(fleet_dir, archive, data.cadence_s, _days(week_start, week_end))
        timings["seed_s"] += time.perf_counter() - t0
        for where, labels in (
            (state, [f for _, f in seen if week_start * 1e9 <= f.time_ns < week_end * 1e9]),
            (
                oracle_state,
                [oracle_label(r) for r in log if week_start * 1e9 <= failure_time_ns(r) < week_end * 1e9],
            ),
        ):
            store = StateStore.in_dir(where)
            try:
                if labels:
                    store.labels.add(labels, "fleet-loop")
            finally:
                store.close()
        if w >= 1 and w + 1 < args.weeks:
            t0 = time.perf_counter()
            name = f"retrain-w{w + 1}"
            trained, row["retrain"] = _retrain(state, archive, work / "models" / name, w + 1, args)
            if trained:
                pending = Serving(
                    name, work / "models" / name, models.model(work / "models" / name).threshold
                )
            where = work / "models" / f"oracle-w{w + 1}"
            trained, row["oracle_retrain"] = _retrain(oracle_state, archive, where, w + 1, args)
            oracle = Serving(where.name, where, models.model(where).threshold) if trained else None
            timings["retrain_s"] += time.perf_counter() - t0
        if promoted is not None:
            serving = promoted
        weeks.append(row)
        print(_table_row(row), flush=True)
    timings["total_s"] = time.perf_counter() - started
    report: dict[str, Any] = json_safe(
        {
            "world": {
                "family": args.family, "world_seed": args.world_seed, "seed": args.seed, "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node, "weeks": args.weeks, "acceleration": args.acceleration,
                "calm_days": args.calm_days, "calm_seed": args.seed + 1000, "shipped": str(args.shipped),
                "prior": [str(p) for p in args.prior],
            },
            "failures": len(log),
            "failures_with_precursor": sum(1 for r in log if float(r["precursor_s"] or 0) > 0),
            "labels_seen": len(seen),
            "weeks": weeks,
            "timings": timings,
        }
    )  # fmt: skip
    return report


HEADER = (
    "| week | serving | recall pred. >= 5 min [95%] | FA / 1k GPU-days (calm) | static recall | static FA "
    "| oracle recall | oracle FA | labels | shadow |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _pct(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.0f}%"


def _recall(f: dict[str, Any] | None) -> str:
    if f is None:
        return "-"
    lo, hi = f["recall_5min_predictable_ci95"]
    return f"{_pct(f['recall_5min_predictable'])} [{_pct(lo)}, {_pct(hi)}]"


def _fa(f: dict[str, Any] | None) -> str:
    if f is None:
        return "-"
    value = f["false_alarms_per_1000_gpu_days"]
    return f"{value:.2f}" if value else f"0 (< {f['false_alarms_upper95_per_1000_gpu_days']:.2f})"


def _table_row(row: dict[str, Any]) -> str:
    s, shadow = row["serving"], row["shadow"]
    said = "-"
    if shadow is not None:
        said = (
            f"{shadow['challenger']}: {shadow['challenger_caught']} vs {shadow['serving_caught']} caught, "
            f"FA {shadow['challenger_false_alarms']} vs {shadow['serving_false_alarms']}, "
            f"{'promoted' if shadow['promoted'] else 'kept'}"
        )
    return (
        f"| {row['week']} | {s['model']} | {_recall(s)} | {_fa(s)} | {_recall(row['static'])} | "
        f"{_fa(row['static'])} | {_recall(row['oracle'])} | {_fa(row['oracle'])} | {row['labels_seen']} | {said} |"
    )


def main() -> None:
    from faultcast.model.shipped import shipped_model_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["independent", "faultcast-twin"], default="independent")
    p.add_argument("--world-seed", type=int, default=3)
    p.add_argument("--seed", type=int, default=1, help="the fleet's seed (its calm fleet: seed + 1000)")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--weeks", type=int, default=4)
    p.add_argument("--acceleration", type=float, default=400.0)
    p.add_argument("--calm-days", type=float, default=7.0, help="length of the calm fleet (acceleration 1)")
    p.add_argument("--shipped", type=Path, default=None, help="the shipped model (default: the package's)")
    p.add_argument("--prior", type=Path, action="append", default=[], help="twin data for retrain --prior")
    p.add_argument("--prior-weight", type=float, default=1.0)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--work", type=Path, default=None, help="where the fleets, archive and models go")
    p.add_argument("--out", type=Path, required=True, help="the JSON of every figure")
    args = p.parse_args()
    if args.weeks < 3:
        p.error("--weeks must be at least 3: a retrain after the second week, a shadow in the third")
    args.shipped = args.shipped or shipped_model_dir()
    args.work = args.work or args.out.with_suffix(".work")
    print(HEADER, flush=True)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["timings"]), flush=True)


if __name__ == "__main__":
    main()
