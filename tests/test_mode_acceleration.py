"""Rare modes drawn more often (`faultcast simulate --mode-acceleration`) and weighted back in training."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from faultcast.cli.app import main
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.offline import DataError, open_dataset
from faultcast.model.training.train import TrainConfig, _sample_worlds, _world_rows, train
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import node_schedule
from faultcast.sim.world import World
from faultcast.sim.writer import simulate

BOOSTED = "cooling"  # rare: 32 of the 1,270 failures with a precursor in 64 drawn worlds
FACTOR = 40.0
# Small worlds at 1000x (test_ceiling.py's sizes): the first draws cooling 40 times more often.
PLAIN = FleetConfig(nodes=8, days=1.0, seed=2, acceleration=1000.0, world=World.draw(7))
BOOST = FleetConfig(
    nodes=8,
    days=2.0,
    seed=1,
    acceleration=1000.0,
    world=World.draw(7),
    mode_acceleration=((BOOSTED, FACTOR),),
)


def test_a_fleet_config_names_every_bad_mode_factor() -> None:
    with pytest.raises(ValueError, match="no mode 'bogus'") as caught:
        FleetConfig(mode_acceleration=(("bogus", 2.0), ("power", 0.0), ("power", 3.0)))
    assert "power's factor must be positive, got 0.0" in str(caught.value)
    assert "a mode given twice" in str(caught.value)
    with pytest.raises(ValueError, match="must be positive"):
        FleetConfig(mode_acceleration=(("power", float("inf")),))


def test_the_factors_round_trip_and_a_plain_config_is_what_it_was() -> None:
    assert "mode_acceleration" not in FleetConfig().to_json()  # as before the factors existed
    config = FleetConfig(mode_acceleration=(("power", 3.0), ("cooling", 6.0)))
    again = FleetConfig(**json.loads(json.dumps(config.to_json())))  # lists from JSON, sorted pairs back
    assert again.mode_acceleration == config.mode_acceleration
    assert FleetConfig(**config.to_json()) == config
    assert config.mode_acceleration == (("cooling", 6.0), ("power", 3.0))
    assert config.mode_factor("cooling") == 6.0
    assert config.mode_factor("hbm_wear") == 1.0


def test_a_boosted_mode_is_drawn_that_much_more_often_and_the_others_are_not() -> None:
    """Over many nodes' schedules: the boosted mode's count rises about FACTOR-fold; a factor of 1 draws
    exactly what no factor draws."""
    plain = FleetConfig(nodes=1, days=30.0, acceleration=500.0, world=World.draw(3))
    boosted = FleetConfig(
        nodes=1, days=30.0, acceleration=500.0, world=World.draw(3), mode_acceleration=((BOOSTED, 10.0),)
    )
    one = FleetConfig(
        nodes=1, days=30.0, acceleration=500.0, world=World.draw(3), mode_acceleration=((BOOSTED, 1.0),)
    )
    counts: dict[str, Counter[str]] = {"plain": Counter(), "boosted": Counter()}
    for node in range(200):
        counts["plain"].update(f.mode for f in node_schedule(plain, node).failures)
        counts["boosted"].update(f.mode for f in node_schedule(boosted, node).failures)
        if node < 5:
            assert node_schedule(one, node).failures == node_schedule(plain, node).failures
    ratio = counts["boosted"][BOOSTED] / counts["plain"][BOOSTED]
    assert counts["plain"][BOOSTED] >= 30
    assert 6.0 < ratio < 15.0
    # The other modes lose only the time the boosted failures keep GPUs down: within a few percent.
    others = sum(n for m, n in counts["plain"].items() if m != BOOSTED)
    others_boosted = sum(n for m, n in counts["boosted"].items() if m != BOOSTED)
    assert 0.85 * others < others_boosted <= 1.02 * others


def test_simulate_records_the_factors_and_refuses_a_bad_one(tmp_path: Path) -> None:
    out = tmp_path / "twin"
    argv = ["simulate", "--nodes", "2", "--days", "0.3", "--mode-acceleration", "cooling=5",
            "--mode-acceleration", "power=2.5", "--out", str(out)]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    assert "(cooling x5 more, power x2.5 more)" in printed.getvalue()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mode_acceleration"] == {"cooling": 5.0, "power": 2.5}
    rates = {m["name"]: m for m in manifest["modes"]}
    assert rates["cooling"]["accelerated_rate_per_gpu_day"] == pytest.approx(
        5.0 * rates["cooling"]["base_rate_per_gpu_day"]
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["simulate", "--mode-acceleration", "warp=2", "--out", str(tmp_path / "x")]) == 2
    assert "no mode 'warp'" in err.getvalue()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("boosted")
    simulate(BOOST, root / "boosted")
    simulate(PLAIN, root / "plain")
    return root / "boosted", root / "plain"


def test_training_weights_a_boosted_modes_rows_back_and_refuses_to_validate_on_them(
    worlds: tuple[Path, Path], tmp_path: Path
) -> None:
    boosted, plain = (open_dataset(p) for p in worlds)
    config = TrainConfig(num_boost_round=5, negative_rate=0.05)
    features = FeatureConfig(cadence_s=plain.cadence_s, gpus_per_node=plain.gpus_per_node)
    rows, _ = _sample_worlds([boosted, plain], features, config)
    weighted = rows.boost != 1.0
    assert weighted.any()
    assert (rows.y[weighted] & (rows.mode[weighted] == BOOSTED) & (rows.world[weighted] == 0)).all()
    assert (rows.boost[weighted] == FACTOR).all()
    # Every other row keeps the sampler's weight; the boosted mode's rows count 1/FACTOR of theirs.
    original, _ = _world_rows(boosted, features, config, config.seed)
    mine = rows.world == 0
    np.testing.assert_array_equal(rows.w[mine] * rows.boost[mine], original["weight"])
    assert (rows.y & (rows.mode == BOOSTED) & (rows.world == 0) & ~weighted).sum() == 0

    model = train([boosted, plain], tmp_path / "model", config)
    assert model.card.training_data is not None
    assert model.card.training_data.manifest["mode_acceleration"] == {str(worlds[0]): {BOOSTED: FACTOR}}
    # Validating on a boosted world would count its extra failures in every choice: refused, named.
    with pytest.raises(ValueError, match=r"draws some modes more often \(cooling x40\)"):
        train([plain, boosted], tmp_path / "refused", config)
    # A training world whose factors cannot be read is refused too (before any world is replayed).
    broken = tmp_path / "broken"
    shutil.copytree(worlds[0], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["mode_acceleration"] = {BOOSTED: -1}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="must map modes to positive factors"):
        train([open_dataset(broken), plain], tmp_path / "broken-model", config)
