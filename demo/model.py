"""The demo model's one recipe: a 32-node twin over 6 days at 400x the failure rate (about a third of
failures carry a precursor, so it takes that many to have some to learn from), trained with few
trees (about a minute here). The benchmarks and the test suite's `service_model` fixture train it
this way, so they all see the same small model. The demo and the goodput study no longer train it:
they use the shipped model (faultcast.model.shipped), trained at scale (bench/shipped_model.sh)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from faultcast.model.features.offline import open_dataset
from faultcast.model.training.train import TrainConfig, train
from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate

DEMO_FLEET = FleetConfig(nodes=32, days=6.0, seed=5, acceleration=400.0)
# The booster alone (no blend with the logistic baseline): the service tests' timings and the demo's
# story were built on its risks, and one world's validation slice is too small to choose a blend on.
DEMO_TRAINING = TrainConfig(num_boost_round=80, negative_rate=0.05, blend=False)


def train_demo_model(out: Path, data: Path | None = None) -> Path:
    """Simulate the demo twin (into `data`, or a temporary directory) and train the demo model into
    `out`; returns `out`."""
    if data is not None:
        simulate(DEMO_FLEET, data, [])
        train(open_dataset(data), out, DEMO_TRAINING)
        return out
    with tempfile.TemporaryDirectory() as scratch:
        return train_demo_model(out, Path(scratch))


def ensure_model(model_dir: Path) -> None:
    """Train the demo model into `model_dir` when there is none there."""
    if (model_dir / "manifest.json").is_file():
        return
    print(f"no model in {model_dir}: training one on a 32-node, 6-day fleet twin (about a minute, once)")
    train_demo_model(model_dir)


# `python -m faultcast.demo.model [DIR]`: the tests' model, for FAULTCAST_TEST_SERVICE_MODEL.
if __name__ == "__main__":
    import sys

    ensure_model(Path(sys.argv[1] if len(sys.argv) > 1 else "out/demo-model"))
