"""The twin's step summaries: what a 1 s collector would see between the twin's one-minute steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.world import World
from faultcast.sim.writer import simulate
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARISED

FAIL_S = 8 * 3600.0


@pytest.fixture(scope="module")
def power_run(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("power")
    simulate(FleetConfig(nodes=2, days=0.5, seed=3), out, [Scenario("power", 0, 5, FAIL_S, 90 * 60.0)])
    return pd.read_parquet(out / "telemetry.parquet")


def test_every_summary_holds_its_last_scrape_and_its_mean(power_run: pd.DataFrame) -> None:
    t = power_run
    assert (t[SCRAPES_COLUMN] == 60).all()
    for name in SUMMARISED:
        lo, hi, mean = (t[f"{name}_step_{s}"] for s in ("min", "max", "mean"))
        last = t[name]
        known = last.notna()
        assert known.sum() > 0.9 * len(t), name
        assert (lo[known] <= last[known]).all(), name
        assert (last[known] <= hi[known]).all(), name
        assert (lo[known] <= mean[known] + 1e-3).all(), name
        assert (mean[known] <= hi[known] + 1e-3).all(), name
    # A busy GPU's power swings within a minute: the range is seldom nothing.
    busy = t[t["gpu_util"] > 50]
    assert ((busy["power_usage_step_max"] - busy["power_usage_step_min"]) > 5.0).mean() > 0.9


def test_power_brakes_of_seconds_show_in_the_summary_and_seldom_in_the_last_scrape(
    power_run: pd.DataFrame,
) -> None:
    start = pd.Timestamp(FleetConfig().start_unix_s + FAIL_S - 40 * 60, unit="s", tz="UTC")
    end = pd.Timestamp(FleetConfig().start_unix_s + FAIL_S, unit="s", tz="UTC")
    t = power_run
    late = t[(t["timestamp"] >= start) & (t["timestamp"] < end) & (t["node"] == FleetConfig().node_name(0))]
    failing, others = late[late["gpu"] == 5], late[late["gpu"] != 5]
    braked_steps = int((failing["throttle_hw_power_brake_step_max"] == 1).sum())
    caught = int((failing["throttle_hw_power_brake"] == 1).sum())
    assert braked_steps >= 8, braked_steps
    assert caught <= braked_steps / 2, (caught, braked_steps)  # the last scrape misses most of them
    assert (
        failing["throttle_hw_power_brake_step_mean"].mean()
        > 5 * others["throttle_hw_power_brake_step_mean"].mean()
    )
    assert failing["sm_clock_step_min"].min() < 0.6 * failing["sm_clock"].max()


def test_healthy_gpus_brake_for_seconds_too(tmp_path: Path) -> None:
    """Brake-prone cards, lone blips and a node's supply stepping: no failure, still brakes."""
    world = World(
        brake_prone_share=0.25,
        node_power_transients_per_node_day=3.0,
        brake_blips_per_gpu_day=2.0,
        rack_power_brakes_per_rack_month=0.0,  # minutes of PDU brake would drown the seconds
    )
    simulate(FleetConfig(nodes=2, days=1.0, seed=4, failures=False, world=world), tmp_path)
    t = pd.read_parquet(tmp_path / "telemetry.parquet")
    braked = t[t["throttle_hw_power_brake_step_max"] == 1]
    assert braked.groupby(["node", "gpu"], observed=True).ngroups >= 12  # most of the 16 GPUs
    whole_node = braked.groupby(["timestamp", "node"], observed=True)["gpu"].nunique()
    assert (whole_node == 8).any(), "a node's supply stepping brakes all its GPUs at once"
    share = t.groupby(["node", "gpu"], observed=True)["throttle_hw_power_brake_step_mean"].mean()
    assert share.max() > 3 * np.median(share), "the brake-prone cards stand out from the rest"
