"""The twin's node history (World.frailty_shape, refault_p, refault_days, downtime_sigma, downtime_scale):
worlds without it draw exactly as before it existed, and each part does what it says."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from faultcast.sim.config import FleetConfig
from faultcast.sim.fault_trace import twin_faults
from faultcast.sim.fleet import node_frailty, node_traits
from faultcast.sim.schedule import ScheduledFailure, node_schedule
from faultcast.sim.world import HISTORY_PARAMETERS, TRACE_CALIBRATION, TRACE_FAMILY, World, trace_calibrated

# Computed from the code before the node history existed (commit 415f959): the schedules and traits of
# a small accelerated fleet in the median world and in drawn world 3, and both worlds' ids.
_BEFORE = {
    None: ("c74cf8519691", "757fdbebf39a82c0"),
    3: ("ee5b01066bbd", "11d7ccd5a3313c2f"),
}


def _digest(config: FleetConfig) -> str:
    h = hashlib.sha256()
    for node in range(config.nodes):
        h.update(repr(node_schedule(config, node)).encode())
        t = node_traits(config, node)
        arrays = (
            t.temp_offset_c, t.power_offset_w, t.steady_sbe_per_min, t.remap_per_day, t.pcie_trickle_per_min,
            t.pcie_downtrained, t.nvlink_marginal_per_min, t.ib_marginal_per_min,
        )  # fmt: skip
        for a in arrays:
            h.update(a.tobytes())
        h.update(repr((t.generation, t.rack, t.rack_inlet_c, t.peers)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("world_seed", list(_BEFORE))
def test_worlds_without_a_history_draw_exactly_as_before(world_seed: int | None) -> None:
    world = World() if world_seed is None else World.draw(world_seed)
    config = FleetConfig(nodes=6, days=60, acceleration=40, seed=7, world=world)
    assert (world.id, _digest(config)) == _BEFORE[world_seed]
    assert len(HISTORY_PARAMETERS) == 7
    assert not set(HISTORY_PARAMETERS) & set(world.parameters())
    assert all(node_frailty(config, n) == 1.0 for n in range(config.nodes))


def test_frailty_is_a_gamma_of_mean_one_and_multiplies_a_nodes_failures() -> None:
    world = replace(World(), frailty_shape=0.5)
    config = FleetConfig(nodes=2000, days=1, world=world)
    frailty = np.array([node_frailty(config, n) for n in range(config.nodes)])
    assert abs(frailty.mean() - 1.0) < 0.1
    assert abs(frailty.var() - 1 / 0.5) < 0.4  # gamma of shape k: variance 1/k
    # The frailest and the sturdiest of a small fleet, accelerated: the frail one fails far more often.
    small = FleetConfig(nodes=40, days=30, acceleration=200, seed=1, world=world)
    per_node = [node_frailty(small, n) for n in range(small.nodes)]
    frail, sturdy = int(np.argmax(per_node)), int(np.argmin(per_node))
    assert len(node_schedule(small, frail).failures) > 3 * len(node_schedule(small, sturdy).failures)


def _gaps_after_return(failures: tuple[ScheduledFailure, ...]) -> list[float]:
    """For each failure, the time from its target's previous return (same GPU, or the node for node level)."""
    last: dict[int | None, float] = {}
    gaps = []
    for f in failures:
        if f.gpu in last:
            gaps.append(f.fail_s - last[f.gpu])
        last[f.gpu] = f.return_s
    return gaps


def test_refaults_follow_a_return_soon_and_carry_precursors() -> None:
    base = FleetConfig(nodes=20, days=60, acceleration=30, seed=2, confounders=False)
    history = replace(base, world=replace(World(), refault_p=0.5, refault_days=0.25))
    before = [f for n in range(base.nodes) for f in node_schedule(base, n).failures]
    after = [node_schedule(history, n) for n in range(history.nodes)]
    failures = [f for s in after for f in s.failures]
    assert len(failures) > 1.5 * len(before)  # a chain of refaults adds 1 / (1 - p) - 1 per failure
    soon = [g for s in after for g in _gaps_after_return(s.failures) if g < 86_400.0]
    quiet = [g for n in range(base.nodes) for g in _gaps_after_return(node_schedule(base, n).failures)]
    assert len(soon) > 0.3 * len(failures)
    assert sum(g < 86_400.0 for g in quiet) < 0.05 * len(before)
    # A refault is a failure like any other: some carry their mode's precursor.
    assert any(f.lead_s > 0 for s in after for f in s.failures if f in _refaults(s.failures))


def _refaults(failures: tuple[ScheduledFailure, ...]) -> list[ScheduledFailure]:
    last: dict[int | None, float] = {}
    out = []
    for f in failures:
        if f.gpu in last and f.fail_s - last[f.gpu] < 86_400.0:
            out.append(f)
        last[f.gpu] = f.return_s
    return out


def test_repair_spread_and_scale_are_the_worlds() -> None:
    def log_ratios(world: World) -> np.ndarray:
        """Each repair over its mode's median repair, in log space (modes repaired at once left out)."""
        config = FleetConfig(nodes=40, days=30, acceleration=100, seed=3, confounders=False, world=world)
        failures = [f for n in range(config.nodes) for f in node_schedule(config, n).failures]
        return np.log(
            [f.downtime_s / f.spec.downtime_median_s for f in failures if f.spec.downtime_median_s > 0]
        )

    narrow, wide = log_ratios(World()), log_ratios(replace(World(), downtime_sigma=2.0, downtime_scale=2.0))
    assert len(narrow) > 300
    assert abs(narrow.mean()) < 0.1
    assert abs(narrow.std() - 0.5) < 0.1
    assert abs(wide.mean() - np.log(2.0)) < 0.3
    assert abs(wide.std() - 2.0) < 0.3


def test_the_trace_calibrated_world_is_recorded_and_read_back(tmp_path: Path) -> None:
    world = trace_calibrated()
    assert world.family == TRACE_FAMILY
    assert world.refault_p == TRACE_CALIBRATION["refault_p"]
    assert world.id != World().id
    assert world.parameters()["frailty_shape"] == TRACE_CALIBRATION["frailty_shape"]
    assert World.from_json(world.to_json()) == world
    drawn = World.draw(3)
    assert trace_calibrated(drawn).failure_rate_scale == pytest.approx(
        drawn.failure_rate_scale * TRACE_CALIBRATION["failure_rate_scale"]
    )
    # What `faultcast simulate --world-file` reads: the same world.
    path = tmp_path / "trace-world.json"
    path.write_text(json.dumps({"family": TRACE_FAMILY, **TRACE_CALIBRATION}))
    assert World.from_file(path) == world
    # The schedule in the trace's form, one fault per failure.
    config = FleetConfig(nodes=10, days=30, acceleration=20, world=world)
    faults = twin_faults(config)
    assert len(faults.faults) == sum(len(node_schedule(config, n).failures) for n in range(config.nodes))
    assert all(f.end_day >= f.start_day for f in faults.faults)


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"refault_p": 1.5}, "refault_p=1.5"),
        ({"frailty_shape": 0}, "frailty_shape"),
        ({"refault_days": 0}, "refault_days"),
    ],
)
def test_bad_history_parameters_are_refused(params: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        World.from_json(params)


def test_rack_bursts_fail_nodes_of_a_rack_within_a_minute() -> None:
    world = replace(World(), rack_bursts_per_rack_year=50.0, rack_burst_node_p=0.75)
    config = FleetConfig(nodes=8, days=30, seed=4, world=world, confounders=False)
    cooling = {
        n: [f.fail_s for f in node_schedule(config, n).failures if f.mode == "cooling"]
        for n in range(config.nodes)
    }
    # Racks of 4: nodes 0-3 share their bursts, 4-7 theirs; a burst's failures start within a minute.
    together = [
        (a, b)
        for a in range(4)
        for b in range(a + 1, 4)
        for ta in cooling[a]
        for tb in cooling[b]
        if abs(ta - tb) < 60
    ]
    apart = [
        (a, b)
        for a in range(4)
        for b in range(4, 8)
        for ta in cooling[a]
        for tb in cooling[b]
        if abs(ta - tb) < 60
    ]
    assert len(together) > 10
    assert not apart
    # The same rack's events whatever the fleet's size: a node's bursts do not depend on its neighbours'.
    assert node_schedule(replace(config, nodes=2), 1).failures == node_schedule(config, 1).failures
    assert trace_calibrated(bursts=True).rack_bursts_per_rack_year > 0
    assert trace_calibrated().rack_bursts_per_rack_year == 0
