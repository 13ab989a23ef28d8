"""Training, the artifact, the alert policy and the evaluation, on a small twin."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from faultcast.model.artifact import FaultModel, Logistic, ModelError, load
from faultcast.model.evaluation.evaluate import held_out_part
from faultcast.model.evaluation.outcomes import (
    Outcome,
    PredictionPeriods,
    ScoredPeriod,
    catches,
    event_metrics,
    incidents,
    judge,
)
from faultcast.model.evaluation.rules import RULES, RulesBaseline
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.features.history import HISTORY_NAMES
from faultcast.model.features.offline import Failure, FailureLog, Labels, open_dataset
from faultcast.model.incidents import AlertPolicy
from faultcast.model.training.train import TrainConfig, make_split, train
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
# Enough failures that carry a precursor to fit, validate and test on (about a third of them do).
FLEET = FleetConfig(nodes=8, days=4.0, seed=5, acceleration=1000.0)
METHOD_KEYS = {
    "recall_1min", "recall_5min", "recall_5min_predictable", "median_lead_min", "p10_lead_min", "p90_lead_min",
    "false_alarms_per_1000_gpu_days", "premature_alarms_per_1000_gpu_days", "false_only_alarms_per_1000_gpu_days",
    "alert_precision", "pr_auc", "recall_by_mode",
}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    simulate(FLEET, out, [Scenario("hbm_wear", 1, 3, 2.6 * 86_400.0)])
    return out


@pytest.fixture(scope="module")
def trained(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FaultModel, Path]:
    out = tmp_path_factory.mktemp("model")
    model = train(open_dataset(data), out, TrainConfig(num_boost_round=60, negative_rate=0.05))
    return model, out


def test_the_artifact_loads_and_predicts(trained: tuple[FaultModel, Path]) -> None:
    model, out = trained
    assert {p.name for p in out.iterdir()} >= {
        "model.txt",
        "calibration.json",
        "logistic.json",
        "manifest.json",
    }
    loaded = load(out)
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("features", "horizon_s", "threshold", "training_data", "metrics", "created_at", "git_revision",
                "catalogue", "split"):  # fmt: skip
        assert key in manifest, key
    assert manifest["features"]["hash"] == FeatureEngine(loaded.feature_config, 1).schema_hash
    x = np.random.default_rng(0).normal(size=(5, len(loaded.feature_names)))
    np.testing.assert_allclose(loaded.risk(x), model.risk(x))
    assert ((loaded.risk(x) >= 0) & (loaded.risk(x) <= 1)).all()
    within = loaded.risk_within(x)
    assert within.shape == (5, 3)
    assert (np.diff(within, axis=1) >= -1e-12).all()  # risk within 5 <= 15 <= 30 minutes
    assert loaded.mode_probabilities(x).shape == (5, len(loaded.modes))
    top = loaded.contributions(x[:1], top=3)[0]
    assert len(top) == 3
    assert all(name in loaded.feature_names for name, _, _ in top)


def test_logistic_scores_a_large_batch_row_by_row_as_each_row_alone() -> None:
    """The logistic head works through a batch in blocks of rows: a batch larger than a block gets
    each row's score exactly as that row scored alone would, NaN taking the median, clipped."""
    rng = np.random.default_rng(3)
    width = 7
    logistic = Logistic(
        medians=rng.normal(size=width),
        means=rng.normal(size=width),
        scales=rng.uniform(0.5, 2.0, size=width),
        coef=rng.normal(size=width),
        intercept=-1.5,
    )
    x = rng.normal(scale=3.0, size=(2_500, width))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[7] = 1e6  # every standardised feature clipped to +20
    batch = logistic.logit(x)
    alone = np.concatenate([logistic.logit(x[i : i + 1]) for i in range(len(x))])
    assert np.array_equal(batch, alone)
    filled = np.where(np.isnan(x), logistic.medians, x)
    standardised = np.clip((filled - logistic.means) / logistic.scales, -20, 20)
    direct = np.clip((standardised * logistic.coef).sum(axis=1) - 1.5, -50, 50)
    np.testing.assert_allclose(batch, direct, rtol=1e-12, atol=1e-12)
    assert batch[7] == pytest.approx(np.clip(20.0 * logistic.coef.sum() - 1.5, -50, 50))
    np.testing.assert_allclose(logistic.predict(x), 1.0 / (1.0 + np.exp(-batch)))
    assert logistic.logit(x[:0]).shape == (0,)


def test_a_corrupt_or_mismatched_artifact_is_refused(
    trained: tuple[FaultModel, Path], tmp_path: Path
) -> None:
    _, out = trained
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    text = (broken / "model.txt").read_text()
    (broken / "model.txt").write_text(text.replace("tree", "treX", 1))
    with pytest.raises(ModelError, match=r"model\.txt is corrupt"):
        load(broken)

    shutil.rmtree(broken)
    shutil.copytree(out, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["features"]["hash"] = "0" * 16
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="feature schema"):
        load(broken)

    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(ModelError, match="corrupt"):
        load(broken)
    with pytest.raises(ModelError, match=r"manifest\.json is missing"):
        load(tmp_path / "nowhere")


def test_a_node_history_model_trains_loads_and_says_so(
    data: Path, trained: tuple[FaultModel, Path], tmp_path: Path
) -> None:
    """TrainConfig.node_history: the seven history columns after the others, read back from the names
    on load (no manifest change), and recorded in the card; a model trained without it records nothing."""
    out = tmp_path / "history"
    train(open_dataset(data), out, TrainConfig(num_boost_round=5, negative_rate=0.05, node_history=True))
    model = load(out)
    assert tuple(model.feature_names[-len(HISTORY_NAMES) :]) == tuple(HISTORY_NAMES)
    assert model.feature_config.node_history
    assert model.card.train_config is not None
    assert model.card.train_config["node_history"] is True
    plain, _ = trained
    assert not plain.feature_config.node_history
    assert plain.card.train_config is not None
    assert "node_history" not in plain.card.train_config
    assert not set(HISTORY_NAMES) & set(plain.feature_names)


def test_the_manifest_is_written_from_its_type_and_loads_as_it(trained: tuple[FaultModel, Path]) -> None:
    model, out = trained
    loaded = load(out)
    assert loaded.card == model.card
    assert json.dumps(loaded.card.to_json(), indent=2) + "\n" == (out / "manifest.json").read_text()
    assert loaded.card.features.names == loaded.feature_names
    assert loaded.card.metrics is not None
    assert loaded.card.metrics.trained_on == "local"


def _edited(out: Path, to: Path, path: tuple[str, ...], value: object) -> Path:
    """A copy of the model with one manifest value set (`value` None: the key removed)."""
    shutil.copytree(out, to)
    manifest = json.loads((to / "manifest.json").read_text())
    where = manifest
    for key in path[:-1]:
        where = where[key]
    if value is None:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    (to / "manifest.json").write_text(json.dumps(manifest))
    return to


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("metrics", "training_rows"), "many"),
        (("metrics", "best_iteration"), None),
        (("split", "test_nodes"), [0, 1]),
        (("timings_s", "total_s"), "1 s"),
        (("created_at",), 20260101),
        (("catalogue", "schema_hash"), None),
        (("features", "names"), "is_h100"),
    ],
)
def test_a_wrong_or_missing_manifest_field_is_refused_naming_it(
    trained: tuple[FaultModel, Path], tmp_path: Path, path: tuple[str, ...], value: object
) -> None:
    bad = _edited(trained[1], tmp_path / "bad", path, value)
    with pytest.raises(ModelError, match=rf"manifest\.json: {'.'.join(path)} is"):
        load(bad)


@pytest.mark.parametrize(
    "path",
    [
        ("created_at",),
        ("split",),
        ("metrics", "prediction_periods"),
        ("metrics", "validation_false_alarms_per_1000_gpu_days"),
        ("dcgm_default_threshold",),
    ],
)
def test_an_older_manifest_without_a_record_field_still_loads(
    trained: tuple[FaultModel, Path], tmp_path: Path, path: tuple[str, ...]
) -> None:
    older = load(_edited(trained[1], tmp_path / "older", path, None))
    assert older.threshold == trained[0].threshold


def test_evaluation_holds_out_the_split_of_data_written_before_the_cadence_rename(
    data: Path, trained: tuple[FaultModel, Path], tmp_path: Path
) -> None:
    """The same twin, its manifest saying "interval_s" as data written before December 2026 does: it
    opens, and evaluation still knows it for the model's own training data (held-out nodes only)."""
    model, _ = trained
    old = tmp_path / "old-data"
    shutil.copytree(data, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["config"]["interval_s"] = manifest["config"].pop("cadence_s")
    (old / "manifest.json").write_text(json.dumps(manifest))
    dataset = open_dataset(old)
    assert dataset.cadence_s == open_dataset(data).cadence_s
    nodes, start, own_data = held_out_part(dataset, model)
    assert own_data
    assert model.card.split is not None
    assert (sorted(nodes), start) == (
        sorted(dataset.node_index(n) for n in model.card.split.test_nodes),
        model.card.split.test_start_unix_s,
    )
    # And the other way round: a model trained before the rename, on data written after it.
    config = json.loads((trained[1] / "manifest.json").read_text())["training_data"]["manifest"]["config"]
    config["interval_s"] = config.pop("cadence_s")
    older = load(
        _edited(trained[1], tmp_path / "older-model", ("training_data", "manifest", "config"), config)
    )
    assert held_out_part(open_dataset(data), older)[2]


def test_the_split_holds_out_nodes_and_the_last_weeks(data: Path) -> None:
    dataset = open_dataset(data)
    split = make_split(dataset, TrainConfig())
    assert set(split.train_nodes).isdisjoint(split.test_nodes)
    assert len(split.test_nodes) == FLEET.nodes // 4  # a quarter of the nodes
    assert dataset.start_s < split.validation_start_s < split.train_end_s < dataset.end_s
    assert split.train_end_s == pytest.approx(
        dataset.start_s + FLEET.days * 86_400.0 * 2 / 3
    )  # last third out


def test_labels_mark_the_horizon_before_each_failure() -> None:
    log = FailureLog.of([Failure(10_000.0, 0, 3, "hbm_wear"), Failure(20_000.0, 1, -1, "infiniband")])
    labels = Labels(1800.0, log)
    positive, ttf, mode = labels.at(10_000.0 - 600.0, [0, 1], 8)
    assert positive.tolist() == [i == 3 for i in range(16)]
    assert ttf[3] == 600.0
    assert mode[3] == "hbm_wear"
    assert not labels.at(10_000.0 - 1801.0, [0, 1], 8)[0].any()  # earlier than the horizon
    assert not labels.at(10_000.0, [0, 1], 8)[0].any()  # the failure itself is not a precursor
    node_level = labels.at(20_000.0 - 60.0, [0, 1], 8)[0]
    assert node_level.tolist() == [i >= 8 for i in range(16)]  # every GPU of the node


def _period(
    risk: np.ndarray, modes: np.ndarray | None = None, gpus_per_node: int | None = None
) -> ScoredPeriod:
    steps, slots = risk.shape
    g = gpus_per_node or slots
    present = np.ones_like(risk, dtype=bool)
    return ScoredPeriod(
        np.arange(steps) * 60.0, tuple(range(slots // g)), g, present, {"model": risk}, np.zeros_like(present),
        np.full(risk.shape, "hbm_wear", dtype=object) if modes is None else modes,
    )  # fmt: skip


def test_the_batch_path_opens_after_k_scores_holds_above_the_hold_level_and_never_expires() -> None:
    policy = AlertPolicy(k=2, clear_steps=3, hold_ratio=0.5)
    risk = np.zeros((300, 2))
    risk[5:7, 0] = 0.9  # two scores in a row: one alert at step 6
    risk[15, 0] = 0.9  # a single spike after it cleared (step 9): nothing (k=2)
    risk[20:300, 1] = 0.9  # high for hours: one alert, never re-raised
    risk[100:102, 1] = 0.3  # a dip under the threshold but above the hold level (0.25) holds it
    (found,) = incidents(_period(risk), "model", [0.5], policy, NODE_LEVEL_MODES)
    assert [(i.opened_step, i.gpu, i.closed_step) for i in found] == [(6, 0, 9), (21, 1, -1)]
    (none,) = incidents(_period(risk), "model", [0.95], policy, NODE_LEVEL_MODES)
    assert none == []


def test_a_node_level_mode_is_one_incident_for_the_node_credited_only_by_a_node_failure() -> None:
    risk = np.zeros((200, 8))
    modes = np.full(risk.shape, "hbm_wear", dtype=object)
    risk[10:12, :] = 0.9  # the whole node lights up, with a node-level mode
    modes[10:12, :] = "infiniband"
    risk[40:42, 2] = 0.9  # then GPU 2 alone
    period = _period(risk, modes)
    (found,) = incidents(period, "model", [0.5], AlertPolicy(k=2, clear_steps=3), NODE_LEVEL_MODES)
    assert [(i.opened_step, i.gpu, len(i.slots_at_open)) for i in found] == [(11, -1, 8), (41, 2, 1)]
    # A failure of GPU 5 credits neither (the node incident's evidence was the network, GPU 2's
    # incident was GPU 2); a node-level failure 15 minutes after the node incident credits it.
    log = FailureLog.of(
        [Failure(11 * 60.0 + 900.0, 0, -1, "infiniband"), Failure(41 * 60.0 + 600.0, 0, 5, "power")]
    )
    outcomes = [(j.incident.gpu, j.outcome) for j in judge(period, log, found, PredictionPeriods())]
    assert outcomes == [(-1, Outcome.TRUE), (2, Outcome.FALSE)]


def test_incidents_are_true_late_premature_or_false_by_the_prediction_period() -> None:
    risk = np.zeros((3000, 4))
    for gpu, at in enumerate((100, 400, 800, 1200)):
        risk[at : at + 3, gpu] = 0.9  # four incidents, opening at at + 1
    period = _period(risk)
    t = period.times_s
    log = FailureLog.of([
        Failure(t[101] + 20 * 60.0, 0, 0, "hbm_wear"),  # 20 min after: true
        Failure(t[401] + 3 * 60.0, 0, 1, "pcie"),  # 3 min after: late
        Failure(t[801] + 5 * 3600.0, 0, 2, "power"),  # 5 h after: premature
    ])  # fmt: skip
    (found,) = incidents(period, "model", [0.5], AlertPolicy(k=2, clear_steps=3), NODE_LEVEL_MODES)
    periods = PredictionPeriods(warning_s=300.0, period_s=7200.0)
    judged = judge(period, log, found, periods)
    assert [j.outcome for j in judged] == [Outcome.TRUE, Outcome.LATE, Outcome.PREMATURE, Outcome.FALSE]
    assert [j.lead_s for j in judged] == [1200.0, 180.0, 18000.0, None]
    assert [c.lead_s for c in catches(period, log, found, periods)] == [1200.0, 180.0, None]
    metrics = event_metrics(period, log, found, periods, risk)
    per_1000 = 1000.0 / period.gpu_days
    assert metrics["recall_5min"] == pytest.approx(
        1 / 3
    )  # the late one was not in time, the premature one missed
    assert metrics["recall_1min"] == pytest.approx(2 / 3)
    assert metrics["false_alarms_per_1000_gpu_days"] == pytest.approx(2 * per_1000)
    assert metrics["premature_alarms_per_1000_gpu_days"] == pytest.approx(per_1000)
    assert metrics["false_only_alarms_per_1000_gpu_days"] == pytest.approx(per_1000)
    assert metrics["alert_precision"] == pytest.approx(1 / 4)
    assert metrics["median_lead_min"] == pytest.approx(20.0)
    # A longer prediction period makes the premature alarm true and catches its failure.
    longer = PredictionPeriods(warning_s=300.0, period_s=6 * 3600.0)
    assert [j.outcome for j in judge(period, log, found, longer)][2] is Outcome.TRUE


def test_every_rule_reads_a_computed_feature_and_fires_above_its_threshold() -> None:
    engine = FeatureEngine(FeatureConfig(), 1)
    rules = RulesBaseline(engine.names)
    quiet = np.zeros((len(RULES), len(engine.names)))
    loud = quiet.copy()
    for row, (feature, threshold, _) in enumerate(RULES):
        loud[row, engine.names.index(feature)] = threshold + 1.0
    assert (rules.score(quiet) == 0).all()
    assert (rules.score(loud) == 1).all()


def test_train_and_evaluate_commands_write_the_promised_json(data: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    done = subprocess.run([FAULTCAST, "train", "--data", str(data), "--out", str(model_dir)],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "threshold" in done.stdout
    report_path = tmp_path / "eval.json"
    done = subprocess.run([FAULTCAST, "evaluate", "--model", str(model_dir), "--data", str(data), "--json",
                           str(report_path)], capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    assert report["test_gpu_days"] > 0
    assert report["test_failures"] >= 1
    assert report["held_out_from_training"] is True
    for method in ("model", "rules", "logistic"):
        assert set(report[method]) >= METHOD_KEYS, method
        m = report[method]
        assert m["false_alarms_per_1000_gpu_days"] == pytest.approx(
            m["premature_alarms_per_1000_gpu_days"] + m["false_only_alarms_per_1000_gpu_days"]
        )
    assert report["definitions"]["warning_s"] == 300.0
    assert report["definitions"]["period_s"] == 7200.0
    assert "| model |" in done.stdout
    assert "prediction period 120 min" in done.stdout

    # Two datasets (the training twin and a quiet one at acceleration 1), false alarms measured apart;
    # the same run takes a longer prediction period and a shorter warning time than the defaults (each
    # run of the command scores the training twin again: one run checks both).
    quiet = tmp_path / "quiet"
    simulate(FleetConfig(nodes=2, days=0.5, seed=9, acceleration=1.0), quiet, [])
    both = tmp_path / "eval-both.json"
    done = subprocess.run([FAULTCAST, "evaluate", "--model", str(model_dir), "--data", str(data), "--data",
                           str(quiet), "--false-alarm-data", str(quiet), "--json", str(both), "--resamples",
                           "200", "--prediction-period", "4h", "--warning-time", "2m"],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pooled = json.loads(both.read_text())
    assert pooled["definitions"]["period_s"] == 4 * 3600.0
    assert pooled["definitions"]["warning_s"] == 120.0
    assert all(d["definitions"]["period_s"] == 4 * 3600.0 for d in pooled["datasets"])
    own, other = pooled["datasets"]
    assert own["world"]["evaluation"].startswith("held-out nodes and days of the training world")
    assert other["held_out_from_training"] is False
    assert pooled["pooled"]["test_gpu_days"] == pytest.approx(own["test_gpu_days"] + other["test_gpu_days"])
    for key in ("model", "logistic", "logistic_matched", "rules", "rules_matched"):
        assert pooled["pooled"][key]["failures"] == own[key]["failures"] + other[key]["failures"], key
        apart = own["false_alarm_data"]["methods"][key]
        assert apart["gpu_days"] == pytest.approx(other["test_gpu_days"])  # the same quiet part
        assert len(own[key]["ci95"]["recall_5min"]) == 2
    for matched in ("logistic_matched", "rules_matched"):
        if own[matched]["within_target"]:
            assert own[matched]["false_alarms"] <= own["model"]["false_alarms"]
    assert "pooled over 2 datasets" in done.stdout
    assert "false alarms measured apart" in done.stdout

    bad = subprocess.run([FAULTCAST, "evaluate", "--model", str(tmp_path / "none"), "--data", str(data)],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2
    assert f"--model {tmp_path / 'none'}: no such directory" in bad.stderr  # refused before loading
