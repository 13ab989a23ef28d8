"""Node-history features (model/features/history.py): a GPU's and its node's own past failures, from the
failures that started before the row only; offline from the dataset's log, online from the label log."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import FaultModel, Logistic
from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.history import HISTORY_NAMES, NO_FAILURE_HOURS, NO_HISTORY, FailureHistory
from faultcast.model.features.offline import Step, history_of, open_dataset, replay
from faultcast.model.incidents import AlertPolicy
from faultcast.modes import FailureMode
from faultcast.service.node_history import LabelHistory
from faultcast.service.scoring import ScoredStep, Scorer
from faultcast.service.state.labels import FailureLabel, LabelSource
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate

DAY, HOUR = 86_400.0, 3600.0
T0 = 1_767_225_600.0  # 2026-01-01
COLUMN = {name: i for i, name in enumerate(HISTORY_NAMES)}


def _one(history: FailureHistory, time_s: float, node: int, gpu: int) -> dict[str, float]:
    row = history.rows(np.array([time_s]), np.array([node]), np.array([gpu]))[0]
    return {name: float(row[i]) for name, i in COLUMN.items()}


def test_only_failures_that_started_before_the_row_count() -> None:
    """No leakage: a failure at the row's time, or a millisecond after, is the label's, not history's."""
    history = FailureHistory(np.array([T0]), np.array([0]), np.array([3]), gpus_per_node=8)
    at, just_after = _one(history, T0, 0, 3), _one(history, T0 - 0.001, 0, 3)
    assert at == just_after == dict(zip(HISTORY_NAMES, NO_HISTORY.tolist(), strict=True))
    later = _one(history, T0 + 1.0, 0, 3)
    assert later["history_gpu_failures_7d"] == later["history_node_failures_1d"] == 1.0
    assert later["history_gpu_hours_since_failure"] == pytest.approx(1.0 / 3600.0)


def test_a_gpu_failure_marks_its_node_and_a_node_failure_no_gpu() -> None:
    history = FailureHistory(np.array([T0, T0 + HOUR]), np.array([0, 1]), np.array([3, -1]), gpus_per_node=8)
    t = T0 + 2 * HOUR
    sibling, failed, other_node = _one(history, t, 0, 5), _one(history, t, 0, 3), _one(history, t, 1, 0)
    assert failed["history_gpu_failures_7d"] == 1.0
    assert sibling["history_gpu_failures_7d"] == 0.0
    assert failed["history_node_failures_7d"] == sibling["history_node_failures_7d"] == 1.0
    assert sibling["history_gpu_hours_since_failure"] == NO_FAILURE_HOURS
    assert sibling["history_node_hours_since_failure"] == pytest.approx(2.0)
    assert other_node["history_gpu_failures_30d"] == 0.0
    assert other_node["history_node_failures_1d"] == 1.0


def test_across_a_repair_gap_the_failure_counts_from_its_start_until_it_leaves_each_window() -> None:
    """A node back from a 20 h repair sees its failure 20 h ago; a refault then counts twice."""
    history = FailureHistory(
        np.array([T0, T0 + 21 * HOUR]), np.array([2, 2]), np.array([1, 1]), gpus_per_node=8
    )
    back = _one(history, T0 + 20 * HOUR, 2, 1)
    assert back["history_node_hours_since_failure"] == pytest.approx(20.0)
    assert back["history_node_failures_1d"] == 1.0
    refault = _one(history, T0 + 22 * HOUR, 2, 1)
    assert refault["history_gpu_failures_7d"] == 2.0
    assert refault["history_gpu_hours_since_failure"] == 1.0
    week_on = _one(history, T0 + 7.5 * DAY, 2, 1)  # the first left the week, the refault not
    assert week_on["history_gpu_failures_7d"] == 1.0
    assert week_on["history_gpu_failures_30d"] == 2.0
    gone = _one(history, T0 + 40 * DAY, 2, 1)
    assert gone["history_node_failures_30d"] == 0.0
    assert gone["history_node_hours_since_failure"] == NO_FAILURE_HOURS  # capped


def test_rows_of_many_times_match_one_at_a_time() -> None:
    """The vectorised path: random rows against a direct count over the log."""
    rng = np.random.default_rng(4)
    g, nodes = 4, 6
    times = T0 + rng.uniform(0, 60 * DAY, 80)
    node, gpu = rng.integers(0, nodes, 80), rng.integers(-1, g, 80)
    history = FailureHistory(times, node, gpu, g)
    q_t, q_n, q_g = (
        T0 + rng.uniform(-5 * DAY, 70 * DAY, 500),
        rng.integers(0, nodes, 500),
        rng.integers(0, g, 500),
    )
    q_t[:20] = times[:20]  # exactly at a failure's start
    got = history.rows(q_t, q_n, q_g)
    for k in range(len(q_t)):
        before = times < q_t[k]
        on_node, on_gpu = before & (node == q_n[k]), before & (node == q_n[k]) & (gpu == q_g[k])
        age = q_t[k] - times
        expect = [
            *(np.sum(on_gpu & (age <= d * DAY)) for d in (7, 30)),
            *(np.sum(on_node & (age <= d * DAY)) for d in (1, 7, 30)),
            *(
                min(age[m].min() / HOUR, NO_FAILURE_HOURS) if m.any() else NO_FAILURE_HOURS
                for m in (on_gpu, on_node)
            ),
        ]
        np.testing.assert_allclose(got[k], expect, rtol=1e-9, atol=1e-6, err_msg=f"row {k}")
    slots = history.at(float(q_t[0]), [3, 1])
    np.testing.assert_array_equal(
        slots[g : 2 * g], history.rows(np.full(g, q_t[0]), np.full(g, 1), np.arange(g))
    )


def test_the_engine_adds_the_columns_only_when_asked() -> None:
    plain, with_history = FeatureConfig(), FeatureConfig(node_history=True)
    assert FeatureEngine(with_history, 1).names == FeatureEngine(plain, 1).names + HISTORY_NAMES
    assert FeatureEngine(with_history, 1).schema_hash != FeatureEngine(plain, 1).schema_hash
    assert repr(with_history) == repr(plain)  # saved scoring states of plain models keep their signature
    engine = FeatureEngine(with_history, 1)
    gpu, node = np.full((8, len(GPU_INPUTS)), np.nan), np.full((1, len(NODE_INPUTS)), np.nan)
    block = np.arange(8 * len(HISTORY_NAMES), dtype=float).reshape(8, -1)
    np.testing.assert_array_equal(
        engine.update(0, gpu, node, np.zeros(8))[:, -len(HISTORY_NAMES) :], np.tile(NO_HISTORY, (8, 1))
    )
    np.testing.assert_array_equal(
        engine.update(1, gpu, node, np.zeros(8), history=block)[:, -len(HISTORY_NAMES) :], block
    )


def test_a_config_pickled_before_the_field_existed_loads_without_history() -> None:
    config = FeatureConfig(cadence_s=30.0, node_history=True)
    assert pickle.loads(pickle.dumps(config)) == config  # noqa: S301 (our own bytes)
    old = FeatureConfig.__new__(FeatureConfig)
    old.__setstate__([getattr(config, f.name) for f in fields(FeatureConfig)][:-1])  # the 5 fields of before
    assert old == FeatureConfig(cadence_s=30.0)


def test_replay_hands_each_step_the_history_of_the_failures_before_it(tmp_path: Path) -> None:
    fleet = FleetConfig(nodes=2, days=0.5, seed=5, acceleration=1.0, failures=False)
    simulate(fleet, tmp_path, [Scenario("hbm_wear", 0, 2, 3 * HOUR, 1800.0)])
    dataset = open_dataset(tmp_path)
    (failure,) = dataset.failures.rows()
    config = FeatureConfig(
        cadence_s=dataset.cadence_s, gpus_per_node=dataset.gpus_per_node, node_history=True
    )
    steps: list[Step] = []
    replay(dataset, config, steps.append, start_s=failure.time_s - 300.0, end_s=failure.time_s + 600.0)
    k = len(HISTORY_NAMES)
    expected = history_of(dataset)
    for step in steps:
        np.testing.assert_array_equal(step.features[:, -k:], expected.at(step.time_s, [0, 1]))
        gpu_count = step.features[2, COLUMN["history_gpu_failures_7d"] - k]
        assert gpu_count == (1.0 if step.time_s > failure.time_s else 0.0), step.index
    assert steps[0].time_s < failure.time_s < steps[-1].time_s


# -- online: the label log feeds the scorer --------------------------------------------------------

LIVE = FleetConfig(nodes=1, days=1.0, seed=3, acceleration=1.0, failures=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore.in_dir(tmp_path)
    yield opened
    opened.close()


def _model(config: FeatureConfig) -> FaultModel:
    """A model of `config`'s features in memory: one constant tree (testing/stub_model.py's, unsaved)."""
    names = FeatureEngine(config, 1).names
    y = np.zeros(8)
    y[0] = 1.0
    params = {"objective": "binary", "verbose": -1, "num_threads": 1}
    booster = lgb.train(params, lgb.Dataset(np.zeros((8, len(names))), y), num_boost_round=1)
    width = len(names)
    logistic = Logistic(np.zeros(width), np.zeros(width), np.ones(width), np.zeros(width), -2.0)
    return FaultModel(
        booster,
        (1.0, 0.0),
        None,
        ["hbm_wear"],
        None,
        config,
        names,
        1800.0,
        0.5,
        AlertPolicy(),
        logistic,
        0.5,
        0.5,
    )


def test_a_failure_added_to_the_label_log_changes_the_features_of_the_next_step(store: StateStore) -> None:
    source = LabelHistory(store)
    scorer = Scorer(_model(FeatureConfig(cadence_s=LIVE.cadence_s, node_history=True)), history=source)
    k = len(HISTORY_NAMES)
    gpu_7d, node_1d = COLUMN["history_gpu_failures_7d"] - k, COLUMN["history_node_failures_1d"] - k
    before: list[ScoredStep] = []
    after: list[ScoredStep] = []
    for i, snapshot in enumerate(twin_snapshots(TwinSource(LIVE, 0, []), LIVE.node_name(0), 12)):
        scorer.add(snapshot, float(i))
        (before if i <= 5 else after).extend(scorer.score_pending())
        if i == 5:  # a harvested failure of GPU 4, an hour before the stream began
            when = int((LIVE.start_unix_s - HOUR) * 1e9)
            label = FailureLabel(LIVE.node_name(0), 4, FailureMode.HBM_WEAR, when, LabelSource.KERNEL_LOG)
            store.labels.add([label], "ops")
    assert before
    assert after
    assert all(s.features[4, gpu_7d] == 0.0 and s.features[4, node_1d] == 0.0 for s in before)
    assert all(s.features[4, gpu_7d] == 1.0 for s in after)
    assert all(s.features[3, gpu_7d] == 0.0 and s.features[3, node_1d] == 1.0 for s in after)  # a neighbour
    assert source.rebuilds == 2  # read at the first step, and once more when the log changed
