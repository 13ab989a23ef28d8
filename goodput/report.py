"""The goodput study as text (the three-policy table, the sweep) and as a PNG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from pathlib import Path

from faultcast.goodput.study import Job, PolicyResult, SweepPoint, TierPoint, gpu_hours, lost_s

# What the wall time went to, in the order the plot stacks it.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("checkpoint_s", "periodic checkpoints"),
    ("recompute_s", "recompute after crashes"),
    ("restart_s", "crash detection + restart"),
    ("snapshot_s", "predictive snapshots"),
    ("migration_s", "migrations"),
    ("false_alarm_s", "false alarms (snapshot + migration)"),
    ("protection_s", "protect-tier warnings (replicas + readied spare)"),
    ("replication_s", "buddy replicas"),
    ("warm_pool_s", "warm pool (idle spare GPUs)"),
)


def seconds(s: float) -> str:
    """A duration for a reader: ms below a second."""
    return f"{1000 * s:.3g} ms" if s < 1 else f"{s:.4g} s"


def _minutes(seconds: float) -> str:
    return "none" if math.isinf(seconds) else f"{seconds / 60:.1f} min"


def table(job: Job, results: Sequence[PolicyResult]) -> str:
    """The three-policy table as Markdown, means over replications (+- standard deviation)."""
    head = (
        "| policy | checkpoint interval | effective training time | GPU-hours lost | lost to recompute "
        "| crash restarts | migrations | false-alarm migrations | false-alarm cost (GPU-h) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = [head]
    for r in results:
        rows.append(
            f"| {r.label}{_at(r)} | {_minutes(r.interval_s)} "
            f"| {100 * r.ettr:.2f}% +- {100 * r.sd(lambda o: o.ettr):.2f} "
            f"| {gpu_hours(job, r.mean(lost_s)):,.0f} "
            f"| {gpu_hours(job, r.mean(lambda o: o.recompute_s)):,.0f} "
            f"| {r.mean(lambda o: o.crashes):.1f} | {r.mean(lambda o: o.migrations):.1f} "
            f"| {r.mean(lambda o: o.false_alarm_migrations):.1f} "
            f"| {gpu_hours(job, r.mean(lambda o: o.false_alarm_s)):,.0f} |"
        )
    return "\n".join(rows)


def _at(r: PolicyResult) -> str:
    return f", threshold {r.threshold:.3f}" if r.threshold is not None else ""


def sweep_table(points: Sequence[SweepPoint], recommended: SweepPoint, model_threshold: float) -> str:
    """A Markdown table of the sweep, one row per threshold; `recommended` (by identity) and the point at
    `model_threshold` are marked."""
    rows = [
        "| threshold | effective training time (b') | failures foreseen in time | false alarms per day |",
        "| --- | --- | --- | --- |",
    ]
    for p in points:
        marks = [
            m
            for m, on in (
                ("recommended", p is recommended),
                ("model's own", abs(p.threshold - model_threshold) < 1e-12),
            )
            if on
        ]
        note = f" ({', '.join(marks)})" if marks else ""
        rows.append(
            f"| {p.threshold:.3f}{note} | {100 * p.ettr:.2f}% +- {100 * p.ettr_sd:.2f} "
            f"| {100 * p.foreseen_share:.1f}% | {p.false_alarms_per_day:.2f} |"
        )
    return "\n".join(rows)


def plot(
    path: Path,
    job: Job,
    results: Sequence[PolicyResult],
    points: Sequence[SweepPoint],
    recommended: SweepPoint,
) -> None:
    """Left: effective training time against the threshold, the policies as lines. Right: where
    each policy's lost GPU-hours went."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or in CI
    import matplotlib.pyplot as plt

    by_key = {r.key: r for r in results}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    xs = [p.threshold for p in points]
    left.plot(xs, [100 * p.ettr for p in points], "o-", label="(b') faultcast, interval re-tuned")
    for key, color, line in (("a", "k", ":"), ("c_tuned", "g", "-.")):
        if key in by_key:
            left.axhline(100 * by_key[key].ettr, linestyle=line, color=color, label=by_key[key].label)
    left.axvline(recommended.threshold, color="grey", linewidth=0.8)
    left.annotate(
        f"recommended {recommended.threshold:.3f}",
        (recommended.threshold, 100 * recommended.ettr),
        textcoords="offset points",
        xytext=(6, -14),
        fontsize=8,
    )
    left.set_xscale("log")
    left.set_xlabel("alert threshold (calibrated risk)")
    left.set_ylabel("effective training time (%)")
    left.set_title(f"{job.gpus:,} GPUs x {job.days:g} days: threshold sweep")
    left.legend(fontsize=7, loc="lower left")
    left.grid(alpha=0.3)

    labels = [r.label.split(" ")[0] for r in results]
    bottom = [0.0] * len(results)
    for attr, name in BUCKETS:
        heights = [gpu_hours(job, r.mean(attrgetter(attr))) / 1000 for r in results]
        right.bar(labels, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for i, r in enumerate(results):
        right.annotate(f"{100 * r.ettr:.1f}%", (i, bottom[i]), ha="center", va="bottom", fontsize=8)
    right.set_ylim(0, max(bottom) * 1.45)  # room for the labels and the legend above the bars
    right.set_ylabel("GPU-hours lost (thousands)")
    right.set_title("where the lost time went (effective training time on top)")
    right.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tier_table(points: Sequence[TierPoint], best: TierPoint | None, base_ettr: float) -> str:
    """A Markdown table of the protect tier's sweep; the chosen point marked, (b') alone first."""
    rows = [
        "| protect threshold | effective training time | failures warned in time | warnings on healthy nodes per day |",
        "| --- | --- | --- | --- |",
        f"| none (move tier only) | {100 * base_ettr:.2f}% | | |",
    ]
    for p in points:
        note = " (chosen)" if p is best else ""
        rows.append(
            f"| {p.threshold:.3f}{note} | {100 * p.ettr:.2f}% +- {100 * p.ettr_sd:.2f} "
            f"| {100 * p.warned_share:.1f}% | {p.warnings_per_day:.2f} |"
        )
    return "\n".join(rows)
