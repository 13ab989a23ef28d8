"""What `faultcast evaluate` must spend per GPU-step, part by part, and the floor that sets.

    .venv/bin/python -m bench.scoring_floor --model out/scale-run-ign/model \
        --rows out/scale-rows/<key>/n0.01-h0.1.npz [--gpu-days 30720 --passes 2 --cores 2]

Evaluate replays every GPU at every grid step through the feature engine, then scores each row with
the model (`FaultModel.risk`), logistic regression and the rules (as `evaluate._Collector.flush`
does), once on all inputs and once on dcgm-exporter's defaults. This times each part in CPU
microseconds a GPU-step (time.process_time, the median of `--repeats`): the engine on random
steady-state inputs at 128 nodes of 8 GPUs (testing/engine_inputs.py), the heads on real feature rows
(a rows-cache file written by `faultcast train --rows-cache`; its positives are over-represented, so
the mode head, which runs only on rows near an alert, is timed on all of them and reported apart).
The floor is that work for `--gpu-days` at the model's cadence (the warm-up included), `--passes`
times, spread perfectly over `--cores`: no evaluation on this machine can be faster, whatever the
code around it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.feature_path import cpu_seconds, engine_ms
from faultcast.model.artifact import load
from faultcast.model.evaluation.evaluate import WARMUP_S
from faultcast.model.evaluation.rules import RulesBaseline
from faultcast.model.features.engine import FeatureConfig, FeatureEngine

BOOSTER = "model risk (booster + calibration)"


def _cpu_us(run: Callable[[], object], rows: int, repeats: int) -> float:
    """The median CPU microseconds a row of `repeats` runs of `run`, which handles `rows` rows."""
    return 1e6 * cpu_seconds(run, repeats) / rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=Path, required=True, help="a rows-cache .npz of the model's features")
    parser.add_argument(
        "--batch", type=int, default=65_536, help="rows scored in one call (evaluate: 64 steps)"
    )
    parser.add_argument("--gpu-days", type=float, default=30_720.0)
    parser.add_argument("--days", type=float, default=30.0, help="the days each GPU spans (for the warm-up)")
    parser.add_argument("--passes", type=int, default=2, help="scorings of each GPU-step (all inputs, dcgm)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model = load(args.model)
    features = np.load(args.rows)["features"]
    x = np.ascontiguousarray(features[: args.batch], dtype=np.float64)
    rules = RulesBaseline(model.feature_names)
    n = len(x)
    parts = {
        BOOSTER: _cpu_us(lambda: model.risk(x), n, args.repeats),
        "logistic regression": _cpu_us(lambda: model.logistic.predict(x), n, args.repeats),
        "rules (score and margin)": _cpu_us(lambda: (rules.score(x), rules.margin(x)), n, args.repeats),
    }
    # The engine at 128 nodes of 8 GPUs: its ms a step over 1,024 GPUs is us a GPU-step.
    config = FeatureConfig(cadence_s=model.feature_config.cadence_s)
    engine_us = engine_ms(128, 120, args.repeats, lambda nodes: FeatureEngine(config, nodes)) * 1000 / 1024
    parts = {"feature engine (1,024 GPUs a step)": engine_us, **parts}
    mode_us = _cpu_us(lambda: model.mode_probabilities(x), n, args.repeats) if model.modes else 0.0

    print(f"{model.booster.num_trees()} trees, {x.shape[1]} features, {n:,} real rows; CPU us a GPU-step:")
    for name, us in parts.items():
        print(f"  {name:38s} {us:8.2f}")
    total = sum(parts.values())
    print(
        f"  {'sum':38s} {total:8.2f}   (mode head on every row, only near alerts in evaluate: {mode_us:.2f})"
    )
    cadence = model.feature_config.cadence_s
    per_gpu_day = 86_400.0 / cadence * (1.0 + WARMUP_S / 86_400.0 / args.days)
    gpu_steps = args.gpu_days * per_gpu_day * args.passes
    floor_s = gpu_steps * total * 1e-6 / args.cores
    booster_s = gpu_steps * parts[BOOSTER] * 1e-6 / args.cores
    print(
        f"floor for {args.gpu_days:,.0f} GPU-days x {args.passes} passes ({gpu_steps / 1e6:,.1f} M GPU-steps) on "
        f"{args.cores} cores: {floor_s / 60:.1f} min, of which the model's predictions {booster_s / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
