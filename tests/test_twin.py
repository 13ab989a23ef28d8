"""The fleet twin: deterministic, equal offline and live, failures with their signatures, dark until repaired."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from faultcast.catalogue import Scope, metrics_for
from faultcast.cli.app import main
from faultcast.modes import Level
from faultcast.rollup import NETWORK_COLUMNS, rollup_network
from faultcast.schemas import GPU_COLUMNS
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.modes import MODES
from faultcast.sim.node import NodeTwin
from faultcast.sim.schedule import Scenario, node_schedule
from faultcast.sim.writer import simulate

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
# Small but eventful: many failures, repairs inside the horizon, several chunks.
SMALL = FleetConfig(nodes=4, days=2.0, seed=11, acceleration=400.0, chunk_steps=500)


def _read(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, object]]:
    telemetry = pd.read_parquet(out / "telemetry.parquet")
    network = pd.read_parquet(out / "network.parquet")
    failures = pd.read_csv(out / "failures.csv", dtype={"gpu": "Int64", "xid": "Int64"})
    return telemetry, network, failures, json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(SMALL, out, [Scenario("cooling", 2, 4, 3 * 3600.0, 40 * 60.0)])
    return out


def test_the_same_seed_writes_the_same_files_and_another_seed_does_not(
    small_run: Path, tmp_path: Path
) -> None:
    scenarios = [Scenario("cooling", 2, 4, 3 * 3600.0, 40 * 60.0)]
    simulate(SMALL, tmp_path / "again", scenarios)
    for name in ("telemetry.parquet", "network.parquet"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(small_run / name), pd.read_parquet(tmp_path / "again" / name)
        )
    assert (small_run / "failures.csv").read_text() == (tmp_path / "again" / "failures.csv").read_text()

    other = FleetConfig(**{**SMALL.to_json(), "seed": 12})
    simulate(other, tmp_path / "other")
    a, b = (
        pd.read_parquet(small_run / "telemetry.parquet"),
        pd.read_parquet(tmp_path / "other" / "telemetry.parquet"),
    )
    assert not a["gpu_temp"].head(1000).equals(b["gpu_temp"].head(1000))


def test_the_manifest_declares_every_mode_and_counts_the_log(small_run: Path) -> None:
    _, _, failures, manifest = _read(small_run)
    assert isinstance(manifest, dict)
    modes = manifest["modes"]
    assert isinstance(modes, list)
    assert len(modes) >= 8
    assert {m["name"] for m in modes} == {m.name for m in MODES}
    assert manifest["acceleration"] == SMALL.acceleration
    counts = manifest["failure_counts"]
    assert isinstance(counts, dict)
    assert sum(counts.values()) == len(failures)
    assert counts == failures["mode"].value_counts().reindex(list(counts), fill_value=0).to_dict()


def test_live_reads_are_exactly_the_offline_rows(small_run: Path) -> None:
    telemetry, network, _, _ = _read(small_run)
    node = 2
    # A live twin runs with a longer horizon than the offline run: its first days must be the same.
    longer = FleetConfig(**{**SMALL.to_json(), "days": 5.0})
    source = TwinSource(longer, node, [Scenario("cooling", 2, 4, 3 * 3600.0, 40 * 60.0)])
    mine = telemetry[telemetry["node"] == SMALL.node_name(node)]
    mine_net = network[network["node"] == SMALL.node_name(node)]
    live_rows, live_net = [], []
    for _ in range(SMALL.steps):
        reading = source.read()
        assert reading.time_unix_nano is not None
        stamp = pd.Timestamp(reading.time_unix_nano, unit="ns", tz="UTC")
        live_rows += [(stamp, g.index, g.uuid, *g.values) for g in reading.gpus]
        if reading.devices:
            ports = np.array([[d.values for d in reading.devices if d.scope is Scope.IB_PORT]])
            iface = np.array([[d.values for d in reading.devices if d.scope is Scope.INTERFACE]])
            peers = np.array([[d.values for d in reading.devices if d.scope is Scope.PEER]])
            assert reading.host is not None
            agg = rollup_network(ports, iface, peers, np.array([reading.host]))
            live_net.append((stamp, *(float(agg[c][0]) for c in NETWORK_COLUMNS)))
    live = pd.DataFrame(live_rows, columns=["timestamp", "gpu", "uuid", *GPU_COLUMNS])
    offline = mine[["timestamp", "gpu", "uuid", *GPU_COLUMNS]].reset_index(drop=True)
    offline = offline.astype({"gpu": "int64", "uuid": "str"})
    assert len(live) == len(offline) > 0
    np.testing.assert_array_equal(live["timestamp"].to_numpy(), offline["timestamp"].to_numpy())
    assert list(live["uuid"]) == list(offline["uuid"])
    np.testing.assert_array_equal(live[GPU_COLUMNS].to_numpy(), offline[GPU_COLUMNS].to_numpy(np.float64))
    net = pd.DataFrame(live_net, columns=["timestamp", *NETWORK_COLUMNS])
    assert len(net) == len(mine_net)
    np.testing.assert_array_equal(
        net[list(NETWORK_COLUMNS)].to_numpy(), mine_net[list(NETWORK_COLUMNS)].to_numpy(np.float64)
    )


def test_a_node_s_data_does_not_depend_on_the_fleet_size() -> None:
    big = FleetConfig(**{**SMALL.to_json(), "nodes": 9})
    a, b = NodeTwin(SMALL, 1), NodeTwin(big, 1)
    assert a.schedule == b.schedule
    np.testing.assert_array_equal(a.next_chunk().gpu_values, b.next_chunk().gpu_values)


def test_telemetry_is_dark_from_each_failure_until_repair(small_run: Path) -> None:
    telemetry, network, failures, _ = _read(small_run)
    assert len(failures) >= 5
    times = telemetry["timestamp"]
    swaps_checked = lost_seen = 0
    for node in range(SMALL.nodes):
        twin = NodeTwin(SMALL, node, [Scenario("cooling", 2, 4, 3 * 3600.0, 40 * 60.0)])
        for f in twin.schedule.failures:
            if f.fail_s >= SMALL.horizon_s:
                continue
            fail = pd.Timestamp(SMALL.start_unix_s + f.fail_s, unit="s", tz="UTC")
            back = pd.Timestamp(SMALL.start_unix_s + f.return_s, unit="s", tz="UTC")
            rows = telemetry[(telemetry["node"] == SMALL.node_name(node)) & (times >= fail) & (times < back)]
            if f.gpu is not None:
                rows = rows[rows["gpu"] == f.gpu]
            else:
                net = network[(network["node"] == SMALL.node_name(node)) & (network["timestamp"] >= fail)]
                assert not (net["timestamp"] < back).any()
            # A GPU that fell off the bus (Xid 79) is reported lost for a while, values missing.
            lost = rows[rows["gpu_lost"] == 1]
            assert len(lost) == len(rows), f"{f.mode} on {SMALL.node_name(node)} GPU {f.gpu}: rows while dark"
            if f.xid == 79 and f.gpu is not None and not lost.empty:
                lost_seen += 1
                assert lost["timestamp"].max() < fail + pd.Timedelta("10min")
                assert lost["gpu_temp"].isna().all()
                assert (lost["xid_79_events"] >= 1).all()
                assert (lost["xid_last"] == 79).all()
            else:
                assert lost.empty
            assert ((failures["node"] == SMALL.node_name(node)) & (failures["mode"] == f.mode)).any()
            if f.gpu is not None and f.spec.replaced and f.return_s < SMALL.horizon_s:
                slot = telemetry[(telemetry["node"] == SMALL.node_name(node)) & (telemetry["gpu"] == f.gpu)]
                before = set(slot[slot["timestamp"] < fail]["uuid"].astype(str))
                after = set(slot[slot["timestamp"] >= back]["uuid"].astype(str))
                assert after, "a repaired GPU must come back"
                assert not (before & after), "a replaced GPU must come back with a new UUID"
                swaps_checked += 1
    assert swaps_checked >= 1
    assert lost_seen >= 1


def test_failure_counts_follow_the_configured_rates() -> None:
    config = FleetConfig(nodes=256, days=30.0, seed=5, acceleration=40.0)
    counts = dict.fromkeys((m.name for m in MODES), 0)
    for node in range(config.nodes):
        for f in node_schedule(config, node).failures:
            counts[f.mode] += 1
    gpu_days = config.nodes * config.gpus_per_node * config.days
    for m in MODES:
        units = gpu_days / config.gpus_per_node if m.level is Level.NODE else gpu_days
        expected = m.rate_per_day * config.acceleration * units
        # Dark time (about 1% of GPU-days here) removes a little exposure: allow 5 sigma and 5%.
        assert abs(counts[m.name] - 0.99 * expected) <= 5 * math.sqrt(expected) + 0.05 * expected, (
            m.name,
            counts,
        )


def _scenario_run(tmp_path: Path, mode: str, gpu: int | None) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    config = FleetConfig(nodes=1, days=0.5, seed=3, failures=False)
    fail_s = 8 * 3600.0
    simulate(config, tmp_path, [Scenario(mode, 0, gpu, fail_s, 90 * 60.0)])
    return (
        pd.read_parquet(tmp_path / "telemetry.parquet"),
        pd.read_parquet(tmp_path / "network.parquet"),
        fail_s,
    )


def _window(frame: pd.DataFrame, fail_s: float, start_min: float, end_min: float) -> pd.DataFrame:
    start = pd.Timestamp(FleetConfig().start_unix_s + fail_s - start_min * 60, unit="s", tz="UTC")
    end = pd.Timestamp(FleetConfig().start_unix_s + fail_s - end_min * 60, unit="s", tz="UTC")
    return frame[(frame["timestamp"] >= start) & (frame["timestamp"] < end)]


def _growth(frame: pd.DataFrame, column: str) -> float:
    return float(frame[column].max() - frame[column].min())


# mode -> (column, how it shows): the increase of a counter, the mean of a gauge, or its mean in degrees
# (a temperature: a ratio of Celsius means nothing; GPUs differ by their slot's air), in the last
# 20 minutes before the failure against the same GPU three to five hours before.
SIGNATURES = {
    "hbm_wear": ("ecc_sbe_volatile", "growth"),
    "cooling": ("gpu_temp", "degrees"),
    "power": ("throttle_hw_power_brake_step_mean", "mean"),  # brakes of seconds: the step summary
    "nvlink": ("nvlink_crc_flit_errors_worst_link", "growth"),
    "pcie": ("pcie_replay", "growth"),
    "detachment": ("nvml_call_seconds", "mean"),
}


@pytest.mark.parametrize("mode", sorted(SIGNATURES))
def test_each_gpu_mode_shows_its_precursor_on_the_failing_gpu_only(tmp_path: Path, mode: str) -> None:
    telemetry, _, fail_s = _scenario_run(tmp_path, mode, 5)
    column, how = SIGNATURES[mode]
    late, early = _window(telemetry, fail_s, 20, 0), _window(telemetry, fail_s, 300, 180)

    def measure(frame: pd.DataFrame, gpu: int) -> float:
        rows = frame[frame["gpu"] == gpu]
        return _growth(rows, column) if how == "growth" else float(rows[column].mean())

    failing_late, failing_early = measure(late, 5), measure(early, 5)
    others_late = max(measure(late, g) for g in range(8) if g != 5)
    if how == "growth":
        assert failing_late >= 20, failing_late
        assert failing_late >= 10 * max(failing_early, others_late, 1.0), (
            failing_late,
            failing_early,
            others_late,
        )
    elif how == "degrees":
        assert failing_late > failing_early + 10, (failing_late, failing_early)
        assert failing_late > others_late + 10, (failing_late, others_late)
    else:
        assert failing_late > 1.3 * failing_early, (failing_late, failing_early)
        assert failing_late > 1.3 * others_late, (
            failing_late,
            failing_early,
            others_late,
        )


def test_infiniband_degradation_shows_on_the_node(tmp_path: Path) -> None:
    _, network, fail_s = _scenario_run(tmp_path, "infiniband", None)
    late, early = _window(network, fail_s, 20, 0), _window(network, fail_s, 300, 180)
    assert _growth(late, "ib_symbol_error") > 10 * max(_growth(early, "ib_symbol_error"), 1.0)
    assert late["peer_rtt_p99_seconds"].mean() > 2 * early["peer_rtt_p99_seconds"].mean()


def test_a_firmware_fault_has_no_precursor(tmp_path: Path) -> None:
    telemetry, _, fail_s = _scenario_run(tmp_path, "firmware", 5)
    late = _window(telemetry, fail_s, 30, 0)
    gpu, others = late[late["gpu"] == 5], late[late["gpu"] != 5]
    for column in ("ecc_sbe_volatile", "pcie_replay", "nvlink_crc_flit_errors", "nvml_failed_calls"):
        assert (
            _growth(gpu, column)
            <= max(_growth(others[others["gpu"] == g], column) for g in range(8) if g != 5) + 2
        )
    assert gpu["gpu_temp"].mean() < others["gpu_temp"].mean() + 5
    assert len(gpu) > 0
    after = telemetry[(telemetry["gpu"] == 5) & (telemetry["timestamp"] >= late["timestamp"].max())]
    assert len(after) <= 1  # dark from the failure on


def test_confounders_happen_and_cause_no_failure(tmp_path: Path) -> None:
    config = FleetConfig(nodes=8, days=4.0, seed=21, failures=False)
    manifest = simulate(config, tmp_path)
    assert manifest["rows"]["failures"] == 0
    assert (
        tmp_path / "failures.csv"
    ).read_text().strip() == "timestamp,node,gpu,uuid,mode,xid,precursor_s,description"
    t = pd.read_parquet(tmp_path / "telemetry.parquet")
    slots = t.groupby(["node", "gpu"], observed=True)
    # Healthy look-alikes are there: steady low SBE, NVLink bursts, application Xids, power-cap throttling.
    assert (slots["ecc_sbe_volatile"].max() > 0).sum() >= 1
    assert (slots["nvlink_crc_flit_errors_worst_link"].max() >= 5).sum() >= 1
    assert t[["xid_13_events", "xid_31_events", "xid_43_events"]].to_numpy().max() >= 1
    assert t["throttle_sw_power_cap"].max() == 1
    # Counter resets on driver reload: a volatile counter drops back on some GPU, an aggregate never does.
    energy_drops = (slots["total_energy"].diff() < 0).sum()
    assert energy_drops > 0
    assert (slots["ecc_sbe_aggregate"].diff() < 0).sum() == 0
    # And some scrapes are simply missing.
    expected = config.steps * config.nodes * config.gpus_per_node
    assert 0 < expected - len(t) < 0.01 * expected


def test_counters_only_decrease_at_a_reset(small_run: Path) -> None:
    t = pd.read_parquet(small_run / "telemetry.parquet")
    t = t[t["gpu_lost"] == 0]  # a lost GPU's row has no counter values
    counters = [
        m.name
        for m in metrics_for(Scope.GPU)
        if m.kind.value == "counter" and not m.name.startswith("retired")
    ]
    diffs = t.groupby(["node", "gpu"], observed=True)[counters].diff()
    energy_reset = diffs["total_energy"] < 0  # every reset (reload, repair) restarts the energy counter too
    assert energy_reset.any()
    for column in counters:
        assert not ((diffs[column] < 0) & ~energy_reset).any(), column


def test_a_failure_keeps_its_choices_across_chunk_boundaries(tmp_path: Path) -> None:
    # Chunks of 30 steps: the 90-minute precursors cross several boundaries.
    config = FleetConfig(nodes=1, days=0.5, seed=8, failures=False, confounders=False, chunk_steps=30)
    scenarios = [
        Scenario("infiniband", 0, None, 6 * 3600.0, 90 * 60.0),
        Scenario("hbm_wear", 0, 2, 5 * 3600.0, 90 * 60.0),
    ]
    simulate(config, tmp_path, scenarios)
    twin = NodeTwin(config, 0, scenarios[:1])
    symbol = np.concatenate([twin.next_chunk().ib_values[:, :, 0] for _ in range(config.chunks)])
    degraded = np.nonzero(symbol[-1] > 0)[0]
    assert len(degraded) == 1, symbol[-1]  # one port, the same one from the first error to the last
    t = pd.read_parquet(tmp_path / "telemetry.parquet")
    pending = t[t["gpu"] == 2]["row_remap_pending"].to_numpy()
    assert pending.max() == 1
    first_on = int(np.argmax(pending == 1))
    assert (pending[first_on:] == 1).all()  # once pending, it stays pending until the failure


def test_injecting_a_failure_live_changes_nothing_but_its_target() -> None:
    """A scenario injected mid-chunk regenerates the chunk: every signal it does not touch must come
    out exactly as without it (a shared random stream would shift them, even in the past)."""
    config = FleetConfig(nodes=1, days=1.0, seed=9, failures=False, confounders=False, chunk_steps=300)
    out_segs = [m.name for m in metrics_for(Scope.HOST)].index("tcp_out_segs")
    for mode, gpu in (("infiniband", None), ("pcie", 1), ("nvlink", 2), ("hbm_wear", 3)):
        plain, injected = TwinSource(config, 0), TwinSource(config, 0)
        for step in range(290):
            if step == 150:
                injected.inject(Scenario(mode, 0, gpu, injected.virtual_time_s + 3600.0, 1800.0))
            a, b = plain.read(), injected.read()
            if not b.gpus:
                break  # the node failed
            mine = {y.index: y.values for y in b.gpus}
            for x in a.gpus:
                if x.index != gpu:
                    np.testing.assert_array_equal(x.values, mine[x.index], err_msg=f"{mode} at step {step}")
            assert a.host is not None
            assert b.host is not None
            assert a.host[out_segs] == b.host[out_segs], (mode, step)


def test_a_scenario_injected_live_fails_on_cue_with_its_precursor() -> None:
    config = FleetConfig(nodes=1, days=1.0, seed=4, failures=False, chunk_steps=240)
    source = TwinSource(config, 0)
    for _ in range(100):
        source.read()
    now = source.virtual_time_s
    scheduled = source.inject(Scenario("hbm_wear", 0, 3, now + 45 * 60.0, 60 * 60.0))
    assert scheduled.lead_s == 45 * 60.0  # the precursor cannot start in the past
    sbe, seen_until = [], now
    while True:
        reading = source.read()
        gpu3 = [g for g in reading.gpus if g.index == 3]
        t = (reading.time_unix_nano or 0) / 1e9 - config.start_unix_s
        if t >= now + 60 * 60.0:
            break
        if gpu3:
            sbe.append(gpu3[0].get("ecc_sbe_volatile"))
            seen_until = t
    assert seen_until < now + 45 * 60.0  # dark from the failure on
    assert seen_until >= now + 43 * 60.0
    assert sbe[-1] - sbe[0] >= 20


def test_a_scenario_must_make_sense() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        Scenario("meteor", 0, 1, 60.0)
    with pytest.raises(ValueError, match="leave GPU empty"):
        Scenario("infiniband", 0, 1, 60.0)
    with pytest.raises(ValueError, match="after the start"):
        Scenario("hbm_wear", 0, 1, 0.0)
    with pytest.raises(ValueError, match="days must be positive"):
        FleetConfig(days=0)
    with pytest.raises(ValueError, match="strength is a positive number up to 100"):
        Scenario("hbm_wear", 0, 1, 60.0, None, 0.0)
    with pytest.raises(ValueError, match=r"GPU 9 does not exist \(the node has GPUs 0..7\)"):
        NodeTwin(FleetConfig(nodes=1, days=0.1), 0, [Scenario("hbm_wear", 0, 9, 600.0)])


def test_the_simulate_command_writes_the_four_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The installed `faultcast` script on a small fleet: nothing checked here depends on its size.
    out = tmp_path / "twin"
    done = subprocess.run(
        [FAULTCAST, "simulate", "--nodes", "3", "--days", "0.25", "--seed", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "failures.csv", "manifest.json", "network.parquet", "telemetry.parquet"
    ]  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["modes"]) >= 8
    telemetry = pd.read_parquet(
        out / "telemetry.parquet", columns=["timestamp", "node", "gpu", "uuid", "model", "gpu_temp"]
    )
    assert telemetry["node"].nunique() == 3
    assert set(telemetry["model"].astype(str)) <= {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}
    assert f"{manifest['rows']['telemetry']:,} GPU rows" in done.stdout

    # A refused configuration: the same parser and handler, in this process.
    assert main(["simulate", "--days", "0", "--out", str(tmp_path / "x")]) == 2
    assert "days must be positive" in capsys.readouterr().err


def test_scenarios_parse_from_the_command_line_with_clear_errors() -> None:
    from argparse import ArgumentTypeError

    from faultcast.cli.types import scenario as parse_scenario

    assert parse_scenario("hbm_wear:2:5:90m") == Scenario("hbm_wear", 2, 5, 5400.0, None)
    assert parse_scenario("infiniband:1::2h:20m") == Scenario("infiniband", 1, None, 7200.0, 1200.0)
    assert parse_scenario("hbm_wear:2:5:90m:40m:1") == Scenario("hbm_wear", 2, 5, 5400.0, 2400.0, 1.0)
    assert parse_scenario("hbm_wear:2:5:90m::0.5") == Scenario("hbm_wear", 2, 5, 5400.0, None, 0.5)
    quiet = Scenario("pcie", 0, 1, 600.0, None, 0.5)
    assert parse_scenario(quiet.arg()) == quiet
    assert Scenario.parse("pcie:0:1:10m").strength == 3.0  # on cue: a textbook failure
    for text, message in (
        ("hbm_wear:2:5:90m:40m:loud", "STRENGTH is a number"),
        ("hbm_wear:2:5:90m:40m:0", "STRENGTH must be a positive number"),
        ("hbm_wear:2:5:90m:40m:1e308", "STRENGTH must be a positive number up to 100"),
        ("hbm_wear:2:5", "expected MODE:NODE:GPU:AT"),
        ("lightning:0:1:5m", "unknown mode"),
        ("infiniband:0:3:5m", "leave GPU empty"),
        ("pcie:0::5m", "give a GPU"),
        ("pcie:x:1:5m", "indexes"),
    ):
        with pytest.raises(ArgumentTypeError, match=message):
            parse_scenario(text)


def test_collect_runs_the_twin_at_speed_and_fails_a_gpu_on_cue() -> None:
    # About 60 scrapes of 10 simulated seconds each (50 ms x 200): GPU 2 fails 150 simulated seconds in.
    done = subprocess.run(
        [FAULTCAST, "collect", "--source", "simulated", "--gpus", "4", "--no-prometheus", "--interval", "50ms",
         "--speed", "200", "--scenario", "pcie:0:2:150s:120s", "--duration", "3s", "--table", "100ms"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tables = done.stdout.split("\n\n")
    rows_of_gpu2 = [line for table in tables for line in table.splitlines() if line.startswith("  2 ")]
    healthy = [line for line in rows_of_gpu2 if "LOST" not in line]
    assert healthy, done.stdout
    replays = [float(line.split()[9]) for line in healthy]
    assert replays[-1] > replays[0]  # the precursor: PCIe replays climb
    # Then Xid 79: the GPU falls off the bus and the collector reports it lost.
    assert "LOST (fallen off the bus)" in rows_of_gpu2[-1]
    assert "GPUs 4 (1 lost)" in done.stdout
