"""Separability by one signal (faultcast.model.evaluation.separability): the window statistics, episodes and the
budget level on synthetic grids, then the measure on a small twin fleet with one scripted failure."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.separability import main as bench_main
from faultcast.model.evaluation.separability import (
    allowed_episodes,
    budget_level,
    counter_increase,
    episode_intervals,
    event_minutes,
    gauge_excess,
    healthy_mask,
    separability,
)
from faultcast.model.features.offline import open_dataset
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate


def count_episodes(crossing: np.ndarray, merge: int) -> int:
    """The brute-force reference of the episode count: runs of one unit in a (T, U) crossing mask,
    merged when fewer than `merge` steps apart."""
    units, steps = np.nonzero(crossing.T)  # unit-major: runs of one unit are adjacent
    if len(steps) == 0:
        return 0
    new = np.ones(len(steps), dtype=bool)
    new[1:] = (units[1:] != units[:-1]) | (steps[1:] - steps[:-1] > merge)
    return int(new.sum())


# -- the statistics ----------------------------------------------------------------------------------


def test_a_counter_reset_counts_nothing_and_gaps_are_skipped() -> None:
    x = np.array([[0.0], [5.0], [10.0], [2.0], [4.0], [np.nan], [9.0]])
    got = counter_increase(x, 3)[:, 0]
    # deltas: 0, 5, 5, reset -> 0, 2, gap -> 0, then the 5 seen across the gap
    np.testing.assert_array_equal(got, [0.0, 5.0, 10.0, 10.0, 7.0, 2.0, 7.0])


def test_a_counter_never_seen_in_the_window_has_no_statistic() -> None:
    x = np.array([[1.0], [np.nan], [np.nan], [np.nan], [3.0]])
    got = counter_increase(x, 2)[:, 0]
    assert np.isnan(got[2])
    assert np.isnan(got[3])
    assert got[4] == 2.0


@pytest.mark.parametrize("kind", ["counter", "gauge", "events"])
def test_the_statistic_at_t_does_not_change_when_data_after_t_does(kind: str) -> None:
    rng = np.random.default_rng(1)
    x = np.cumsum(rng.poisson(2.0, (600, 3)), axis=0).astype(np.float64)
    x[rng.random(x.shape) < 0.05] = np.nan
    changed = x.copy()
    t = 400
    changed[t + 1 :] = rng.normal(1e6, 1e5, changed[t + 1 :].shape)
    stats: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "counter": lambda a: counter_increase(a, 30),
        "gauge": lambda a: gauge_excess(a, 30, 120),
        "events": lambda a: event_minutes(a, 30),
    }
    np.testing.assert_array_equal(stats[kind](x)[: t + 1], stats[kind](changed)[: t + 1])


def test_a_gauge_is_measured_against_its_own_past() -> None:
    x = np.full((200, 2), 50.0)
    x[:, 1] = 80.0  # a hot card, hot for life: no excess
    x[185:, 0] = 60.0  # a card warming by 10 in the last 15 steps
    got = gauge_excess(x, 10, 60)
    assert got[199, 0] == pytest.approx(10.0)
    assert got[199, 1] == pytest.approx(0.0)


# -- episodes and the budget level ---------------------------------------------------------------------


def test_runs_closer_than_the_merge_gap_are_one_episode() -> None:
    crossing = np.zeros((60, 2), dtype=bool)
    crossing[[0, 1, 2, 11], 0] = True  # 8 quiet steps between: merged
    crossing[[30, 41], 0] = True  # 10 quiet steps between: apart
    crossing[[0, 5], 1] = True  # another unit: its own episode
    assert count_episodes(crossing, 10) == 4


def test_the_intervals_count_the_episodes_at_every_threshold() -> None:
    rng = np.random.default_rng(2)
    healthy = rng.exponential(1.0, (300, 4))
    healthy[rng.random(healthy.shape) < 0.1] = np.nan
    lo, hi = episode_intervals(healthy, 10)
    for thr in np.quantile(healthy[np.isfinite(healthy)], [0.5, 0.9, 0.99, 0.999]):
        by_intervals = int(((lo <= thr) & (thr < hi)).sum())
        assert by_intervals == count_episodes(np.nan_to_num(healthy, nan=-np.inf) > thr, 10)


@pytest.mark.parametrize("allowed", [0, 1, 3, 10])
def test_the_budget_level_is_the_lowest_threshold_within_budget(allowed: int) -> None:
    rng = np.random.default_rng(3)
    healthy = rng.lognormal(0.0, 1.0, (400, 3))
    lo, hi = episode_intervals(healthy, 10)
    level = budget_level(lo, hi, allowed)
    values = np.unique(healthy)
    episodes = {v: count_episodes(healthy > v, 10) for v in values}
    assert all(n <= allowed for v, n in episodes.items() if v >= level)
    assert episodes[values[values < level].max()] > allowed  # the next healthy value below is over


def test_the_budget_is_per_thousand_healthy_days() -> None:
    assert allowed_episodes(0.5, 1999.0) == 0
    assert allowed_episodes(0.5, 2000.0) == 1
    assert allowed_episodes(2.0, 1280.0) == 2


# -- a twin fleet with one scripted NVLink failure --------------------------------------------------

FAIL_S, LEAD_S = 20 * 3600.0, 3 * 3600.0
FLEET = FleetConfig(nodes=2, days=1.0, seed=3, acceleration=0.0)  # no drawn failures: only the scripted one


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("separability") / "fleet"
    simulate(FLEET, out, [Scenario("nvlink", 1, 5, FAIL_S, LEAD_S)])
    return out


def _with_healthy_burst(fleet: Path, out: Path, size: float) -> Path:
    """A copy of the fleet where healthy GPU 0 of node 0 sees `size` NVLink CRC errors at 6 h."""
    shutil.copytree(fleet, out)
    table = pq.read_table(fleet / "telemetry.parquet")
    seconds = pc.divide(pc.cast(table["timestamp"], pa.int64()), 1_000_000_000).to_numpy()
    node = np.asarray(table["node"].to_pylist()) == FLEET.node_name(0)
    after = node & (table["gpu"].to_numpy() == 0) & (seconds >= FLEET.start_unix_s + 6 * 3600)
    column = "nvlink_crc_flit_errors"
    bumped = table[column].to_numpy(zero_copy_only=False) + np.where(after, size, 0.0)
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, pa.array(bumped)), out / "telemetry.parquet")
    return out


def test_a_scripted_precursor_rises_above_every_healthy_look_alike(fleet: Path) -> None:
    (nvlink,) = separability(open_dataset(fleet), modes=["nvlink"])
    (peak,) = nvlink.peaks
    assert (peak.node, peak.gpu, peak.precursor_s) == (1, 5, LEAD_S)
    assert peak.peak > nvlink.loudest >= 0
    assert nvlink.above_loudest == nvlink.above_budget == 1


def test_a_healthy_card_louder_than_the_failure_makes_it_inseparable(fleet: Path, tmp_path: Path) -> None:
    (before,) = separability(open_dataset(fleet), modes=["nvlink"])
    peak = before.peaks[0].peak
    (louder,) = separability(
        open_dataset(_with_healthy_burst(fleet, tmp_path / "louder", 2 * peak)), modes=["nvlink"]
    )
    assert louder.loudest >= 2 * peak  # the burst, and whatever the card counted beside it
    assert louder.above_loudest == louder.above_budget == 0
    (quieter,) = separability(
        open_dataset(_with_healthy_burst(fleet, tmp_path / "quieter", peak / 2)), modes=["nvlink"]
    )
    assert peak / 2 <= quieter.loudest < peak
    assert quieter.above_loudest == 1


def test_the_day_before_a_failure_and_after_it_is_not_healthy(fleet: Path) -> None:
    data = open_dataset(fleet)
    steps = round(FLEET.days * 1440)
    mask = healthy_mask(data, "gpu", steps, memory=30)
    failing = 1 * FLEET.gpus_per_node + 5
    assert not mask[:, failing].any()  # the whole day is within 24 h before its failure, or after it
    assert mask[:, :failing].all()
    assert mask[:, failing + 1 :].all()
    node_mask = healthy_mask(data, "node", steps, memory=30)
    at = round(FAIL_S / 60.0)
    assert not node_mask[: at + 31, 1].any()
    assert node_mask[at + 31 :, 1].all()
    assert node_mask[:, 0].all()


def test_the_bench_prints_tables_and_writes_json(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "separability.json"
    assert bench_main(["--data", str(fleet), "--data", str(fleet), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| nvlink |" in printed
    assert "pooled: 2 datasets" in printed
    assert "took" in printed
    report = json.loads(out.read_text())
    nvlink = next(m for m in report["pooled"] if m["mode"] == "nvlink")
    assert nvlink["precursor_failures"] == 2
    assert nvlink["above_loudest"] == 2
    assert report["pooled_own_world"]["nvlink"] == [2, 2]
