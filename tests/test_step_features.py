"""Step summaries in the features: what happened between two model steps.

Sixty 1 s scrapes and the one summarised sample a collector ships for them give the same features;
a brake of seconds that the step's last scrape missed shows; too few scrapes, or a frozen exporter,
give no summary features (missing, not zero); and the twin's files finer than the grid replay as the
service reads the same samples live.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.offline import Step, open_dataset, replay
from faultcast.model.features.online import OnlineFeatures
from faultcast.readings import GpuReading, NodeSnapshot
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.writer import simulate
from faultcast.step_summary import StepSummary, combine

GPU = index_of(Scope.GPU)
N_METRICS = len(metrics_for(Scope.GPU))
CONFIG = FeatureConfig()  # 60 s steps
BRAKE_STEP, BRAKE_GPU = 15, 2


def _scrape(rng: np.random.Generator, second: int, gpu: int, braked: bool) -> tuple[float, ...]:
    """One 1 s scrape of a busy GPU: power swinging with the iterations, a counter counting."""
    v = np.full(N_METRICS, math.nan)
    power = 300.0 + 40.0 * math.sin(second / 3.0) + rng.normal(0.0, 3.0)
    v[GPU["power_usage"]] = power * (0.6 if braked else 1.0)
    v[GPU["sm_clock"]] = 1410.0 * (0.5 if braked else 1.0)
    v[GPU["gpu_temp"]] = float(round(60.0 + 0.02 * (power - 300.0) + gpu))
    v[GPU["memory_temp"]] = 70.0
    v[GPU["gpu_util"]] = 97.0
    v[GPU["power_limit"]] = 400.0
    for flag in ("throttle_hw_power_brake", "throttle_hw_slowdown"):
        v[GPU[flag]] = float(braked)
    for flag in ("throttle_sw_thermal", "throttle_hw_thermal", "throttle_sw_power_cap"):
        v[GPU[flag]] = 0.0
    v[GPU["ecc_sbe_volatile"]] = float(second // 20)
    v[GPU["pcie_replay"]] = 0.0
    return tuple(v.tolist())


def _scrapes(steps: int, per_step: int = 60) -> list[list[NodeSnapshot]]:
    """Per step, its scrapes of one 8-GPU node; GPU BRAKE_GPU brakes for 3 s mid-step BRAKE_STEP."""
    rng = np.random.default_rng(5)
    out = []
    for step in range(steps):
        scrapes = []
        for k in range(per_step):
            second = step * 60 + k * (60 // per_step)
            braked = step == BRAKE_STEP and 30 <= k * (60 // per_step) < 33
            gpus = tuple(
                GpuReading(
                    g, f"GPU-{g}", "NVIDIA H100 80GB HBM3", _scrape(rng, second, g, braked and g == BRAKE_GPU)
                )
                for g in range(8)
            )
            scrapes.append(NodeSnapshot("n0", second * 10**9, gpus, (), (), ()))
        out.append(scrapes)
    return out


def _summarised(scrapes: list[NodeSnapshot]) -> NodeSnapshot:
    """What a collector shipping one sample per 60 s window sends for these scrapes."""
    last = scrapes[-1]
    gpus = tuple(
        GpuReading(
            g.index,
            g.uuid,
            g.model_name,
            g.values,
            summary=combine([StepSummary.of(s.gpus[g.index].values) for s in scrapes]),
        )
        for g in last.gpus
    )
    return NodeSnapshot("n0", last.time_unix_nano, gpus, (), (), (), window_s=60.0)


def _run(online: OnlineFeatures, samples: list[NodeSnapshot]) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for sample in samples:
        out |= {s.index: s.features for s in online.add(sample)}
    return out | {s.index: s.features for s in online.flush()}


def test_sixty_scrapes_and_the_summary_a_collector_ships_for_them_give_the_same_features() -> None:
    steps = _scrapes(25)
    plain = _run(OnlineFeatures(CONFIG, ["n0"], 0.0), [s for step in steps for s in step])
    online = OnlineFeatures(CONFIG, ["n0"], 0.0)
    names = online.engine.names
    summarised = {}
    for k, step in enumerate(steps):
        done = online.add(_summarised(step))
        # The window ends with the step: the step is scored at once, not when the next one arrives.
        assert [s.index for s in done] == [k]
        summarised[k] = done[0].features
    assert sorted(plain) == sorted(summarised) == list(range(25))
    for k in range(25):
        np.testing.assert_allclose(summarised[k], plain[k], rtol=1e-9, atol=1e-9, err_msg=f"step {k}")

    braked = dict(zip(names, summarised[BRAKE_STEP][BRAKE_GPU], strict=True))
    calm = dict(zip(names, summarised[BRAKE_STEP][BRAKE_GPU + 1], strict=True))
    # The brake of 3 s in 60: the last scrape missed it, the summary did not.
    assert braked["throttle_hw_power_brake_now"] == 0.0
    assert braked["throttle_hw_power_brake_step_share"] == 3 / 60
    assert calm["throttle_hw_power_brake_step_share"] == 0.0
    assert braked["sm_clock_step_range"] == 1410.0 * 0.5
    assert calm["sm_clock_step_range"] == 0.0
    assert braked["power_usage_step_range"] > calm["power_usage_step_range"] + 40.0
    assert braked["sm_clock_step_range_vs_node"] == 705.0  # the node's other GPUs did not dip
    after = dict(zip(names, summarised[BRAKE_STEP + 5][BRAKE_GPU], strict=True))
    assert after["sm_clock_step_range_max_15m"] == 705.0  # the middle window remembers it
    assert after["throttle_hw_power_brake_step_share_mean_60m"] == (3 / 60) / (BRAKE_STEP + 6)


def test_a_step_of_too_few_scrapes_has_no_summary_features() -> None:
    """Two 30 s scrapes bound a minute far less tightly than sixty: the features are missing, not small."""
    online = OnlineFeatures(CONFIG, ["n0"], 0.0)
    features = _run(online, [s for step in _scrapes(5, per_step=2) for s in step])
    names = online.engine.names
    step_columns = [i for i, n in enumerate(names) if "_step_" in n]
    assert len(step_columns) == 21
    for row in features.values():
        assert np.isnan(row[:, step_columns]).all()
        assert np.isfinite(row[:, names.index("power_usage_now")]).all()


def test_a_frozen_exporter_has_no_summary_features() -> None:
    """An exporter repeating one sample for over an hour: its summary is no more a reading than its values."""
    step = _summarised(_scrapes(1)[0])
    online = OnlineFeatures(CONFIG, ["n0"], 0.0)
    names = online.engine.names
    last = None
    for k in range(80):
        frozen = NodeSnapshot("n0", (k * 60 + 59) * 10**9, step.gpus, (), (), (), window_s=60.0)
        (last,) = online.add(frozen)
        if k == 0:
            assert np.isfinite(last.features[:, names.index("power_usage_step_range")]).all()
    assert last is not None
    assert (last.features[:, names.index("frozen_now")] == 1.0).all()
    assert np.isnan(last.features[:, names.index("power_usage_step_range")]).all()


def test_twin_files_finer_than_the_grid_replay_as_the_service_reads_them(tmp_path: Path) -> None:
    """The twin at a 10 s cadence (each row a summary of 10 scrapes): replay on the 60 s grid combines
    six rows a step exactly as the service combines the six live samples."""
    fleet = FleetConfig(nodes=1, days=0.25, seed=9, cadence_s=10.0)
    simulate(fleet, tmp_path)
    config = FeatureConfig(gpus_per_node=fleet.gpus_per_node)
    offline: dict[int, Step] = {}
    replay(open_dataset(tmp_path), config, lambda s: offline.__setitem__(s.index, s))
    online = OnlineFeatures(config, [fleet.node_name(0)], fleet.start_unix_s)
    source = TwinSource(fleet, 0)
    live: dict[int, Step] = {}
    for _ in range(fleet.steps):
        reading = source.read()
        assert reading.time_unix_nano is not None
        snapshot = NodeSnapshot.merge(fleet.node_name(0), reading.time_unix_nano, [reading], {})
        live |= {s.index: s for s in online.add(snapshot)}
    live |= {s.index: s for s in online.flush()}
    assert sorted(live) == sorted(offline)
    names = online.engine.names
    scraped = names.index("power_usage_step_range")
    seen = 0
    for k, step in offline.items():
        present = step.present
        np.testing.assert_allclose(live[k].features[present], step.features[present], rtol=1e-9, atol=1e-9)
        seen += int(np.isfinite(step.features[present, scraped]).sum())
    assert seen > 0.9 * len(offline) * fleet.gpus_per_node  # six rows of ten scrapes: a summary of 60
