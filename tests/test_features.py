"""The feature engine: one implementation, offline over the twin's files and online per sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.offline import Step, open_dataset, replay
from faultcast.model.features.online import LateSample, OnlineFeatures
from faultcast.readings import NodeSnapshot
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate

WEEK = FleetConfig(nodes=3, days=7.0, seed=17, acceleration=150.0)
SCENARIOS = [Scenario("hbm_wear", 1, 2, 2 * 86_400.0), Scenario("infiniband", 2, None, 3 * 86_400.0)]


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("week")
    simulate(WEEK, out, SCENARIOS)
    return out


def _collect(steps: list[Step], into: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    for step in steps:
        into[step.index] = (step.present.copy(), step.features.copy())


def test_offline_and_online_features_are_equal_over_a_simulated_week(week: Path) -> None:
    config = FeatureConfig(cadence_s=WEEK.cadence_s, gpus_per_node=WEEK.gpus_per_node)
    offline: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    replay(open_dataset(week), config, lambda s: _collect([s], offline))

    online = OnlineFeatures(config, [WEEK.node_name(n) for n in range(WEEK.nodes)], WEEK.start_unix_s)
    sources = [TwinSource(WEEK, n, SCENARIOS) for n in range(WEEK.nodes)]
    live: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(WEEK.steps):
        for node, source in reversed(list(enumerate(sources))):  # nodes report in any order
            reading = source.read()
            assert reading.time_unix_nano is not None
            snapshot = NodeSnapshot.merge(WEEK.node_name(node), reading.time_unix_nano, [reading], {})
            _collect(online.add(snapshot), live)
    _collect(online.flush(), live)

    assert sorted(live) == sorted(offline) == list(range(WEEK.steps))
    rows = compared = 0
    for step, (present, features) in offline.items():
        live_present, live_features = live[step]
        np.testing.assert_array_equal(present, live_present, err_msg=f"step {step}")
        np.testing.assert_allclose(live_features[present], features[present], rtol=1e-9, atol=1e-9,
                                   err_msg=f"step {step}")  # fmt: skip
        rows += int(present.sum())
        compared += int(np.isfinite(features[present]).sum())
    assert rows > 0.9 * WEEK.steps * WEEK.nodes * WEEK.gpus_per_node
    assert compared > 0.5 * rows * features.shape[1]  # most features are numbers, not NaN


def test_features_mean_the_same_at_another_cadence() -> None:
    """A GPU whose temperature climbs 1 C per minute: the 15-minute slope reads 1/60 C per second at a
    60 s and at a 10 s cadence, and a counter growing 3 per minute reads 0.05 per second at both."""
    results = {}
    for cadence in (60.0, 10.0):
        config = FeatureConfig(cadence_s=cadence)
        engine = FeatureEngine(config, 1)
        names = engine.names
        steps = int(3600 / cadence)
        for k in range(steps):
            t = k * cadence
            gpu = np.full((8, len(GPU_INPUTS)), 50.0)
            gpu[:, GPU_INPUTS.index("gpu_temp")] = 40.0 + t / 60.0
            gpu[:, GPU_INPUTS.index("ecc_sbe_volatile")] = 3.0 * t / 60.0
            features = engine.update(k, gpu, np.zeros((1, len(NODE_INPUTS))), np.zeros(8))
        results[cadence] = dict(zip(names, features[0], strict=True))
    for cadence, f in results.items():
        assert f["gpu_temp_slope_15m"] == pytest.approx(1 / 60, rel=1e-6), cadence
        assert f["sbe_rate_15m"] == pytest.approx(0.05, rel=1e-6), cadence
        assert f["sbe_rate"] == pytest.approx(0.05, rel=1e-6), cadence
        assert f["gpu_temp_mean_5m"] == pytest.approx(results[60.0]["gpu_temp_mean_5m"], abs=0.6)


def test_a_counter_reset_is_not_a_negative_rate() -> None:
    engine = FeatureEngine(FeatureConfig(), 1)
    column = GPU_INPUTS.index("pcie_replay")
    rates = []
    for k, value in enumerate([100.0, 110.0, 120.0, 3.0, 13.0]):  # a driver reload between 120 and 3
        gpu = np.full((8, len(GPU_INPUTS)), 1.0)
        gpu[:, column] = value
        features = engine.update(k, gpu, np.zeros((1, len(NODE_INPUTS))), np.zeros(8))
        rates.append(features[0, engine.names.index("pcie_replay_rate")])
    assert np.isnan(rates[0])
    assert rates[1:] == pytest.approx([10 / 60, 10 / 60, 3 / 60, 10 / 60])


def test_a_gap_is_counted_and_a_late_sample_refused() -> None:
    online = OnlineFeatures(FeatureConfig(), ["n0"], 0.0)
    source = TwinSource(
        FleetConfig(nodes=1, days=1.0, seed=2, confounders=False, failures=False, start_unix_s=0), 0
    )
    readings = [source.read() for _ in range(40)]
    steps: list[Step] = []
    for k, reading in enumerate(readings):
        if 20 <= k < 25:
            continue  # five scrapes lost
        assert reading.time_unix_nano is not None
        steps += online.add(NodeSnapshot.merge("n0", reading.time_unix_nano, [reading], {}))
    names = online.engine.names
    by_index = {s.index: s for s in steps}
    assert not by_index[22].present.any()
    after = by_index[25].features[0]
    # The sample ending the gap comes six of its own intervals after the last one; the first lost
    # scrape is held (a missed sample within 1.5 intervals is not a gap), the other four are missing.
    assert after[names.index("sample_late_ratio")] == pytest.approx(6.0)
    assert after[names.index("missing_share_15m")] == pytest.approx(4 / 15)
    late = readings[10]
    assert late.time_unix_nano is not None
    with pytest.raises(LateSample, match="after step"):
        online.add(NodeSnapshot.merge("n0", late.time_unix_nano, [late], {}))
