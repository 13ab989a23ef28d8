"""The evaluation's own machinery on small constructed data (no model is trained): bootstrap intervals
by node, baselines matched to the model's false alarms, the rules' scale, predictable recall from the
failure log's `precursor_s`, and the leave-world-out flag."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from faultcast.model.evaluation.evaluate import PRECURSOR_UNKNOWN, json_safe, report_notes
from faultcast.model.evaluation.intervals import (
    FIGURES,
    NodeTallies,
    bootstrap,
    point,
    resample_weights,
    weighted_figures,
    zero_events_upper_95,
)
from faultcast.model.evaluation.matching import MARGIN, matched_scale, matched_threshold, rules_setting
from faultcast.model.evaluation.outcomes import (
    PredictionPeriods,
    ScoredPeriod,
    event_metrics,
    events,
    incidents,
    metrics_of,
    node_tallies,
)
from faultcast.model.evaluation.rules import RULES, ZERO_RULE_FLOOR, RulesBaseline
from faultcast.model.evaluation.worlds import check_world
from faultcast.model.features.engine import FeatureConfig, FeatureEngine
from faultcast.model.features.offline import DataError, Failure, FailureLog, open_dataset
from faultcast.model.incidents import AlertPolicy
from faultcast.modes import NODE_LEVEL_MODES

PERIODS = PredictionPeriods()
POLICY = AlertPolicy(k=2, clear_steps=3)


# -- the bootstrap ------------------------------------------------------------------------------


def _tallies(nodes: int, seed: int) -> NodeTallies:
    """A synthetic fleet: each node fails a few times, 70% of failures caught, a few false alarms."""
    rng = np.random.default_rng(seed)
    failures = rng.poisson(2.0, nodes).astype(float)
    caught = rng.binomial(failures.astype(int), 0.7).astype(float)
    premature = rng.poisson(0.2, nodes).astype(float)
    false_only = rng.poisson(0.3, nodes).astype(float)
    owners = np.repeat(np.arange(nodes), caught.astype(int))
    return NodeTallies(
        failures=failures,
        caught=caught,
        caught_1min=caught,
        predictable=failures,
        predictable_caught=caught,
        precursor_unknown=np.zeros(nodes),
        alerts=caught + premature + false_only,
        true_alarms=caught,
        premature_alarms=premature,
        false_only_alarms=false_only,
        gpu_days=np.full(nodes, 8.0 * 30),
        leads_min=rng.lognormal(3.0, 0.8, len(owners)),
        lead_node=owners,
    )


def test_bootstrap_intervals_hold_the_estimate_and_narrow_with_more_nodes() -> None:
    few, many = _tallies(25, seed=1), _tallies(400, seed=2)
    widths = {}
    for name, tallies in (("few", few), ("many", many)):
        values, ci = point(tallies), bootstrap(tallies, resamples=1000, seed=0)
        for figure in FIGURES:
            lo, hi = ci[figure]
            assert lo <= values[figure] <= hi, (name, figure, lo, values[figure], hi)
        widths[name] = {figure: ci[figure][1] - ci[figure][0] for figure in FIGURES}
    for figure in ("recall_5min", "false_alarms_per_1000_gpu_days", "alert_precision", "median_lead_min"):
        assert widths["many"][figure] < widths["few"][figure] / 2, figure  # ~ 1 / sqrt(nodes): a quarter


def test_a_resample_draws_as_many_nodes_as_there_are_and_the_median_is_numpys() -> None:
    weights = resample_weights(7, resamples=50, seed=3)
    assert weights.shape == (50, 7)
    assert (weights.sum(axis=1) == 7).all()
    assert len({tuple(w) for w in weights.tolist()}) > 1  # the seed draws different resamples
    tallies = _tallies(7, seed=4)
    medians = weighted_figures(tallies, weights)["median_lead_min"]
    for w, median in zip(weights, medians, strict=True):
        drawn = np.repeat(tallies.leads_min, w[tallies.lead_node].astype(int))
        if drawn.size:
            assert median == pytest.approx(np.percentile(drawn, 50))
        else:
            assert math.isnan(median)


def test_pooled_tallies_keep_each_lead_with_its_node() -> None:
    a, b = _tallies(5, seed=5), _tallies(9, seed=6)
    both = NodeTallies.concat([a, b])
    assert both.nodes == 14
    assert (both.lead_node[len(a.leads_min) :] >= 5).all()
    # Dropping the first period's nodes (weight 0) leaves the second's figures.
    only_b = weighted_figures(both, np.concatenate([np.zeros(5), np.ones(9)])[None, :])
    for figure, value in point(b).items():
        assert only_b[figure][0] == pytest.approx(value, nan_ok=True), figure


def test_no_false_alarm_bounds_the_rate_by_poisson() -> None:
    assert zero_events_upper_95(0, 2472.0) == pytest.approx(1.21, abs=0.005)  # the README's bound
    assert zero_events_upper_95(1, 2472.0) is None


# -- a constructed period -----------------------------------------------------------------------


def _period(scores: dict[str, np.ndarray]) -> ScoredPeriod:
    """One GPU per node; every row present."""
    steps, slots = next(iter(scores.values())).shape
    present = np.ones((steps, slots), dtype=bool)
    return ScoredPeriod(
        np.arange(steps) * 60.0,
        tuple(range(slots)),
        1,
        present,
        scores,
        np.zeros_like(present),
        np.full((steps, slots), "hbm_wear", dtype=object),
    )


def _spike(score: np.ndarray, node: int, start: int, value: float, steps: int = 30) -> None:
    score[start : start + steps, node] = value


# Node 0 fails at step 200 and node 1 at 600, each after a 30-minute precursor; nodes 2 and 3 never do.
FAILURES = FailureLog.of(
    [Failure(200 * 60.0, 0, 0, "hbm_wear", 1800.0), Failure(600 * 60.0, 1, 0, "pcie", 1800.0)]
)


def _scored() -> ScoredPeriod:
    model, logistic = np.zeros((1000, 4)), np.zeros((1000, 4))
    _spike(model, 0, 170, 0.9)
    _spike(model, 1, 570, 0.9)
    _spike(model, 3, 300, 0.9, steps=3)  # one false alarm: the rate the baselines are matched to
    _spike(logistic, 0, 170, 0.6)
    _spike(logistic, 1, 570, 0.8)
    _spike(logistic, 2, 100, 0.9, steps=3)  # false
    _spike(logistic, 3, 300, 0.7, steps=3)  # false
    return _period({"model": model, "logistic": logistic})


def _metrics(period: ScoredPeriod, method: str, threshold: float) -> dict[str, Any]:
    (found,) = incidents(period, method, [threshold], POLICY, NODE_LEVEL_MODES)
    return event_metrics(period, FAILURES, found, PERIODS, period.scores[method])


def test_the_matched_logistic_threshold_stays_within_the_models_false_alarms_with_more_recall() -> None:
    period = _scored()
    model = _metrics(period, "model", 0.5)
    assert (model["false_alarms"], model["recall_5min"]) == (1, 1.0)
    chosen, within = matched_threshold(period, FAILURES, "logistic", 1, POLICY, NODE_LEVEL_MODES, PERIODS)
    assert within
    matched = _metrics(period, "logistic", chosen.setting)
    assert chosen.false_alarms == matched["false_alarms"] == 1
    assert matched["false_alarms_per_1000_gpu_days"] <= model["false_alarms_per_1000_gpu_days"]
    assert 0.7 < chosen.setting <= 0.8  # node 3's 0.7 would be a second false alarm
    stricter = _metrics(period, "logistic", 0.85)
    assert matched["recall_5min"] == 0.5 > stricter["recall_5min"]
    # At no false alarm allowed only a threshold above every score is left.
    none, _ = matched_threshold(period, FAILURES, "logistic", 0, POLICY, NODE_LEVEL_MODES, PERIODS)
    assert none.setting > 0.9
    assert none.found == []


def test_the_tallies_give_the_same_figures_as_the_report() -> None:
    period = _scored()
    (found,) = incidents(period, "logistic", [0.65], POLICY, NODE_LEVEL_MODES)
    judged = events(period, FAILURES, found, PERIODS)
    metrics, tallies = (
        metrics_of(period, judged, PERIODS, period.scores["logistic"]),
        node_tallies(period, judged, PERIODS),
    )
    assert tallies.gpu_days.sum() == pytest.approx(period.gpu_days)
    for figure, value in point(tallies).items():
        assert value == pytest.approx(metrics[figure], nan_ok=True), figure


# -- the rules' scale ---------------------------------------------------------------------------


def test_a_larger_scale_fires_fewer_rules_and_the_margin_says_which() -> None:
    names = FeatureEngine(FeatureConfig(), 1).names
    rng = np.random.default_rng(7)
    rows = np.full((400, len(names)), np.nan)
    for feature, threshold, _ in RULES:
        rows[:, names.index(feature)] = max(threshold, ZERO_RULE_FLOOR) * rng.lognormal(0.0, 2.0, 400)
    shipped = RulesBaseline(names)
    fired = [RulesBaseline(names, scale=k).score(rows).sum() for k in (1.0, 2.0, 10.0, 100.0)]
    assert fired == sorted(fired, reverse=True)
    assert fired[0] > fired[-1] > 0
    margin = shipped.margin(rows)
    for k in (2.0, 10.0, 100.0):
        np.testing.assert_array_equal(RulesBaseline(names, scale=k).score(rows), margin > k)
    # A rule of threshold 0 fires on any count as shipped, and from its floor times the scale beyond.
    dbe = np.zeros((1, len(names)))
    dbe[0, names.index("dbe_rate")] = 1.5 * ZERO_RULE_FLOOR
    assert shipped.score(dbe)[0] == 1.0
    assert RulesBaseline(names, scale=2.0).score(dbe)[0] == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        RulesBaseline(names, scale=0.5)


def test_the_rules_at_a_scale_alert_alike_from_the_margin_and_from_their_own_score() -> None:
    rng = np.random.default_rng(8)
    margin = np.where(rng.random((600, 6)) < 0.2, rng.lognormal(1.5, 1.5, (600, 6)), 0.0)
    margin[rng.random((600, 6)) < 0.05] = np.nan  # absent rows
    for k in (2.0, 5.0, 20.0):
        scaled = np.where(np.isnan(margin), np.nan, (margin > k).astype(float))
        period = _period({MARGIN: margin, "rules": scaled})
        at = rules_setting(k, POLICY)
        (direct,) = incidents(period, "rules", [0.5], POLICY, NODE_LEVEL_MODES)
        (via,) = incidents(period, at.method, [at.threshold], at.policy, NODE_LEVEL_MODES)
        assert direct, k
        assert [(i.opened_step, i.node, i.closed_step) for i in via] == [
            (i.opened_step, i.node, i.closed_step) for i in direct
        ]


def test_the_scale_matched_to_the_model_is_the_loosest_within_its_false_alarms() -> None:
    margin = np.zeros((1000, 4))
    _spike(margin, 1, 570, 30.0)  # the precursor of node 1's failure
    _spike(margin, 2, 100, 8.0, steps=3)  # false at scales under 8
    _spike(margin, 3, 300, 3.0, steps=3)  # false at scales under 3
    period = _period({MARGIN: margin, "rules": (margin > 0).astype(float)})
    chosen, within = matched_scale(period, FAILURES, 1, POLICY, NODE_LEVEL_MODES, PERIODS)
    assert within
    assert (chosen.setting, chosen.false_alarms) == (5.0, 1)
    chosen, within = matched_scale(period, FAILURES, 0, POLICY, NODE_LEVEL_MODES, PERIODS)
    assert (chosen.setting, chosen.false_alarms, within) == (10.0, 0, True)


# -- predictable failures -----------------------------------------------------------------------


def test_predictable_recall_counts_only_failures_the_log_says_had_a_precursor() -> None:
    model = np.zeros((1000, 3))
    _spike(model, 0, 170, 0.9)  # caught
    _spike(model, 2, 770, 0.9)  # caught, but the log says it had no precursor
    period = _period({"model": model})
    (found,) = incidents(period, "model", [0.5], POLICY, NODE_LEVEL_MODES)

    def metrics(third_precursor_s: float) -> dict[str, object]:
        log = FailureLog.of([
            Failure(200 * 60.0, 0, 0, "hbm_wear", 1800.0),
            Failure(600 * 60.0, 1, 0, "hbm_wear", 900.0),  # missed
            Failure(800 * 60.0, 2, 0, "hbm_wear", third_precursor_s),
        ])  # fmt: skip
        return event_metrics(period, log, found, PERIODS, model)

    known = metrics(0.0)
    assert known["recall_5min"] == pytest.approx(2 / 3)
    # Per mode, the same accounting: 3 failures, 2 predictable, 1 of them caught (the spike at step 170
    # opens an alert at 171, its second score: 29 min before the failure at 200).
    assert known["by_mode"] == {
        "hbm_wear": {
            "failures": 3,
            "predictable": 2,
            "predictable_caught": 1,
            "recall_5min_predictable": 0.5,
            "median_lead_min": pytest.approx(29.0),
        }
    }
    assert known["recall_by_mode"] == {"hbm_wear": pytest.approx(2 / 3)}
    assert known["recall_5min_predictable"] == pytest.approx(1 / 2)  # the same mode, yet left out
    assert (known["failures_predictable"], known["failures_precursor_unknown"]) == (2, 0)
    assert not any(PRECURSOR_UNKNOWN in n for n in report_notes(known, {"acceleration": 1.0}, False))

    unknown = metrics(math.nan)
    assert math.isnan(float(unknown["recall_5min_predictable"]))  # type: ignore[arg-type]
    assert json_safe(unknown)["by_mode"]["hbm_wear"]["predictable"] is None
    assert json_safe(unknown)["by_mode"]["hbm_wear"]["recall_5min_predictable"] is None
    assert json_safe(unknown)["recall_5min_predictable"] is None
    assert (unknown["failures_predictable"], unknown["failures_precursor_unknown"]) == (None, 1)
    assert any(PRECURSOR_UNKNOWN in n for n in report_notes(unknown, {"acceleration": 1.0}, False))


def _data_dir(tmp: Path, header: str, rows: list[str]) -> Path:
    """Enough of a data directory for open_dataset to read its failure log."""
    tmp.mkdir()
    config = {"gpus_per_node": 8, "cadence_s": 60.0, "nodes": 2, "start_unix_s": 1767571200, "days": 1.0}
    (tmp / "manifest.json").write_text(json.dumps({"config": config}))
    (tmp / "telemetry.parquet").write_bytes(b"")
    (tmp / "failures.csv").write_text("\n".join([header, *rows]) + "\n")
    return tmp


def test_the_failure_log_says_which_failures_had_a_precursor(tmp_path: Path) -> None:
    header = "timestamp,node,gpu,uuid,mode,xid,precursor_s,description"
    rows = [
        f"2026-01-05T0{h}:00:00Z,node-0000,1,,hbm_wear,,{p}," for h, p in ((1, ""), (2, "0"), (3, "120.5"))
    ]
    log = open_dataset(_data_dir(tmp_path / "new", header, rows)).failures
    np.testing.assert_array_equal(log.precursor_s, [np.nan, 0.0, 120.5])
    assert [f.precursor_s for f in log.between(0.0, 2e9)][1:] == [0.0, 120.5]

    old = open_dataset(
        _data_dir(tmp_path / "old", "timestamp,node,gpu,mode", ["2026-01-05T01:00:00Z,node-0001,,host"])
    )
    assert math.isnan(old.failures.rows()[0].precursor_s)  # a log written before the column existed

    bad = _data_dir(tmp_path / "bad", header, ["2026-01-05T01:00:00Z,node-0000,1,,hbm_wear,,-3,"])
    with pytest.raises(DataError, match="precursor_s"):
        open_dataset(bad)


# -- leave-world-out ----------------------------------------------------------------------------


def _manifest(world_id: str | None, parameters: dict[str, float] | None = None) -> dict[str, object]:
    out: dict[str, object] = {"config": {"nodes": 8, **({"world": parameters} if parameters else {})}}
    if world_id is not None:
        out["world"] = {"family": "faultcast-twin", "seed": 3, "id": world_id}
    return out


def test_the_world_block_says_whether_the_model_saw_the_world() -> None:
    other = check_world(_manifest("b2"), _manifest("a1"), same_data=False)
    assert (other.unseen_world, other.compared) == (True, "id")
    assert other.title.startswith("leave-world-out")
    assert other.to_json()["training_ids"] == ["a1"]
    assert other.to_json()["seed"] == 3

    same = check_world(_manifest("a1"), _manifest("a1"), same_data=False)
    assert same.unseen_world is False
    assert "flatters the model" in same.title

    own = check_world(_manifest("a1"), _manifest("a1"), same_data=True)
    assert own.title == "held-out nodes and days of the training world (flatters the model)"

    # A model card that kept the twin's config but no "world" block: told by the world's parameters.
    by_parameters = check_world(
        _manifest("b2", {"lead_scale": 2.0}), _manifest(None, {"lead_scale": 1.0}), False
    )
    assert (by_parameters.unseen_world, by_parameters.compared) == (True, "parameters")

    unknown = check_world(_manifest(None), _manifest("a1"), same_data=False)  # an import: no world
    assert unknown.unseen_world is None
    assert unknown.to_json()["unseen_world"] is None
    assert "do not say" in unknown.title


def test_training_learns_only_from_failures_a_warning_could_precede() -> None:
    log = FailureLog.of(
        [
            Failure(100.0, 0, 1, "hbm_wear", 1800.0),  # carried a precursor: learnable
            Failure(200.0, 0, 2, "hbm_wear", 0.0),  # the log says it had none
            Failure(300.0, 1, -1, "software", math.nan),  # unknown, and software never warns
            Failure(400.0, 1, 3, "pcie", math.nan),  # unknown, and PCIe can warn
            Failure(500.0, 2, 0, "made_up_mode", math.nan),  # a mode faultcast does not know: kept
        ]
    )
    learnable = log.learnable()
    assert learnable.time_s.tolist() == [100.0, 400.0, 500.0]
    assert learnable.mode.tolist() == ["hbm_wear", "pcie", "made_up_mode"]
