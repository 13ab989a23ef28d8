"""The twin's worlds: look-alikes on healthy hardware, thermal lag, stochastic precursors, no input
that separates doomed from healthy hardware on its own, and worlds drawn, read and recorded."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from faultcast.catalogue import Kind, Scope, metrics_for
from faultcast.cli.app import main
from faultcast.model.features.offline import unix_seconds
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import node_schedule
from faultcast.sim.world import LATER_PRIORS, PRIORS, World
from faultcast.sim.writer import simulate

# The median world with the rare families made common, so a small healthy fleet shows every one.
_BUSY_WORLD = replace(
    World(),
    sbe_heavy_share=0.2,
    benign_remap_per_day=0.3,
    room_cooling_events_per_rack_month=15.0,
    rack_power_brakes_per_rack_month=10.0,
    exporter_freezes_per_node_month=8.0,
    monitoring_gaps_per_node_day=1.0,
    ib_flaps_per_port_day=0.2,
    pcie_downtrained_share=0.05,
)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, pd.DataFrame, FleetConfig]:
    """A fleet where nothing fails: whatever it shows, healthy hardware shows."""
    out = tmp_path_factory.mktemp("healthy")
    config = FleetConfig(nodes=16, days=4.0, seed=21, failures=False, world=_BUSY_WORLD)
    manifest = simulate(config, out)
    assert manifest["rows"]["failures"] == 0
    return pd.read_parquet(out / "telemetry.parquet"), pd.read_parquet(out / "network.parquet"), config


def _increase(frame: pd.DataFrame, keys: list[str], column: str) -> pd.Series:
    """Each step's increase of a counter within its series (a reset counts as nothing)."""
    return frame.groupby(keys, observed=True)[column].diff().clip(lower=0).fillna(0)


def test_each_look_alike_family_occurs_on_hardware_that_does_not_fail(
    healthy: tuple[pd.DataFrame, pd.DataFrame, FleetConfig],
) -> None:
    t, net, config = healthy
    gpus = ["node", "gpu"]
    slots = t.groupby(gpus, observed=True)
    n_gpus = config.nodes * config.gpus_per_node

    def gpus_with(mask: pd.Series) -> int:
        return int(mask.groupby([t["node"], t["gpu"]], observed=True).any().sum())

    sbe = _increase(t, gpus, "ecc_sbe_volatile")
    # Correctable ECC on a minority of cards, benign remaps with their Xid 63, pending remaps, Xid 92.
    assert 1 <= gpus_with(sbe > 0) <= 0.4 * n_gpus
    assert gpus_with(_increase(t, gpus, "remapped_rows_correctable") > 0) >= 1
    assert gpus_with(_increase(t, gpus, "xid_63_events") > 0) >= 1
    assert (t["row_remap_pending"] == 1).any()
    assert gpus_with(_increase(t, gpus, "xid_92_events") > 0) >= 1
    # PCIe: trickles (replays in many steps of a GPU), bursts (10+ in a step), links below maximum.
    replay = _increase(t, gpus, "pcie_replay")
    assert (replay > 0).groupby([t["node"], t["gpu"]], observed=True).mean().max() > 0.05
    assert (replay >= 10).any()
    assert (
        (t["pcie_link_width"] < t["pcie_link_width_max"]) | (t["pcie_link_gen"] < t["pcie_link_gen_max"])
    ).any()
    # NVLink CRC at background rates and in bursts of hundreds.
    assert (_increase(t, gpus, "nvlink_crc_flit_errors_worst_link") >= 100).any()
    # Heat and power in groups: several GPUs of a node in thermal slowdown at once; a rack's brake.
    hot = t[t["throttle_sw_thermal"] == 1].groupby(["timestamp", "node"], observed=True).size()
    assert hot.max() >= 2
    braking = t[t["throttle_hw_power_brake"] == 1].groupby("timestamp", observed=True)["node"].nunique()
    assert braking.max() >= 2, "a rack's power brake reaches several nodes at once"
    assert t["throttle_sw_power_cap"].mean() > 0.01  # heavy jobs sit at the power cap
    # Application Xids, driver reloads (a volatile counter restarts; the aggregate never does).
    assert t[["xid_13_events", "xid_31_events", "xid_43_events"]].to_numpy().max() >= 1
    assert (slots["total_energy"].diff() < 0).any()
    assert not (slots["ecc_sbe_aggregate"].diff() < 0).any()
    # NVML slow under load: calls over 3x the fleet's median.
    assert (t["nvml_call_seconds"] > 3 * t["nvml_call_seconds"].median()).sum() >= 5
    # Real workloads: power from under 30% to over 80% of its limit within five minutes.
    power = t["power_usage"] / t["power_limit"]
    window = power.groupby([t["node"], t["gpu"]], observed=True).rolling(5, min_periods=2)
    assert ((window.max() - window.min()) > 0.5).any()
    # InfiniBand: symbol errors, flaps (link_downed), receive errors, ACK timeouts, discards; peers.
    for column in ("ib_symbol_error", "ib_link_downed", "ib_port_rcv_errors", "ib_local_ack_timeout_err"):
        assert (_increase(net, ["node"], column) > 0).any(), column
    assert (net["peer_loss_ratio"] > 0).any()
    p99 = net["peer_rtt_p99_seconds"]
    assert (p99 > 2 * p99.groupby(net["node"], observed=True).transform("median")).any()
    # Monitoring: a node silent for 5+ minutes, an exporter repeating itself for 30+ minutes.
    steps = (
        net.groupby("node", observed=True)["timestamp"].diff().dt.total_seconds() / config.cadence_s
    ).max()
    assert steps >= 5
    series = t.sort_values(["node", "gpu", "timestamp"])
    same = series.groupby(gpus, observed=True)[["total_energy", "gpu_temp"]].diff().abs().sum(axis=1) == 0
    runs = same.groupby((~same).cumsum()).sum()
    assert runs.max() >= 30


def test_temperature_lags_power(healthy: tuple[pd.DataFrame, pd.DataFrame, FleetConfig]) -> None:
    """Regress temperature on power now and a minute before: real GPUs warm and cool over minutes, so
    the earlier power carries weight (in the old twin it had none)."""
    t = healthy[0]
    one = t[(t["node"] == t["node"].iloc[0]) & (t["gpu"] == 3)].set_index("timestamp").asfreq("60s")
    x = pd.DataFrame(
        {"now": one["power_usage"], "before": one["power_usage"].shift(1), "temp": one["gpu_temp"]}
    )
    x = x.dropna()
    design = np.column_stack([x["now"], x["before"], np.ones(len(x))])
    coef, *_ = np.linalg.lstsq(design, x["temp"].to_numpy(), rcond=None)
    assert coef[1] > 0.25 * (coef[0] + coef[1]), coef


@pytest.fixture(scope="module")
def accelerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("accelerated")
    simulate(FleetConfig(nodes=24, days=8.0, seed=7, acceleration=50.0), out)
    return out


def _gpu_hours(out: Path) -> pd.DataFrame:
    """Per GPU and hour: each counter's increase and each gauge's maximum, and whether the GPU failed
    within the next two hours after a precursor (doomed) or stayed clear of failures for a day either
    side (healthy)."""
    counters = {m.name for m in metrics_for(Scope.GPU) if m.kind is Kind.COUNTER}
    present = set(pq.read_schema(out / "telemetry.parquet").names)
    columns = [m.name for m in metrics_for(Scope.GPU) if m.name in present and m.name != "gpu_lost"]
    t = pd.read_parquet(out / "telemetry.parquet", columns=["timestamp", "node", "gpu", "gpu_lost", *columns])
    t = t[t["gpu_lost"] == 0]
    t["hour"] = t["timestamp"].dt.floor("h")
    summed = [c for c in columns if c in counters]
    # Each counter's increase within its GPU's series (as _increase, one sort for all of them).
    series = t.groupby(["node", "gpu"], observed=True).ngroup().to_numpy()
    order = np.argsort(series, kind="stable")
    values = t[summed].to_numpy(np.float64)[order]
    step = np.full_like(values, np.nan)
    step[1:] = values[1:] - values[:-1]
    step[np.r_[True, series[order][1:] != series[order][:-1]]] = np.nan  # a series' first step
    increase = np.empty_like(step)
    increase[order] = np.fmax(step, 0.0)  # a reset (or a value missing) counts as nothing
    t[summed] = increase
    hours = t.groupby(["node", "gpu", "hour"], observed=True)
    frame = pd.concat(
        [hours[summed].sum(), hours[[c for c in columns if c not in counters]].max()],
        axis=1,
    ).reset_index()
    failures = pd.read_csv(out / "failures.csv", parse_dates=["timestamp"])
    start = unix_seconds(frame["hour"])
    node_of = frame["node"].astype(str)
    frame["doomed"], frame["healthy"] = False, True
    rows = zip(
        unix_seconds(failures["timestamp"]),
        failures["node"].astype(str),
        failures["gpu"].fillna(-1).astype(int),
        failures["precursor_s"].astype(float),
        strict=True,
    )
    for at, node, gpu, precursor_s in rows:
        here = node_of == node
        if gpu >= 0:
            here &= frame["gpu"] == gpu
        if precursor_s > 0:
            frame.loc[here & (start < at) & (start >= at - 7200), "doomed"] = True
        frame.loc[here & (start >= at - 86_400) & (start < at + 86_400), "healthy"] = False
    return frame


def test_no_single_input_separates_doomed_from_healthy_gpu_hours(accelerated: Path) -> None:
    """The old twin had inputs only doomed hardware showed. Measured here for every GPU input: the
    share of doomed GPU-hours above every healthy GPU-hour (what a threshold with no false alarm
    catches) and the ROC AUC."""
    from sklearn.metrics import roc_auc_score

    frame = _gpu_hours(accelerated)
    doomed, healthy = frame[frame["doomed"]], frame[frame["healthy"]]
    assert len(doomed) >= 50
    assert len(healthy) > 10_000
    measured = {}
    for column in frame.columns.drop(["node", "gpu", "hour", "doomed", "healthy"]):
        a, b = doomed[column].dropna().to_numpy(), healthy[column].dropna().to_numpy()
        if len(a) == 0 or len(b) == 0 or np.ptp(np.r_[a, b]) == 0:
            continue
        auc = roc_auc_score(np.r_[np.ones(len(a)), np.zeros(len(b))], np.r_[a, b])
        clean = max(float((a > b.max()).mean()), float((a < b.min()).mean()))
        measured[column] = (round(float(auc), 3), round(clean, 3))
    print(json.dumps(measured, indent=1))
    assert measured
    assert all(clean < 0.25 for _, clean in measured.values()), measured
    assert all(auc < 0.95 for auc, _ in measured.values()), measured


def test_precursors_are_drawn_per_failure_and_some_degradations_stop() -> None:
    config = FleetConfig(nodes=128, days=30.0, seed=5, acceleration=40.0)
    schedules = [node_schedule(config, n) for n in range(config.nodes)]
    failures = [f for s in schedules for f in s.failures]
    with_precursor = [f for f in failures if f.lead_s > 0]
    share = len(with_precursor) / len(failures)
    assert 0.15 < share < 0.6, share  # most failures give no warning
    # Every mode that can have one sometimes lacks it; the sudden ones never have one.
    by_mode: dict[str, list[bool]] = {}
    for f in failures:
        by_mode.setdefault(f.mode, []).append(f.lead_s > 0)
    assert not any(by_mode["firmware"])
    assert not any(by_mode["software"])
    assert any(by_mode["hbm_wear"])
    assert not all(by_mode["hbm_wear"])
    assert {f.shape for f in with_precursor} == {"ramp", "step", "intermittent", "plateau"}
    assert any(not all(f.signals) for f in with_precursor)  # partial precursors
    strengths = np.array([f.strength for f in with_precursor])
    assert strengths.min() < 0.3
    assert strengths.max() > 3.0
    assert all(not f.aborted for f in failures)


def test_degradations_that_stop_without_failing_come_at_the_real_rate() -> None:
    """As many as the failures that carry a precursor at acceleration 1 (the median world's
    aborted_per_precursor), whatever the acceleration: they are healthy hardware's."""
    counts = {}
    for accel in (1.0, 20.0):
        config = FleetConfig(nodes=256, days=60.0, seed=9, acceleration=accel)
        schedules = [node_schedule(config, n) for n in range(config.nodes)]
        aborted = [f for s in schedules for f in s.aborted]
        assert all(f.aborted and f.peak < 1.0 and f.lead_s > 0 for f in aborted)
        counts[accel] = (len(aborted), sum(1 for s in schedules for f in s.failures if f.lead_s > 0))
    (aborted_1, real_1), (aborted_20, real_20) = counts[1.0], counts[20.0]
    assert abs(aborted_1 - real_1) < 4 * math.sqrt(real_1 + 1), counts
    assert aborted_20 == aborted_1  # the same draws: acceleration does not touch them
    assert real_20 > 10 * real_1


def test_worlds_are_drawn_from_the_priors_and_recorded(tmp_path: Path) -> None:
    a, b = World.draw(1), World.draw(2)
    assert a == World.draw(1)
    assert a.id == World.draw(1).id
    assert a.id != b.id != World().id
    for name, prior in {**PRIORS, **LATER_PRIORS}.items():
        assert prior.low <= getattr(a, name) <= prior.high, name
        assert prior.low <= getattr(World(), name) <= prior.high, name  # the median world is inside
    # A world survives the manifest: FleetConfig(**config.to_json()) rebuilds it.
    config = FleetConfig(nodes=1, days=0.1, world=a)
    assert FleetConfig(**config.to_json()).world == a
    manifest = simulate(config, tmp_path / "run")
    assert manifest["world"]["id"] == a.id
    assert manifest["world"]["seed"] == 1
    assert (
        json.loads((tmp_path / "run" / "manifest.json").read_text())["world"]["parameters"]["tau_sink_s"]
        == a.tau_sink_s
    )


def test_a_world_file_describes_a_fleet_and_bad_ones_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "fleet.json"
    good.write_text(json.dumps({"hot_rack_share": 0.5, "sbe_heavy_share": 0.1}))
    world = World.from_file(good)
    assert (world.hot_rack_share, world.sbe_heavy_share, world.family) == (0.5, 0.1, "user")
    assert world.tau_sink_s == World().tau_sink_s  # the rest is the median world
    for text, says in (
        ('{"hot_rack_shar": 0.5}', "unknown world parameters ['hot_rack_shar']"),
        ('{"hot_rack_share": 1.5}', "hot_rack_share=1.5 (a share is at most 1)"),
        ('{"tau_die_s": -1}', "tau_die_s=-1"),
        ('{"tau_die_s": 0}', "thermal time constants must be positive"),
        ('{"weather_c": "hot"}', "weather_c='hot' (a number)"),
        ("[1, 2]", "a JSON object"),
        ('{"mode_rate_scale": [1, 2]}', "mode_rate_scale must be an object"),
        ('{"mode_rate_scale": {"hbm_wear": "2"}}', "mode_rate_scale[hbm_wear]='2' (a number)"),
        ('{"failure_rate_scale": 1e12}', "failure_rate_scale=1000000000000.0 (at most 100"),
        ('{"thermal_resistance_scale": 1e300}', "thermal_resistance_scale=1e+300 (at most 100"),
        ('{"weather_c": 1e9}', "weather_c=1000000000.0 (at most 100000)"),
        ('{"parameters": []}', "a JSON object of name: value"),
        ('{"parameters": {"hot_rack_share": 0.1}, "hot_rack_share": 0.9}', 'beside "parameters"'),
        ('{"seed": 1.7}', "seed 1.7: an integer"),
        ('{"family": "independent"}', "the other generator's"),
        ("{", "cannot read"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=str(bad)) as caught:
            World.from_file(bad)
        assert says in str(caught.value), (text, caught.value)
    # `faultcast simulate` in this process (its parser and handler; tests/test_cli.py runs the command):
    # argparse refuses the bad file with exit status 2, and runs the good one.
    base = ["simulate", "--nodes", "1", "--days", "0.05", "--world-file"]
    with pytest.raises(SystemExit) as refused:
        main([*base, str(bad), "--out", str(tmp_path / "x")])
    assert refused.value.code == 2
    assert "cannot read the world file" in capsys.readouterr().err
    assert main([*base, str(good), "--out", str(tmp_path / "y")]) == 0
    assert json.loads((tmp_path / "y" / "manifest.json").read_text())["world"]["id"] == world.id


def test_the_simulate_command_runs_either_family_and_refuses_what_the_independent_one_takes_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from faultcast.model.features.offline import open_dataset

    base = ["simulate", "--nodes", "2", "--days", "0.1", "--seed", "4"]
    assert main([*base, "--family", "independent", "--out", str(tmp_path / "ind")]) == 0
    assert "independent family" in capsys.readouterr().out
    assert json.loads((tmp_path / "ind" / "manifest.json").read_text())["world"]["family"] == "independent"
    assert open_dataset(tmp_path / "ind").gpus_per_node == 8  # the model's reader opens it
    assert main([*base, "--world-seed", "5", "--out", str(tmp_path / "drawn")]) == 0
    assert json.loads((tmp_path / "drawn" / "manifest.json").read_text())["world"]["id"] == World.draw(5).id
    capsys.readouterr()
    # Its world comes from its own priors: a world seed draws one of them, a twin's world file is refused.
    world = tmp_path / "world.json"
    world.write_text("{}")
    assert (
        main([*base, "--family", "independent", "--world-file", str(world), "--out", str(tmp_path / "x")])
        == 2
    )
    assert "takes no --world-file" in capsys.readouterr().err


def test_the_thermal_stages_answer_a_power_step_with_their_time_constants_at_any_cadence() -> None:
    """A GPU going from idle to full power: the cold plate reaches 63% of its rise after tau_sink, the
    die after tau_die, whatever the sampling cadence (the filter is exact for held power)."""
    from faultcast.sim.thermal import stage_rises

    tau_die, tau_sink, watts, c_per_w = 5.0, 120.0, 400.0, 0.1
    for cadence_s in (1.0, 10.0, 60.0):
        steps = int(1200 / cadence_s)
        die, sink = stage_rises(
            np.full((steps, 1), watts), np.array([c_per_w]), np.array([tau_die]), np.array([tau_sink]),
            (np.zeros(1), np.zeros(1)), cadence_s,
        )  # fmt: skip
        t = cadence_s * np.arange(1, steps + 1)
        np.testing.assert_allclose(sink[:, 0], 0.6 * c_per_w * watts * -np.expm1(-t / tau_sink), rtol=1e-9)
        np.testing.assert_allclose(die[:, 0], 0.4 * c_per_w * watts * -np.expm1(-t / tau_die), rtol=1e-9)
        assert sink[-1, 0] + die[-1, 0] == pytest.approx(c_per_w * watts, rel=1e-3)  # steady state: C/W x W
    # Carried state: a second chunk continues where the first stopped.
    first = stage_rises(np.full((30, 1), watts), np.array([c_per_w]), np.array([tau_die]), np.array([tau_sink]),
                        (np.zeros(1), np.zeros(1)), 10.0)  # fmt: skip
    whole = stage_rises(np.full((60, 1), watts), np.array([c_per_w]), np.array([tau_die]), np.array([tau_sink]),
                        (np.zeros(1), np.zeros(1)), 10.0)  # fmt: skip
    second = stage_rises(np.full((30, 1), watts), np.array([c_per_w]), np.array([tau_die]), np.array([tau_sink]),
                         (first[0][-1], first[1][-1]), 10.0)  # fmt: skip
    np.testing.assert_allclose(second[1], whole[1][30:], rtol=1e-12)
