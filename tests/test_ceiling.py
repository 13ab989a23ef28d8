"""The in-world ceiling (`faultcast evaluate --reference`) and fleets of one independent world."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from faultcast.cli.app import main
from faultcast.model.artifact import FaultModel
from faultcast.model.evaluation.ceiling import CeilingError, by_mode, check_reference
from faultcast.model.evaluation.evaluate import DCGM_DEFAULT_MISSING, held_out_part, score_period
from faultcast.model.evaluation.outcomes import ModeTally
from faultcast.model.evaluation.score_jobs import ScoreJob, score_all, split
from faultcast.model.features.offline import open_dataset
from faultcast.model.training.train import TrainConfig, train
from faultcast.sim.config import FleetConfig
from faultcast.sim.independent import IndependentConfig, generate
from faultcast.sim.world import World
from faultcast.sim.writer import simulate

WORLD, OTHER = 7, 8
# Fleets of world 7 at 1000x (test_train_worlds.py's sizes): two train the reference (the second
# validates), two others are evaluated; calm fleets at acceleration 1 measure false alarms apart.
FLEETS = {
    "train": FleetConfig(nodes=8, days=2.0, seed=1, acceleration=1000.0, world=World.draw(WORLD)),
    "validate": FleetConfig(nodes=8, days=1.0, seed=2, acceleration=1000.0, world=World.draw(WORLD)),
    "evaluated": FleetConfig(nodes=6, days=1.0, seed=3, acceleration=1000.0, world=World.draw(WORLD)),
    "second": FleetConfig(nodes=2, days=0.5, seed=4, acceleration=1000.0, world=World.draw(WORLD)),
    "calm": FleetConfig(nodes=2, days=0.5, seed=5, acceleration=1.0, world=World.draw(WORLD)),
    "elsewhere": FleetConfig(nodes=2, days=0.5, seed=6, acceleration=1.0, world=World.draw(OTHER)),
}


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fleets")
    for name, config in FLEETS.items():
        simulate(config, root / name)
    return {name: root / name for name in FLEETS}


@pytest.fixture(scope="module")
def reference(fleets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[FaultModel, Path]:
    """The same recipe on two other fleets of the evaluated world: the in-world reference."""
    out = tmp_path_factory.mktemp("reference")
    data = [open_dataset(fleets["train"]), open_dataset(fleets["validate"])]
    return train(data, out, TrainConfig(num_boost_round=40, negative_rate=0.05)), out


@pytest.fixture(scope="module")
def evaluated(
    fleets: dict[str, Path], reference: tuple[FaultModel, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str]:
    """`faultcast evaluate` of the reference itself, with itself as the ceiling of both evaluated fleets,
    false alarms apart on a calm fleet of its world and one of another (the JSON and what it printed)."""
    _, model = reference
    out = tmp_path_factory.mktemp("evaluation") / "report.json"
    evaluated, second = fleets["evaluated"], fleets["second"]
    argv = ["evaluate", "--model", str(model), "--data", str(evaluated), "--data", str(second),
            "--false-alarm-data", str(fleets["calm"]), "--false-alarm-data", str(fleets["elsewhere"]),
            "--reference", f"{evaluated}={model}", "--reference", f"{second}={model}",
            "--resamples", "50", "--json", str(out)]  # fmt: skip
    printed = io.StringIO()  # capsys is per test; this fixture is per module
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return json.loads(out.read_text()), printed.getvalue()


def test_a_reference_equal_to_the_model_is_exactly_its_ceiling(evaluated: tuple[dict[str, Any], str]) -> None:
    report, _ = evaluated
    for one in report["datasets"]:
        ceiling, model = one["ceiling"], one["model"]
        own = ceiling["own_threshold"]
        for key in ("recall_5min_predictable", "false_alarms", "failures_caught", "alerts", "recall_by_mode"):
            assert own[key] == model[key], key
        # 0 of 0 is no share: a ceiling that catches nothing says nothing of the model.
        top = ceiling["own_threshold"]["recall_5min_predictable"]
        assert ceiling["share_of_ceiling"]["own_threshold"] == (1.0 if top else None)
        # Its own threshold raises exactly the model's false alarms, so the match keeps that many.
        matched = ceiling["matched"]
        assert matched["within_target"] is True
        assert matched["false_alarms"] == model["false_alarms"]
        assert ceiling["share_of_ceiling"]["row"] == "matched"
        assert ceiling["recall_5min_predictable"] == matched["recall_5min_predictable"]
        for mode, row in ceiling["by_mode"].items():
            assert row["failures"] == round(row["failures"])
            assert row["model_caught"] <= row["predictable"] <= row["failures"], mode
            assert row["model_caught"] == model["by_mode"][mode]["predictable_caught"]
            share = ceiling["share_of_ceiling"]["by_mode"][mode]
            assert share == (
                None if row["ceiling_caught"] == 0 else row["model_recall"] / row["ceiling_recall"]
            )
        assert sum(r["failures"] for r in ceiling["by_mode"].values()) == model["failures"]
    assert report["datasets"][0]["ceiling"]["share_of_ceiling"]["own_threshold"] == 1.0


def test_the_ceiling_names_its_reference_and_measures_false_alarms_on_its_own_world(
    evaluated: tuple[dict[str, Any], str], fleets: dict[str, Path], reference: tuple[FaultModel, Path]
) -> None:
    report, _ = evaluated
    one = report["datasets"][0]
    ref = one["ceiling"]["reference"]
    world = json.loads((fleets["evaluated"] / "manifest.json").read_text())["world"]["id"]
    assert ref["model"] == str(reference[1])
    assert ref["training_worlds"] == [world]
    assert ref["only_the_evaluated_world"] is True
    assert ref["training_data"] == [str(fleets["train"]), str(fleets["validate"])]
    assert ref["training_gpu_days"] > 0
    apart = one["ceiling"]["false_alarm_data"]
    assert apart["data"] == [str(fleets["calm"])]
    assert apart["skipped_other_worlds"] == [str(fleets["elsewhere"])]
    # The main block pools both calm fleets (the same size); the ceiling's only the one of its world.
    own = apart["methods"]["own_threshold"]
    assert own["gpu_days"] == pytest.approx(one["false_alarm_data"]["methods"]["model"]["gpu_days"] / 2)
    assert (
        one["ceiling"]["false_alarms_apart_per_1000_gpu_days"]
        == apart["methods"]["matched"]["false_alarms_per_1000_gpu_days"]
    )


def test_the_pooled_ceiling_sums_each_datasets_match(evaluated: tuple[dict[str, Any], str]) -> None:
    report, _ = evaluated
    pooled, parts = report["pooled"]["ceiling"], report["datasets"]
    assert pooled["matched"]["failures"] == sum(p["ceiling"]["matched"]["failures"] for p in parts)
    assert pooled["matched"]["false_alarms"] == sum(p["ceiling"]["matched"]["false_alarms"] for p in parts)
    assert pooled["share_of_ceiling"]["own_threshold"] == 1.0
    assert pooled["recall_5min_predictable"] == pooled["matched"]["recall_5min_predictable"]


def test_a_pooled_ceiling_over_the_datasets_with_a_reference_says_which(
    fleets: dict[str, Path],
    reference: tuple[FaultModel, Path],
    evaluated: tuple[dict[str, Any], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One of two datasets with a reference: the pooled ceiling covers that one alone, with the model
    pooled over the same data beside it, and stays out of the table of both datasets."""
    _, model = reference
    out = tmp_path / "report.json"
    first, second = fleets["evaluated"], fleets["second"]
    argv = ["evaluate", "--model", str(model), "--data", str(first), "--data", str(second),
            "--reference", f"{first}={model}", "--resamples", "50", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    pooled, (one, two) = report["pooled"]["ceiling"], report["datasets"]
    assert "ceiling" not in two
    assert pooled["data"] == [str(first)]
    assert pooled["every_dataset"] is False
    assert pooled["matched"]["failures"] == one["ceiling"]["matched"]["failures"]
    assert pooled["model"]["failures"] == one["model"]["failures"] < report["pooled"]["model"]["failures"]
    assert pooled["model"]["recall_5min_predictable"] == one["model"]["recall_5min_predictable"]
    # The both-datasets table has no ceiling rows; the one-dataset pooled table does, the model beside it.
    assert f"the in-world ceiling pooled over the 1 datasets with a reference ({first}):" in printed
    lines = printed.splitlines()
    matched = [line for line in lines if line.startswith("| in-world ceiling, matched to the model's")]
    assert len(matched) == 2  # the dataset's table and the subset's, not the pooled table of both
    assert sum(line.startswith("| model, over the datasets with a reference |") for line in lines) == 1
    # With every dataset referenced (the module's evaluation) the pooled ceiling says so.
    everything = evaluated[0]["pooled"]["ceiling"]
    assert everything["every_dataset"] is True
    assert everything["data"] == [str(first), str(second)]


def test_the_table_prints_the_ceiling_rows_the_share_and_the_modes(
    evaluated: tuple[dict[str, Any], str],
) -> None:
    report, printed = evaluated
    lines = printed.splitlines()
    own = [line for line in lines if line.startswith("| in-world ceiling, reference at its own threshold |")]
    matched = [
        line for line in lines if line.startswith("| in-world ceiling, matched to the model's false alarms")
    ]
    assert len(own) == len(matched) == 3  # two datasets, pooled
    assert "share of the in-world ceiling" in printed
    assert "over the reference at its own threshold: 100.0%" in printed
    assert (
        "| mode | failures | with a precursor | model recall >=5 min | ceiling recall >=5 min | share of ceiling |"
        in printed
    )
    mode, row = next(iter(report["datasets"][0]["ceiling"]["by_mode"].items()))
    assert f"| {mode} | {row['failures']} | {row['predictable']} |" in printed
    # Every method's per-mode row, the ceiling's beside them.
    assert printed.count("by mode: caught >=5 min of the failures that carried a precursor") == 3
    header = next(
        line
        for line in printed.splitlines()
        if line.startswith("| mode | failures | with a precursor | model |")
    )
    assert header.endswith("| in-world ceiling, matched to the model's false alarms |")
    assert "the ceiling's false alarms on the false-alarm data" in printed


def test_a_reference_trained_on_the_data_or_another_world_is_refused(
    fleets: dict[str, Path], reference: tuple[FaultModel, Path], tmp_path: Path
) -> None:
    model, where = reference
    training = model.card.training_data
    with pytest.raises(CeilingError, match="itself"):
        check_reference(open_dataset(fleets["validate"]), training, where)
    # A copy of a training fleet elsewhere: the same seed in the same world is the same fleet.
    copy = tmp_path / "copy"
    shutil.copytree(fleets["train"], copy)
    with pytest.raises(CeilingError, match="seed 1 in world"):
        check_reference(open_dataset(copy), training, where)
    with pytest.raises(CeilingError, match="not on world"):
        check_reference(open_dataset(fleets["elsewhere"]), training, where)
    evaluated = open_dataset(fleets["evaluated"])
    assert check_reference(evaluated, training, where).fleets_unchecked == ()
    # Its false alarms are not measured on its own training data either (another world's is not used).
    with pytest.raises(CeilingError, match="itself"):
        check_reference(evaluated, training, where, [open_dataset(fleets["train"])])
    check_reference(evaluated, training, where, [open_dataset(fleets["elsewhere"])])
    # Data that names no world (an import) cannot be checked: refused, not trusted.
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["world"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CeilingError, match="names no world"):
        check_reference(open_dataset(copy), training, where)


def test_evaluate_refuses_a_bad_reference_before_scoring(
    fleets: dict[str, Path], reference: tuple[FaultModel, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, model = reference
    train_fleet, evaluated = fleets["train"], fleets["evaluated"]
    base = ["evaluate", "--model", str(model), "--data", str(train_fleet)]
    assert main([*base, "--reference", f"{train_fleet}={model}"]) == 2
    assert "trained on" in capsys.readouterr().err
    assert main([*base, "--reference", f"{evaluated}={model}"]) == 2
    assert "is not one of the --data directories" in capsys.readouterr().err


def test_per_mode_shares_are_over_the_predictable_failures_and_null_without_a_ceiling() -> None:
    # hbm_wear: 3 failures, 2 with a precursor; the model caught 1 of those, the ceiling both.
    ours = {"hbm_wear": ModeTally(3, 1, 2, 1, 0, (20.0,)), "power": ModeTally(3, 0, 3, 0)}
    best = {"hbm_wear": ModeTally(3, 2, 2, 2, 0, (20.0, 30.0)), "power": ModeTally(3, 0, 3, 0)}
    modes = by_mode(ours, best)
    assert (modes["hbm_wear"]["model_recall"], modes["hbm_wear"]["ceiling_recall"]) == (0.5, 1.0)
    assert modes["hbm_wear"]["share_of_ceiling"] == 0.5
    assert modes["hbm_wear"]["predictable"] == 2
    assert modes["power"]["share_of_ceiling"] is None
    assert modes["power"]["failures"] == 3


# -- fleets of one independent world ---------------------------------------------------------------

TINY = IndependentConfig(nodes=2, gpus_per_node=2, days=0.2, seed=5, acceleration=50.0)


def _files(out: Path) -> dict[str, bytes]:
    return {
        name: (out / name).read_bytes() for name in ("telemetry.parquet", "network.parquet", "failures.csv")
    }


def test_one_world_seed_gives_one_world_id_and_other_fleets(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", IndependentConfig(**{**TINY.as_dict(), "world_seed": 40}))
    b = generate(tmp_path / "b", IndependentConfig(**{**TINY.as_dict(), "seed": 6, "world_seed": 40}))
    c = generate(tmp_path / "c", IndependentConfig(**{**TINY.as_dict(), "seed": 6, "world_seed": 41}))
    assert a["world"]["id"] == b["world"]["id"] != c["world"]["id"]
    assert a["world"]["seed"] == b["world"]["seed"] == 40
    assert a["world"]["parameters"] == b["world"]["parameters"]
    assert (a["seed"], b["seed"]) == (5, 6)
    assert _files(tmp_path / "a")["telemetry.parquet"] != _files(tmp_path / "b")["telemetry.parquet"]


def test_without_a_world_seed_the_independent_output_is_unchanged(tmp_path: Path) -> None:
    plain = generate(tmp_path / "plain", TINY)
    assert "world_seed" not in plain["config"]
    assert plain["world"]["seed"] == TINY.seed
    # The world of --seed named explicitly: the same files, the manifest only says so in its config.
    named = generate(tmp_path / "named", IndependentConfig(**{**TINY.as_dict(), "world_seed": TINY.seed}))
    assert _files(tmp_path / "plain") == _files(tmp_path / "named")
    assert {**named, "config": plain["config"]} == plain
    assert named["config"]["world_seed"] == TINY.seed


def test_simulate_takes_a_world_seed_for_the_independent_family_but_no_world_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = ["--nodes", "1", "--gpus-per-node", "2", "--days", "0.05", "--family", "independent"]
    assert main(["simulate", *tiny, "--world-seed", "40", "--seed", "9", "--out", str(tmp_path / "a")]) == 0
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert (manifest["world"]["seed"], manifest["seed"]) == (40, 9)
    world = tmp_path / "world.json"
    world.write_text("{}")
    assert main(["simulate", *tiny, "--world-file", str(world), "--out", str(tmp_path / "b")]) == 2
    assert "takes no --world-file" in capsys.readouterr().err


def test_scoring_split_by_nodes_over_processes_is_the_scoring_itself(
    fleets: dict[str, Path], reference: tuple[FaultModel, Path]
) -> None:
    """Features never look across nodes: one job cut into two parts of nodes, scored in two processes
    and joined, gives score_period's arrays (and the masked inputs stay masked). On the small fleet:
    the join is what is tested, not the size."""
    model, _ = reference
    dataset = open_dataset(fleets["second"])
    nodes, start, _ = held_out_part(dataset, model)
    assert len(nodes) == 2
    jobs = [
        ScoreJob(dataset, model, tuple(nodes), start, dataset.end_s, masked)
        for masked in ((), DCGM_DEFAULT_MISSING)
    ]
    assert [len(parts) for parts in split(jobs[:1], 2)] == [2]
    alone = [score_period(dataset, model, nodes, start, dataset.end_s, masked_inputs=j.masked) for j in jobs]
    apart = score_all(jobs[:1], processes=2) + score_all(jobs[1:], processes=1)
    for one, other in zip(alone, apart, strict=True):
        assert other.nodes == one.nodes
        np.testing.assert_array_equal(other.times_s, one.times_s)
        np.testing.assert_array_equal(other.present, one.present)
        np.testing.assert_array_equal(other.labels, one.labels)
        np.testing.assert_array_equal(other.modes, one.modes)
        assert other.scores.keys() == one.scores.keys()
        for method in one.scores:
            np.testing.assert_array_equal(other.scores[method], one.scores[method], err_msg=method)
    # The two inputs differ (else the comparison could not tell a mask lost on the way).
    assert not np.array_equal(alone[0].scores["model"], alone[1].scores["model"], equal_nan=True)


def test_evaluate_with_processes_prints_the_same_report(
    fleets: dict[str, Path], reference: tuple[FaultModel, Path], evaluated: tuple[dict[str, Any], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """`--jobs 3`: every scoring (the model's two, the reference's) in other processes; the same JSON."""
    report, _ = evaluated
    _, model = reference
    out = tmp_path / "report.json"
    first, second = fleets["evaluated"], fleets["second"]
    argv = ["evaluate", "--model", str(model), "--data", str(first), "--data", str(second),
            "--false-alarm-data", str(fleets["calm"]), "--false-alarm-data", str(fleets["elsewhere"]),
            "--reference", f"{first}={model}", "--reference", f"{second}={model}",
            "--resamples", "50", "--json", str(out), "--jobs", "3"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    again = json.loads(out.read_text())
    assert again.pop("evaluation_seconds") >= 0
    assert again == {k: v for k, v in report.items() if k != "evaluation_seconds"}
