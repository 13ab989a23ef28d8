"""Choosing a threshold: the batch state machine at hundreds of thresholds, every slot
updated at every step (as the service does) against only the slots that can change an outcome.

    faultcast simulate --world-seed 201 --seed 201 --nodes 16 --days 10 --acceleration 100 --out out/scale/w201
    .venv/bin/python -m bench.threshold_search --data out/scale/w201 --model out/scale-run/model

The world is scored once (`evaluate.score_period`, every node after the warm-up); then each method's
candidate thresholds are those `outcomes.choose_threshold_pooled` tries, and `incidents.track` runs
over them both ways. Times are CPU seconds of this process (time.process_time), the median of
`--repeats` runs; the incidents of both ways are compared, and the run fails if they differ.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from faultcast.model.artifact import load
from faultcast.model.evaluation.evaluate import LOGISTIC_FLOOR, MODE_FLOOR, WARMUP_S, score_period
from faultcast.model.evaluation.outcomes import ScoredPeriod, candidate_thresholds
from faultcast.model.features.offline import open_dataset
from faultcast.model.incidents import Incident, track
from faultcast.modes import NODE_LEVEL_MODES

T = TypeVar("T")


def _cpu(run: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The median CPU seconds of `repeats` (>= 1) runs, and the last run's result."""
    times = []
    for _ in range(repeats - 1):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    start = time.process_time()
    result = run()
    times.append(time.process_time() - start)
    return statistics.median(times), result


def _signature(found: list[list[Incident]]) -> list[list[tuple[int, int, int, int, str]]]:
    return [[(i.node, i.gpu, i.opened_step, i.closed_step, i.mode) for i in these] for these in found]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 100), metavar="N")
    args = parser.parse_args()
    dataset, model = open_dataset(args.data), load(args.model)
    start = time.process_time()
    period: ScoredPeriod = score_period(
        dataset, model, range(len(dataset.nodes)), dataset.start_s + WARMUP_S, dataset.end_s
    )
    print(f"scored {period.gpu_days:,.0f} GPU-days in {time.process_time() - start:.1f} CPU s")
    for method, floor in (("model", MODE_FLOOR), ("logistic", LOGISTIC_FLOOR)):
        candidates = candidate_thresholds([period], method, floor).tolist()
        risk = period.scores[method]
        lowest = min(candidates) * model.policy.hold_ratio
        hot = float((period.present & (risk >= lowest)).sum() / max(period.present.sum(), 1))

        def every(r: np.ndarray = risk, c: list[float] = candidates) -> list[list[Incident]]:
            return track(
                r,
                period.present,
                period.modes,
                c,
                model.policy,
                period.gpus_per_node,
                NODE_LEVEL_MODES,
                False,
            )

        def quiet(r: np.ndarray = risk, c: list[float] = candidates) -> list[list[Incident]]:
            return track(
                r, period.present, period.modes, c, model.policy, period.gpus_per_node, NODE_LEVEL_MODES
            )

        full_s, full = _cpu(every, args.repeats)
        skip_s, skipped = _cpu(quiet, args.repeats)
        if _signature(full) != _signature(skipped):
            raise SystemExit(f"{method}: the incidents differ")
        print(
            f"{method}: {len(candidates)} thresholds, {100 * hot:.1f}% of rows at or above the lowest hold "
            f"level; every slot {full_s:.2f} s, quiet slots skipped {skip_s:.2f} s: "
            f"{full_s / max(skip_s, 1e-9):.1f}x, the same {sum(len(f) for f in full):,} incidents"
        )


if __name__ == "__main__":
    main()
