"""A window of the archive as a data directory to train on: the chosen settled days (linked, not copied)
and the label log's failures and censored spans, so `faultcast retrain` reads the fleet's own history
like any data directory (model/features/offline.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from faultcast.service.archive.writer import DAY_S, KIND, DayRecord, day_start_s, settled_days
from faultcast.service.training_labels import TrainingLabels, write


@dataclass(frozen=True, slots=True)
class Window:
    """The days a retrain fits on and the newest days it holds out (every choice is made on them)."""

    fit: list[str]
    holdout: list[str]


def choose_window(days: list[str], window_days: float, holdout_days: float) -> Window:
    """The last `window_days` of the settled `days`, the last `holdout_days` of them held out; ValueError
    saying what is missing when fewer days are there than a fit and a holdout need."""
    days = sorted(days)
    if not days:
        raise ValueError("the archive holds no settled day yet: a day settles an hour after it ends")
    newest = day_start_s(days[-1])
    window = [d for d in days if newest - day_start_s(d) < window_days * DAY_S]
    holdout = [d for d in window if newest - day_start_s(d) < holdout_days * DAY_S]
    fit = [d for d in window if d not in holdout]
    if not fit or not holdout:
        raise ValueError(
            f"the archive's last {window_days:g} days hold {len(window)} settled days: retraining needs at "
            f"least one to fit on and {holdout_days:g} to hold out (the newest)"
        )
    return Window(fit, holdout)


def write_view(
    archive: Path, days: list[str], labels: TrainingLabels, out: Path, *, cadence_s: float
) -> Path:
    """`out` as a data directory of `days` of the archive (their files linked) with the label log's
    failures.csv and censored.csv; returns `out`."""
    index = settled_days(archive)
    missing = [d for d in days if d not in index]
    if missing:
        raise ValueError(f"{archive}: days {missing} are not settled in it")
    for table in ("telemetry.parquet", "network.parquet"):
        (out / table).mkdir(parents=True, exist_ok=True)
        for day in days:
            link = out / table / f"{day}.parquet"
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink((archive / table / f"{day}.parquet").resolve(), link)
    write(labels, out)
    records: list[DayRecord] = [index[d] for d in days]
    nodes = sorted({n for r in records for n in r.nodes})
    start = day_start_s(min(days))
    manifest = {
        "kind": f"{KIND} window",
        "archive": str(archive.resolve()),
        "config": {
            "nodes": len(nodes),
            "gpus_per_node": max(r.gpus_per_node for r in records),
            "cadence_s": cadence_s,
            "start_unix_s": start,
            "days": (day_start_s(max(days)) + DAY_S - start) / DAY_S,
        },
        "nodes": nodes,
        "days": sorted(days),
        "gpu_days": sum(r.gpu_rows for r in records) * cadence_s / DAY_S,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out
