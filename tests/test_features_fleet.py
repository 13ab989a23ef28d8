"""Features that mean the same on any fleet: sparse exports held across their gap, frozen exporters
recognised, readings against the GPU's own history and its node's, any node size, no warnings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine

_COL = {name: i for i, name in enumerate(GPU_INPUTS)}


def _live(k: int, g: int, cadence: float, rng: np.random.Generator) -> np.ndarray:
    """One step's readings of a node of `g` healthy GPUs: power and temperature moving with a job."""
    t = k * cadence
    gpu = np.full((g, len(GPU_INPUTS)), 0.0)
    gpu[:, _COL["power_usage"]] = 400.0 + 50.0 * np.sin(t / 600.0) + rng.normal(0, 5, g)
    gpu[:, _COL["gpu_temp"]] = 30.0 + 0.08 * gpu[:, _COL["power_usage"]] + rng.normal(0, 0.3, g)
    gpu[:, _COL["memory_temp"]] = gpu[:, _COL["gpu_temp"]] + 5.0
    gpu[:, _COL["sm_clock"]] = 1980.0 - rng.integers(0, 3, g) * 15.0
    gpu[:, _COL["gpu_util"]] = 95.0 + rng.normal(0, 1, g)
    gpu[:, _COL["ecc_sbe_volatile"]] = np.floor(t / 3600.0)  # a trickle: one SBE an hour, every GPU
    gpu[:, _COL["pcie_replay"]] = 0.0
    return gpu


def _run(
    cadence_data: float, hours: float, g: int = 8, burst_from_h: float | None = None, seed: int = 0
) -> tuple[dict[str, np.ndarray], FeatureEngine, list[np.ndarray]]:
    """A 60 s engine fed one node sampled every `cadence_data` seconds for `hours`; GPU 3 gets 60 SBE
    an hour on top of the trickle from `burst_from_h`. Returns the last step's features by name, the
    engine, and each step's presence."""
    config = FeatureConfig(gpus_per_node=8)
    engine = FeatureEngine(config, 1, g)
    rng = np.random.default_rng(seed)
    every = round(cadence_data / config.cadence_s)
    presence = []
    extra = 0.0
    features = np.zeros(0)
    for k in range(int(hours * 3600 / config.cadence_s)):
        gpu = _live(k, g, config.cadence_s, rng)
        if burst_from_h is not None and k * config.cadence_s >= burst_from_h * 3600:
            extra += 1.0  # one more SBE a minute on GPU 3
        gpu[3, _COL["ecc_sbe_volatile"]] += extra
        if k % every:
            gpu[:] = np.nan  # not sampled in this step
        features = engine.update(k, gpu, np.full((1, len(NODE_INPUTS)), np.nan), np.ones(g))
        presence.append(engine.present.copy())
    return {n: features[:, i] for i, n in enumerate(engine.names)}, engine, presence


def test_a_ten_minute_export_reads_like_a_one_minute_one_on_a_one_minute_grid() -> None:
    """The same GPUs sampled every 60 s and every 600 s: after warm-up every grid step has every GPU
    (held across the gap), nobody is late or missing, and the error features agree."""
    fine, _, _ = _run(60.0, 30.0, burst_from_h=28.0)
    sparse, _, presence = _run(600.0, 30.0, burst_from_h=28.0)
    assert all(p.all() for p in presence[20:])
    for f in (fine, sparse):
        assert np.nanmax(f["missing_share_60m"]) == 0.0
        assert np.nanmax(f["sample_late_ratio"]) <= 1.0
    # GPU 3's burst stands out against its own background and its node's at both cadences.
    for f in (fine, sparse):
        assert f["sbe_excess_60m"][3] > 2.0
        assert np.nanmax(np.delete(f["sbe_excess_60m"], 3)) < 0.5
        assert f["sbe_vs_node_60m"][3] > 2.0
    assert sparse["sbe_rate_60m"][3] == pytest.approx(fine["sbe_rate_60m"][3], rel=0.25)
    assert sparse["sbe_excess_60m"][3] == pytest.approx(fine["sbe_excess_60m"][3], abs=0.5)


def test_a_gpu_that_always_ran_hot_is_not_news_one_that_warms_is() -> None:
    config = FeatureConfig()
    engine = FeatureEngine(config, 1)
    rng = np.random.default_rng(1)
    z = engine.names.index("gpu_temp_z_own_15m")
    residual_z = engine.names.index("thermal_residual_z_own_15m")
    features = np.zeros(0)
    for k in range(26 * 60):
        gpu = _live(k, 8, 60.0, rng)
        gpu[0, _COL["gpu_temp"]] += 15.0  # GPU 0 always ran 15 C hot
        if k >= 25 * 60:
            gpu[1, _COL["gpu_temp"]] += (k - 25 * 60) * 0.2  # GPU 1 warms 12 C over the last hour
        features = engine.update(k, gpu, np.full((1, len(NODE_INPUTS)), np.nan), np.zeros(8))
    peers = np.median(features[2:, z])  # the job's load swings move every GPU alike
    assert abs(features[0, z] - peers) < 0.5
    assert features[1, z] - peers > 2.0
    # Against what its own power predicts the warming is plainer (the load cancels), and the GPU that
    # always ran hot reads like the others.
    assert features[1, residual_z] > max(5.0, features[1, z] - peers)
    assert np.abs(np.delete(features[:, residual_z], 1)).max() < 1.0


def test_a_frozen_exporter_is_not_a_reading_until_it_moves() -> None:
    """GPU 2's values stop changing: for an hour it is still read (a GPU can idle), then it is
    absent and flagged frozen; the first value that moves brings it back."""
    config = FeatureConfig()
    engine = FeatureEngine(config, 1)
    rng = np.random.default_rng(2)
    frozen_col = engine.names.index("frozen_now")
    stuck = None
    seen: list[tuple[bool, float]] = []
    for k in range(230):
        gpu = _live(k, 8, 60.0, rng)
        if 100 <= k < 210:
            stuck = gpu[2].copy() if stuck is None else stuck
            gpu[2] = stuck
        features = engine.update(k, gpu, np.full((1, len(NODE_INPUTS)), np.nan), np.zeros(8))
        seen.append((bool(engine.present[2]), float(features[2, frozen_col])))
    assert all(present for present, _ in seen[100:159])
    assert not any(present for present, _ in seen[161:210])
    assert all(flag == 1.0 for _, flag in seen[161:210])
    assert seen[210] == (True, 0.0)
    assert all(engine.present[[0, 1, 3]])


def test_a_model_built_for_eight_gpus_reads_nodes_of_four() -> None:
    config = FeatureConfig(gpus_per_node=8)
    four = FeatureEngine(config, 2, 4)
    assert four.names == FeatureEngine(config, 2).names
    assert four.schema_hash == FeatureEngine(config, 2).schema_hash
    rng = np.random.default_rng(3)
    gpu = np.concatenate([_live(0, 4, 60.0, rng), _live(0, 4, 60.0, rng)])
    features = four.update(0, gpu, np.full((2, len(NODE_INPUTS)), np.nan), np.zeros(8))
    assert features.shape == (8, len(four.names))
    vs_node = features[:, four.names.index("gpu_temp_vs_node")].reshape(2, 4)
    assert np.allclose(np.median(vs_node, axis=1), 0.0)


def test_gaps_infinities_and_empty_nodes_raise_no_warnings() -> None:
    """What a real export holds (whole nodes missing, +Inf, NaN counters) is data, not a fault: the
    engine computes without a single RuntimeWarning (a real fleet's logs filled with them)."""
    config = FeatureConfig()
    engine = FeatureEngine(config, 2)
    rng = np.random.default_rng(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(120):
            gpu = np.concatenate([_live(k, 8, 60.0, rng), np.full((8, len(GPU_INPUTS)), np.nan)])
            if k % 7 == 0:
                gpu[0, _COL["power_usage"]] = np.inf
                gpu[1, _COL["ecc_sbe_volatile"]] = np.nan
            engine.update(k, gpu, np.full((2, len(NODE_INPUTS)), np.nan), np.zeros(16))
        engine.skip(120, 500)
        engine.update(
            620, np.full((16, len(GPU_INPUTS)), np.nan), np.full((2, len(NODE_INPUTS)), np.nan), np.zeros(16)
        )
