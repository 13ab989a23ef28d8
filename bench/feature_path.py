"""The offline feature path: the engine's ms a step, training rows and scoring in GPU-days/s.

    faultcast simulate --world-seed 101 --seed 101 --nodes 16 --days 3 --acceleration 100 --out /tmp/sp/w
    faultcast train --data /tmp/sp/w --data /tmp/sp/w2 --out /tmp/sp/model   # any model of that schema
    .venv/bin/python -m bench.feature_path --data /tmp/sp/w --model /tmp/sp/model   # from the root

All times are CPU seconds of this process (time.process_time), the median of `--repeats` runs: on a
shared machine the wall clock measures the neighbours. The engine runs on random steady-state inputs
(testing/engine_inputs.py: every GPU read every step) at 16, 128 and 512 nodes of 8 GPUs, next to the
frozen engine from before the speed-up (tests/reference_features) unless --no-reference. Training rows
are `train._world_rows` with the default TrainConfig and hard negatives at 25% (every node and day of
the world replayed, the warm-up included); scoring is `evaluate.score_period` over every node after
the warm-up (the model, logistic regression and the rules). GPU-days/s counts the GPU-days replayed
through the engine (warm-up included) per CPU second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faultcast.model.artifact import load
from faultcast.model.evaluation.evaluate import WARMUP_S, score_period
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.features.offline import Dataset, open_dataset
from faultcast.model.training.train import TrainConfig, _world_rows
from faultcast.testing.engine_inputs import engine_steps
from faultcast.testing.reference_features import features as reference


def cpu_seconds(run: Callable[[], object], repeats: int) -> float:
    """The median CPU seconds of `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return float(statistics.median(times))


def engine_ms(nodes: int, steps: int, repeats: int, make: Callable[[int], Any]) -> float:
    """CPU ms a step of `update` for `nodes` nodes of 8 GPUs (inputs made beforehand, not timed)."""
    inputs = list(engine_steps(1, nodes, 8, steps, messy=False))

    def run() -> None:
        engine = make(nodes)
        for s in inputs:
            engine.update(s.step, s.gpu, s.node, s.is_h100, s.summary)

    return 1000.0 * cpu_seconds(run, repeats) / steps


def gpu_days(dataset: Dataset, start_s: float) -> float:
    """GPU-days of the dataset from `start_s` on, every node."""
    return len(dataset.nodes) * dataset.gpus_per_node * (dataset.end_s - start_s) / 86_400.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="a `faultcast simulate` output")
    parser.add_argument("--model", type=Path, help="a model to score with (its features: the default ones)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip the engine from before")
    parser.add_argument("--engine-only", action="store_true")
    args = parser.parse_args()

    config = FeatureConfig()
    old = reference.FeatureConfig()
    print(f"engine, CPU ms a step (median of {args.repeats} runs), random inputs, 8 GPUs a node")
    for nodes, steps in ((16, 400), (128, 150), (512, 40)):
        now = engine_ms(nodes, steps, args.repeats, lambda n: FeatureEngine(config, n))
        line = f"  {nodes:4d} nodes ({nodes * 8:5d} GPUs): {now:7.2f} ms"
        if not args.no_reference:
            before = engine_ms(nodes, steps, args.repeats, lambda n: reference.FeatureEngine(old, n))
            line += f"   before: {before:7.2f} ms   ({before / now:.1f}x)"
        print(line, flush=True)
    if args.engine_only:
        return

    dataset = open_dataset(args.data)
    features = FeatureConfig(cadence_s=dataset.cadence_s, gpus_per_node=dataset.gpus_per_node)
    days = gpu_days(dataset, dataset.start_s)
    train_config = TrainConfig(hard_negative_rate=0.25)
    seconds = cpu_seconds(lambda: _world_rows(dataset, features, train_config, 0), args.repeats)
    print(f"training rows: {days:,.0f} GPU-days in {seconds:.2f} CPU s: {days / seconds:,.0f} GPU-days/s")
    if args.model is not None:
        model = load(args.model)
        every = list(range(len(dataset.nodes)))
        start = dataset.start_s + WARMUP_S
        seconds = cpu_seconds(lambda: score_period(dataset, model, every, start, dataset.end_s), args.repeats)
        print(
            f"scoring: {days:,.0f} GPU-days replayed ({gpu_days(dataset, start):,.0f} scored) in "
            f"{seconds:.2f} CPU s: {days / seconds:,.0f} GPU-days/s"
        )


if __name__ == "__main__":
    main()
