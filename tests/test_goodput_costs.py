"""The goodput twin on measured costs: the costs file and its checks, its mapping to the job's costs,
the model that carries them to a large job, the target and what stands in its way, and
`faultcast goodput --costs` (in process on a hand-made replay, and end to end on the demo model)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faultcast.cli.app import build_parser, main
from faultcast.cli.goodput import report_study, setup_of
from faultcast.goodput import cost_scaling as cs
from faultcast.goodput import measured_costs as mc
from faultcast.goodput import study, targets
from faultcast.goodput.engine import JobCosts, Outcome
from faultcast.goodput.process import AlertSample, failure_rates
from faultcast.goodput.replay import Replay


def fixture_costs() -> dict[str, Any]:
    """A costs file as bench/migration.py writes it: a 2-rank job, both paths (figures of the order
    the benchmark sees on one host)."""
    return {
        "schema": "faultcast.migration_costs/1",
        "measured_at": "2026-12-05T12:00:00Z",
        "command": "bash bench/migration.sh",
        "job": {"ranks": 2, "state_bytes": 123_456, "parameters": 1089},
        "paths": {
            "requeue": {
                "snapshot_blocking_s": 0.08,
                "blocked_s": 41.2,
                "alert_to_first_step_s": 44.0,
                "bytes_moved": 123_456,
                "restart_s": 38.5,
            },
            "prescheduled": {
                "snapshot_blocking_s": 0.07,
                "blocked_s": 1.1,
                "alert_to_first_step_s": 12.3,
                "bytes_moved": 123_456,
                "spare_ready_s": 9.8,
                "load_s": 0.2,
            },
        },
        "react_s": 0.6,
        "checkpoint_blocking_s": 0.03,
        "bandwidth_bytes_per_s": {"snapshot_copy": 2.0e9, "load": 1.0e9},
    }


def write(tmp_path: Path, data: object, name: str = "costs.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def at(data: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    """The object holding a dotted key, and the key's last part."""
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    return data, last


# -- the file ------------------------------------------------------------------------------------------


def test_a_good_file_loads_every_figure_and_names_the_keys_it_ignores(tmp_path: Path) -> None:
    data = fixture_costs()
    data["host"] = "bench-1"
    data["paths"]["prescheduled"]["note"] = "warm spare"
    m = mc.load(write(tmp_path, data))
    pre, req = data["paths"]["prescheduled"], data["paths"]["requeue"]
    assert m.source == str(tmp_path / "costs.json")
    assert (m.measured_at, m.command) == (data["measured_at"], data["command"])
    assert (m.ranks, m.state_bytes, m.parameters) == tuple(data["job"].values())
    assert m.prescheduled is not None
    assert m.prescheduled.spare_ready_s == pre["spare_ready_s"]
    assert m.prescheduled.load_s == pre["load_s"]
    assert m.requeue.restart_s == req["restart_s"]
    assert m.copy_bytes_per_s == data["bandwidth_bytes_per_s"]["snapshot_copy"]
    assert m.load_bytes_per_s == data["bandwidth_bytes_per_s"]["load"]
    assert sorted(m.unknown_keys) == ["host", "paths.prescheduled.note"]
    assert mc.load(write(tmp_path, fixture_costs(), "clean.json")).unknown_keys == ()


REQUIRED = [
    "schema",
    "measured_at",
    "command",
    "job",
    "job.ranks",
    "job.state_bytes",
    "job.parameters",
    "paths",
    "paths.requeue",
    "paths.requeue.snapshot_blocking_s",
    "paths.requeue.blocked_s",
    "paths.requeue.alert_to_first_step_s",
    "paths.requeue.bytes_moved",
    "paths.requeue.restart_s",
    "paths.prescheduled.spare_ready_s",
    "paths.prescheduled.load_s",
    "react_s",
    "checkpoint_blocking_s",
    "bandwidth_bytes_per_s.snapshot_copy",
    "bandwidth_bytes_per_s.load",
]


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_key_is_refused_by_its_dotted_name(tmp_path: Path, key: str) -> None:
    data = fixture_costs()
    holder, last = at(data, key)
    del holder[last]
    with pytest.raises(ValueError, match=f"missing required key {key}$"):
        mc.load(write(tmp_path, data))


NUMBERS = [
    "react_s",
    "checkpoint_blocking_s",
    "job.state_bytes",
    "paths.requeue.restart_s",
    "paths.prescheduled.blocked_s",
    "paths.prescheduled.load_s",
    "bandwidth_bytes_per_s.load",
]


@pytest.mark.parametrize("key", NUMBERS)
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1.5", True, None])
def test_a_negative_non_finite_or_non_numeric_figure_is_refused_by_its_name(
    tmp_path: Path, key: str, bad: object
) -> None:
    data = fixture_costs()
    holder, last = at(data, key)
    holder[last] = bad
    with pytest.raises(ValueError, match=f"^{key} must be a"):
        mc.parse(data, "fixture")  # json.dumps would write NaN and Infinity, which json.loads reads back
    with pytest.raises(ValueError, match=f"costs.json: {key} must be a"):
        mc.load(write(tmp_path, data))


@pytest.mark.parametrize(
    ("key", "bad", "message"),
    [
        ("schema", "faultcast.migration_costs/2", "schema is 'faultcast.migration_costs/2'"),
        ("checkpoint_blocking_s", 0, "checkpoint_blocking_s must be a finite number positive"),
        ("bandwidth_bytes_per_s.snapshot_copy", 0.0, "bandwidth_bytes_per_s.snapshot_copy must be"),
        ("job.ranks", 1.5, "job.ranks must be a whole number"),
        ("job.ranks", 0, "job.ranks must be a whole number"),
        ("paths.requeue", [], "paths.requeue must be a JSON object"),
        ("command", 7, "command must be a string"),
        ("paths.prescheduled.blocked_s", 0.01, "paths.prescheduled.blocked_s .* is less than its snapshot"),
    ],
)
def test_a_wrong_schema_type_or_impossible_figure_is_refused(key: str, bad: object, message: str) -> None:
    data = fixture_costs()
    holder, last = at(data, key)
    holder[last] = bad
    with pytest.raises(ValueError, match=message):
        mc.parse(data, "fixture")


def test_a_file_that_is_not_json_or_not_there_is_refused_with_its_name(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": ')
    with pytest.raises(ValueError, match=r"broken\.json: not JSON"):
        mc.load(broken)
    with pytest.raises(ValueError, match=r"absent\.json: cannot read"):
        mc.load(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="the file must be a JSON object"):
        mc.parse([fixture_costs()], "fixture")


# -- the mapping ---------------------------------------------------------------------------------------


def test_the_engine_costs_come_from_the_prescheduled_path_and_the_requeue_restart() -> None:
    data = fixture_costs()
    pre, req = data["paths"]["prescheduled"], data["paths"]["requeue"]
    costs = mc.parse(data, "fixture").job_costs(detect_s=123.0, drain_s=4567.0)
    assert costs == JobCosts(
        checkpoint_s=data["checkpoint_blocking_s"],
        snapshot_s=pre["snapshot_blocking_s"],
        detect_s=123.0,
        restart_s=req["restart_s"],
        migrate_s=pre["blocked_s"] - pre["snapshot_blocking_s"],
        react_s=data["react_s"],
        drain_s=4567.0,
    )


def test_without_a_prescheduled_path_the_requeue_path_is_the_migration() -> None:
    data = fixture_costs()
    del data["paths"]["prescheduled"]
    req = data["paths"]["requeue"]
    m = mc.parse(data, "fixture")
    assert m.path.name == mc.REQUEUE
    costs = m.job_costs(300.0, 3600.0)
    assert costs.snapshot_s == req["snapshot_blocking_s"]
    assert costs.migrate_s == pytest.approx(req["blocked_s"] - req["snapshot_blocking_s"])


# -- the scaling model ---------------------------------------------------------------------------------


def measured() -> mc.MeasuredCosts:
    return mc.parse(fixture_costs(), "fixture")


def test_a_cost_that_moves_no_bytes_keeps_its_fixed_part_only() -> None:
    c = cs.ScaledCost("react_s", "x", 0.6, 0.0, 1e9, 0.0, 5e9)
    assert (c.fixed_s, c.bytes_s, c.total_s) == (0.6, 0.0, 0.6)
    # With bytes measured, the fixed part is what they do not explain; never below zero.
    c = cs.ScaledCost("snapshot_s", "x", 2.0, 1e9, 1e9, 0.0, 5e9)
    assert c.fixed_s == pytest.approx(1.0)
    assert cs.ScaledCost("snapshot_s", "x", 0.5, 1e9, 1e9, 0.0, 5e9).fixed_s == 0.0


def test_twice_the_state_adds_the_bytes_over_the_bandwidth_to_each_cost_that_moves_it() -> None:
    small = cs.Assumptions(cs.LargeJob(70e9, 16_384))
    large = cs.Assumptions(cs.LargeJob(140e9, 16_384))
    per_node = small.job.bytes_per_node
    moved = {
        "checkpoint_s": small.copy_per_node,
        "snapshot_s": small.copy_per_node,
        "migrate_s": small.bandwidths.network_per_node,  # the prescheduled path: pulled from a peer
        "restart_s": small.storage_per_node,
        "react_s": math.inf,  # moves nothing
    }
    for before, after in zip(cs.scale(measured(), small), cs.scale(measured(), large), strict=True):
        # A migration also writes its snapshot whole first: to storage, every node at once.
        write = per_node / small.storage_per_node if before.name == "migrate_s" else 0.0
        assert after.total_s - before.total_s == pytest.approx(per_node / moved[before.name] + write)


def test_the_fixed_part_is_carried_unchanged_and_restarts_and_migrations_pay_the_reinit() -> None:
    m = measured()
    none = cs.Assumptions(cs.LargeJob(70e9, 16_384), reinit_s=0.0)
    some = cs.Assumptions(cs.LargeJob(70e9, 16_384), reinit_s=42.0)
    for a, b in zip(cs.scale(m, none), cs.scale(m, some), strict=True):
        assert a.fixed_s == b.fixed_s
        assert b.total_s - a.total_s == pytest.approx(42.0 if a.name in ("migrate_s", "restart_s") else 0.0)
    by_name = {c.name: c for c in cs.scale(m, none)}
    migrate = by_name["migrate_s"]
    assert migrate.measured_s == pytest.approx(m.path.after_snapshot_s)
    assert migrate.fixed_s == pytest.approx(migrate.measured_s - m.path.bytes_moved / m.load_bytes_per_s)
    # A migration's snapshot is written whole before the standby goes (or the job is requeued).
    assert migrate.write_s > 0
    assert migrate.write_s == pytest.approx(cs.background_write_s(none))
    assert migrate.total_s == pytest.approx(migrate.fixed_s + migrate.bytes_s + migrate.write_s)
    assert all(c.write_s == 0 for c in by_name.values() if c.name != "migrate_s")
    costs = cs.job_costs(cs.scale(m, some), detect_s=60.0, drain_s=600.0)
    assert costs.migrate_s == pytest.approx(cs.scale(m, some)[2].total_s)
    assert (costs.detect_s, costs.drain_s) == (60.0, 600.0)


def test_the_measured_snapshot_write_is_not_carried_as_fixed_time_and_older_files_have_none() -> None:
    a = cs.Assumptions(cs.LargeJob(70e9, 16_384))
    data = fixture_costs()
    data["paths"]["prescheduled"]["snapshot_write_s"] = 0.4
    data["bandwidth_bytes_per_s"]["snapshot_write"] = 123_456 / 0.4
    written = mc.parse(data, "fixture")
    assert written.unknown_keys == ()
    assert written.prescheduled is not None
    assert written.prescheduled.snapshot_write_s == 0.4
    assert written.write_bytes_per_s == pytest.approx(123_456 / 0.4)
    before = {c.name: c for c in cs.scale(measured(), a)}["migrate_s"]
    after = {c.name: c for c in cs.scale(written, a)}["migrate_s"]
    # The measured write came out of the fixed part; the large job's write is charged instead.
    assert before.fixed_s - after.fixed_s == pytest.approx(0.4)
    assert after.write_s == before.write_s == pytest.approx(cs.background_write_s(a))
    assert measured().prescheduled.snapshot_write_s == 0.0  # type: ignore[union-attr]
    data["paths"]["prescheduled"]["snapshot_write_s"] = 1.5  # more than the blocked time allows
    with pytest.raises(ValueError, match="copy and write"):
        mc.parse(data, "fixture")


def test_a_requeue_migration_loads_from_storage_and_a_prescheduled_one_from_a_peer() -> None:
    data = fixture_costs()
    del data["paths"]["prescheduled"]
    a = cs.Assumptions(cs.LargeJob(70e9, 16_384))
    requeue = {c.name: c for c in cs.scale(mc.parse(data, "fixture"), a)}
    prescheduled = {c.name: c for c in cs.scale(measured(), a)}
    assert requeue["migrate_s"].bandwidth == a.storage_per_node
    assert prescheduled["migrate_s"].bandwidth == a.bandwidths.network_per_node


def test_full_sharding_splits_the_state_over_every_node_and_fewer_shards_put_more_on_each() -> None:
    full = cs.LargeJob(70e9, 16_384, bytes_per_param=16.0)
    assert full.nodes == 16_384 // 8
    assert full.state_bytes == pytest.approx(70e9 * 16.0)
    assert full.bytes_per_node == pytest.approx(full.state_bytes / full.nodes)
    grouped = cs.LargeJob(70e9, 16_384, shard_nodes=16)
    assert grouped.bytes_per_node == pytest.approx(full.state_bytes / 16)
    with pytest.raises(ValueError, match="shard_nodes"):
        cs.LargeJob(70e9, 16_384, shard_nodes=full.nodes + 1)
    with pytest.raises(ValueError, match="parameters"):
        cs.LargeJob(-1.0, 16_384)
    with pytest.raises(ValueError, match="network_per_node"):
        cs.Bandwidths(network_per_node=0.0)
    with pytest.raises(ValueError, match="reinit_s"):
        cs.Assumptions(full, reinit_s=math.nan)


def test_storage_is_shared_when_every_node_loads_and_each_shard_is_written_once() -> None:
    bw = cs.Bandwidths(copy_per_gpu=10e9, network_per_node=50e9, storage_total=1e12)
    many = cs.Assumptions(cs.LargeJob(70e9, 16_384), bw)  # 2,048 nodes: storage is the limit
    assert many.storage_per_node == pytest.approx(1e12 / 2048)
    few = cs.Assumptions(cs.LargeJob(70e9, 64), bw)  # 8 nodes: each node's NIC is
    assert few.storage_per_node == 50e9
    assert many.copy_per_node == 8 * 10e9
    # With 16 shards over 2,048 nodes the replicas do not write: one copy of the state goes to storage.
    replicated = cs.Assumptions(cs.LargeJob(70e9, 16_384, shard_nodes=16), bw)
    assert cs.background_write_s(replicated) == pytest.approx(
        max(70e9 * 16 / 1e12, replicated.job.bytes_per_node / 50e9)
    )


# -- the target ----------------------------------------------------------------------------------------


def result(key: str, useful_s: float, **buckets: float) -> study.PolicyResult:
    """A policy whose single run lost the given buckets and computed `useful_s` of a 1,000 s wall."""
    out = Outcome(wall_s=1000.0, useful_s=useful_s, **buckets)  # type: ignore[arg-type]
    assert out.accounted_s == pytest.approx(out.wall_s)
    return study.PolicyResult(key, f"({key})", 300.0, None, (out,))


def test_the_target_needs_95_percent_and_half_the_lost_time_of_a() -> None:
    a = result("a", 880.0, recompute_s=60.0, restart_s=60.0)
    met = targets.check(a, result("b_tuned", 955.0, restart_s=45.0))
    assert (met.ettr_met, met.lost_met, met.met, met.excess_s) == (True, True, True, 0.0)
    # 95.2%, but 48 s lost is more than half of the 70 s (a) loses here.
    small_a = result("a", 930.0, restart_s=70.0)
    check = targets.check(small_a, result("b_tuned", 952.0, restart_s=48.0))
    assert (check.ettr_met, check.lost_met) == (True, False)
    assert check.excess_s == pytest.approx(48.0 - 35.0)
    low = targets.check(a, result("b_tuned", 930.0, restart_s=50.0, migration_s=20.0))
    assert (low.ettr_met, low.met) == (False, False)
    assert low.excess_s == pytest.approx(70.0 - 50.0)  # 5% of the wall is the tighter bound


def test_the_lost_time_splits_into_buckets_largest_first_naming_the_costs_behind_them() -> None:
    r = result("b_tuned", 900.0, restart_s=60.0, migration_s=25.0, checkpoint_s=15.0)
    costs = JobCosts(0.03, 0.08, 300.0, 38.5, 1.02, 0.6, 14_400.0)
    parts = targets.lost_parts(r, costs, frozenset({"detect_s"}))
    assert [p.bucket for p in parts[:3]] == ["restart_s", "migration_s", "checkpoint_s"]
    assert sum(p.lost_s for p in parts) == pytest.approx(100.0)
    assert sum(p.share for p in parts) == pytest.approx(1.0)
    assert "detect 300 s (not measured)" in parts[0].behind
    assert "restart 38.5 s" in parts[0].behind
    assert "(not measured)" not in parts[1].behind


# -- the command ---------------------------------------------------------------------------------------


def replay() -> Replay:
    """A hand-made replay: half the HBM and InfiniBand failures foreseen by an hour at the low threshold,
    none at the high one."""
    leads = {"hbm_wear": (3600.0, None, 1800.0, None), "infiniband": (3600.0, None)}
    blind = {mode: tuple(None for _ in v) for mode, v in leads.items()}
    samples = (AlertSample(0.2, leads, 0.0), AlertSample(0.8, blind, 0.0))
    return Replay(samples, 0.2, 6, {"hbm_wear": 4, "infiniband": 2}, 2000.0, {"data": "hand-made"})


def run_study(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, dict[str, Any]]:
    argv = ["goodput", "--gpus", "2048", "--days", "10", "--replications", "3", "--sweep-replications", "2",
            "--plot", str(tmp_path / "goodput.png"), *flags]  # fmt: skip
    args = build_parser().parse_args(argv)
    found = report_study(args, setup_of(args), replay())
    figures = json.loads(json.dumps(found.figures))  # what --json writes
    return capsys.readouterr().out, figures


def test_with_measured_costs_the_command_runs_the_study_at_them_and_at_their_scaled_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = fixture_costs()
    costs = write(tmp_path, data)
    out, figures = run_study(
        tmp_path, capsys, "--costs", str(costs), "--detect", "120s", "--scale-params", "7e10"
    )
    m = mc.parse(data, str(costs))
    used = m.job_costs(120.0, 4 * 3600.0)
    assert figures["costs"]["source"] == "measured"
    assert figures["costs"]["file"] == str(costs)
    assert figures["costs"]["used"] == vars_of(used)
    assert figures["costs"]["not_measured"] == {"detect_s": 120.0, "drain_s": 4 * 3600.0}
    # The measured run is the shared simulation at exactly the mapped costs: the same figures as the study
    # run directly at them.
    job = study.Job(2048, 10.0, used, spares=6)
    rates = failure_rates()
    direct = study.evaluate(job, rates, replay(), study.draws(job, rates, 3, 0), 3, 2).by_key()
    for p in figures["policies"]:
        assert p["ettr"] == pytest.approx(direct[p["key"]].ettr)
    # The scaled run: the same simulation at the scaled costs.
    a = cs.Assumptions(cs.LargeJob(7e10, 2048))
    scaled_costs = cs.job_costs(cs.scale(m, a), 120.0, 4 * 3600.0)
    scaled = figures["scaled"]
    assert scaled["used"] == vars_of(scaled_costs)
    large = study.Job(2048, 10.0, scaled_costs, spares=6)
    at_scale = study.evaluate(large, rates, replay(), study.draws(large, rates, 3, 0), 3, 2).by_key()
    for p in scaled["policies"]:
        assert p["ettr"] == pytest.approx(at_scale[p["key"]].ettr)
    assert scaled["assumptions"]["bytes_per_node"] == pytest.approx(7e10 * 16 / 256)
    assert scaled["target"]["met"] == targets.check(at_scale["a"], at_scale["b_tuned"]).met
    for heading in ("the goodput target at the measured costs:", "scaled estimate: 70B parameters",
                    "at the scaled estimate", "not modelled:", "| (b') lost time |"):  # fmt: skip
        assert heading in out
    assert out.count("target ((b') >= 95%") == 2
    assert "crash detection 120 s" in out  # the flag, said to be one


def vars_of(costs: JobCosts) -> dict[str, float]:
    return {name: getattr(costs, name) for name in JobCosts.__slots__}


def test_a_larger_reinit_at_scale_costs_policy_a_more_and_leaves_the_measured_run_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = str(write(tmp_path, fixture_costs()))
    _, quick = run_study(tmp_path, capsys, "--costs", costs, "--scale-reinit", "0")
    _, slow = run_study(tmp_path, capsys, "--costs", costs, "--scale-reinit", "10m")
    lost = {
        name: {p["key"]: p["gpu_hours_lost"] for p in figures["scaled"]["policies"]}
        for name, figures in (("quick", quick), ("slow", slow))
    }
    assert lost["slow"]["a"] > lost["quick"]["a"]
    assert quick["policies"] == slow["policies"]


def test_without_costs_the_command_reports_the_flags_costs_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, figures = run_study(tmp_path, capsys, "--migrate", "90s")
    assert figures["costs"] == {"source": "flags", "used": figures["basis"]["costs"]}
    assert figures["costs"]["used"]["migrate_s"] == 90.0
    assert "scaled" not in figures
    assert "goodput target" not in out
    assert "costs: checkpoint 30 s" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--scale-params", "7e10"], "--scale-params: only with --costs"),
        (["--costs", "BAD"], "paths.requeue.restart_s must be a finite number >= 0, got -1"),
        (["--costs", "BAD", "--scale-shards", "999999"], "paths.requeue.restart_s"),
        (["--costs", "GOOD", "--scale-shards", "999999"], "shard_nodes must be between 1 and"),
        (["--costs", "ABSENT"], "cannot read the costs file"),
    ],
)
def test_bad_costs_or_scale_flags_exit_2_with_the_reason_before_any_model_is_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    bad = fixture_costs()
    bad["paths"]["requeue"]["restart_s"] = -1
    files = {"BAD": write(tmp_path, bad, "bad.json"), "GOOD": write(tmp_path, fixture_costs()),
             "ABSENT": tmp_path / "absent.json"}  # fmt: skip
    argv = [str(files.get(f, f)) for f in flags]
    # The model path does not exist: a run that got past the flags would fail on it (or train the demo's).
    code = main(["goodput", "--gpus", "64", "--days", "1", "--model", str(tmp_path / "no-model"), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("faultcast goodput: ")


@pytest.mark.slow  # `faultcast goodput` in a subprocess on the demo model (also slow through service_model)
def test_the_goodput_command_on_measured_costs_end_to_end(service_model: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(service_model, model_dir)
    data = fixture_costs()
    data["bench_host"] = "ci"
    costs = write(tmp_path, data)
    out = tmp_path / "goodput.json"
    arguments = [
        "goodput", "--gpus", "2048", "--days", "10", "--model", str(model_dir), "--costs", str(costs),
        "--twin-nodes", "8", "--twin-days", "1", "--replications", "3", "--sweep-replications", "2",
        "--cache", str(tmp_path / "cache"), "--plot", str(tmp_path / "goodput.png"), "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "faultcast", *arguments], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-5000:]
    assert "ignored (not in the schema): bench_host" in run.stdout
    assert run.stdout.count("target ((b') >= 95%") == 2
    figures = json.loads(out.read_text())
    assert figures["costs"]["source"] == "measured"
    assert figures["costs"]["unknown_keys"] == ["bench_host"]
    assert {p["key"] for p in figures["scaled"]["policies"]} == {
        "a",
        "b",
        "b_tuned",
        "b_bound",
        "c",
        "c_tuned",
    }
    assert figures["basis"]["costs_file"] == str(costs)
