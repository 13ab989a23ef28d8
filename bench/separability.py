"""How many precursor-bearing failures one signal alone separates from the healthy look-alikes.

For each dataset (and all of them pooled) and each mode that can carry a precursor: its failures with
a precursor, how many peak above the loudest healthy window of their signal (no false alarm), and
above the budget level (at most --budget episodes per 1,000 healthy unit-days); see
faultcast.model.evaluation.separability for the statistics and what the measure does not say.
    .venv/bin/python bench/separability.py --data out/scale/w201 --data out/eval/t901 [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from faultcast.model.evaluation.separability import (
    DEFAULT_BUDGET,
    SIGNALS,
    ModeSeparability,
    pooled,
    report_rows,
    separability,
)
from faultcast.model.features.offline import open_dataset


def _number(x: float) -> str:
    """A level for the table: short, and '-' where there is none."""
    return "-" if math.isnan(x) else f"{x:.4g}"


def _peaks(m: ModeSeparability) -> str:
    """The failures' peaks, loudest first (NaN: no data in the catch window)."""
    return ", ".join(
        _number(p.peak) for p in sorted(m.peaks, key=lambda p: -p.peak if p.peak == p.peak else 0)
    )


def table(result: Sequence[ModeSeparability], own_world: Sequence[tuple[int, int]] | None = None) -> str:
    """A Markdown table; `own_world`: pooled rows also count each failure against its own world's levels."""
    head = "| mode | statistic | precursor failures | above loudest | above budget |"
    rule = "|---|---|---:|---:|---:|"
    if own_world is not None:
        head += " above own world's loudest | above own world's budget |"
        rule += "---:|---:|"
    head += " loudest healthy | budget level | healthy unit-days | allowed episodes | failure peaks |"
    rule += "---:|---:|---:|---:|---|"
    lines = [head, rule]
    total = [0, 0, 0, 0, 0]
    for i, m in enumerate(result):
        counts = [m.failures, m.above_loudest, m.above_budget]
        if own_world is not None:
            counts += list(own_world[i])
        total = [a + b for a, b in zip(total, counts, strict=False)]
        unit = "GPU" if m.level == "gpu" else "node"
        lines.append(
            f"| {m.mode} | {m.statistic} | " + " | ".join(map(str, counts))
            + f" | {_number(m.loudest)} | {_number(m.budget_level)} | {m.healthy_days:.1f} {unit}"
            f" | {m.allowed} | {_peaks(m)} |"
        )  # fmt: skip
    width = 5 if own_world is not None else 3
    lines.append("| **total** | | " + " | ".join(f"**{n}**" for n in total[:width]) + " | | | | | |")
    return "\n".join(lines)


def own_world(per_dataset: Sequence[Sequence[ModeSeparability]]) -> list[tuple[int, int]]:
    """Per mode, failures above their own world's loudest and budget level, summed over the datasets:
    the issue's question (a world's own look-alikes), where the pooled levels are one fleet-wide threshold."""
    return [
        (sum(p.above_loudest for p in parts), sum(p.above_budget for p in parts))
        for parts in zip(*per_dataset, strict=True)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, action="append", required=True, help="a dataset directory")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="episodes per 1,000 unit-days")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--keep-after-failure", action="store_true",
        help="count a unit healthy again after its own failure (once the statistic no longer sees it)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results, report = [], []
    for path in args.data:
        began = time.perf_counter()
        one = separability(open_dataset(path), budget=args.budget, exclude_after=not args.keep_after_failure)
        seconds = time.perf_counter() - began
        results.append(one)
        report.append({"path": str(path), "seconds": round(seconds, 2), "modes": report_rows(one)})
        print(f"## {path} ({seconds:.1f} s)\n\n{table(one)}\n")
    common = pooled(results, args.budget)
    if len(results) > 1:
        print(f"## pooled: {len(results)} datasets, one threshold per mode across them\n")
        print(table(common, own_world(results)) + "\n")
    elapsed = time.perf_counter() - started
    print(f"budget {args.budget} episodes per 1,000 healthy unit-days; took {elapsed:.1f} s")
    if args.json is not None:
        document = {"budget": args.budget, "exclude_after_failure": not args.keep_after_failure,
                    "datasets": report, "pooled": report_rows(common),
                    "pooled_own_world": dict(zip(SIGNALS, own_world(results), strict=True)),
                    "seconds": round(elapsed, 2)}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
