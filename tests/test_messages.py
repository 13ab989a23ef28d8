"""Messages a person can act on: what `faultcast train` needs when it refuses, alerts that
say when first and how far above their threshold they stand, and every directory flag of the CLI
refused or created in one line."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from faultcast.actions import Action
from faultcast.alert_text import alert_summary, risk_text, time_to_failure_text
from faultcast.cli.app import main
from faultcast.model.alert_content import AlertContent
from faultcast.model.evaluation.batch_alerts import CSV_FIELDS, ScoredAlert, render_table, summary, write_csv
from faultcast.model.features.offline import open_dataset
from faultcast.model.training.needs import EXPECTED_IN_SMALLEST, learnable_rate, shortfall
from faultcast.model.training.train import TrainConfig, make_split
from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate
from faultcast.v1 import alerts_pb2 as apb

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))


# --- alerts: when first, then the risk against its threshold -------------------------------------------


def _alert(risk: float, tier: int = 0, threshold: float = 0.016, protect: float = 0.0) -> apb.Alert:
    return apb.Alert(
        node="node-0001", gpu=3, risk=risk, kind=apb.EVENT_KIND_OPENED, tier=tier,  # type: ignore[arg-type]
        time_to_failure=apb.TimeToFailure(p10_seconds=300, p50_seconds=720, p90_seconds=1500),
        model=apb.ModelInfo(threshold=threshold, protect_threshold=protect),
    )  # fmt: skip


def test_an_alert_says_when_first_then_how_far_above_its_threshold() -> None:
    assert alert_summary(_alert(0.031)) == "failure in ~12 min (5-25), risk 0.031 = 1.9x threshold 0.016"


def test_a_protect_alert_is_measured_against_the_protect_threshold() -> None:
    protect = _alert(0.012, tier=apb.ALERT_TIER_PROTECT, protect=0.006)
    assert alert_summary(protect).endswith("risk 0.012 = 2.0x protect threshold 0.006")
    move = _alert(0.032, tier=apb.ALERT_TIER_MOVE, protect=0.006)
    assert alert_summary(move).endswith("risk 0.032 = 2.0x move threshold 0.016")


def test_an_alert_without_a_model_or_a_time_says_what_it_has() -> None:
    bare = apb.Alert(node="n", gpu=0, risk=0.5)
    assert alert_summary(bare) == "no time estimate, risk 0.5"
    assert time_to_failure_text(0.0) == "no time estimate"
    assert risk_text(0.5, math.nan) == "risk 0.5"


def _scored(risk: float, threshold: float = 0.016) -> ScoredAlert:
    content = AlertContent(
        mode="hbm_wear", mode_probability=0.9, risk=risk, risk_within=(0.01, 0.02, risk),
        ttf_s=(300.0, 720.0, 1500.0), top_features=(("sbe_rate_5m", 3.0, 1.2),), action=Action.SNAPSHOT_AND_MIGRATE,
    )  # fmt: skip
    return ScoredAlert(
        time_s=1.767e9, node="node-0001", gpu=3, gpus=(3,), gpus_per_node=8, content=content,
        outcome=None, failure=None, threshold=threshold,
    )  # fmt: skip


def test_the_score_table_shows_the_time_then_the_risk_against_the_threshold(tmp_path: Path) -> None:
    alerts = [_scored(0.031)]
    table = render_table(alerts)
    assert "| time | node | GPU | time to failure p50 (p10-p90), min | risk | x threshold |" in table
    assert "| 12 (5-25) | 0.031 | 1.9x |" in table
    assert summary(alerts).startswith("1 alert at threshold 0.016 (risk: the chance of failing within")
    write_csv(alerts, tmp_path / "alerts.csv")
    (row,) = csv.DictReader((tmp_path / "alerts.csv").open())
    # New columns come after the old ones, which keep their names and order.
    assert list(row)[-2:] == ["threshold", "risk_x_threshold"] == list(CSV_FIELDS)[-2:]
    assert list(row)[:5] == ["time", "node", "gpu", "gpus", "risk"]
    assert (row["threshold"], row["risk_x_threshold"]) == ("0.016", "1.938")


# --- train: what it got, and what would do ---------------------------------------------------------


@pytest.fixture(scope="module")
def small_twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's twin: 16 nodes x 4 days at 200x, whose validation slice has no failure."""
    out = tmp_path_factory.mktemp("twin") / "small"
    simulate(FleetConfig(nodes=16, days=4.0, acceleration=200.0), out, [])
    return out


def test_train_refuses_saying_what_it_got_and_how_much_data_would_do(
    small_twin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--data", str(small_twin), "--out", str(tmp_path / "m")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("faultcast train: too few failures to train: ")
    dataset = open_dataset(small_twin)
    learnable = Counter(str(m) for m in dataset.failures.learnable().mode)
    assert f"holds {sum(learnable.values())} failures a warning could precede (" in line
    for mode, count in learnable.items():
        assert f"{mode} {count}" in line
    assert "in 512 GPU-days; training needs at least 1 in each of its fit slice (" in line
    assert "and its validation slice (51 GPU-days: got 0)" in line
    # The size it names is the one whose validation slice (10% of the GPU-days) expects 3 failures
    # at the data's own rate.
    rate, source = learnable_rate(dataset)
    assert source == "this data's failure rate"
    needed = float(re.search(r"about ([\d,.]+) GPU-days would do", line)[1].replace(",", ""))  # type: ignore[index]
    split = make_split(dataset, TrainConfig())
    share = len(split.train_nodes) / 16 * (split.train_end_s - split.validation_start_s) / (4 * 86_400.0)
    assert needed == pytest.approx(EXPECTED_IN_SMALLEST / (rate * share), rel=0.01)
    assert "e.g. 16 nodes x " in line
    assert "`faultcast simulate --acceleration " in line
    assert not (tmp_path / "m").exists()


def test_without_failures_the_twin_s_expected_rate_scales_the_need(tmp_path: Path) -> None:
    out = tmp_path / "quiet"
    simulate(FleetConfig(nodes=2, days=0.05), out, [])
    dataset = open_dataset(out)
    assert len(dataset.failures) == 0
    text = shortfall(dataset, Counter(), Counter(), 1, 3600.0, 900.0)
    assert "holds 0 failures a warning could precede" in text
    assert "at the twin's expected failure rate (" in text
    dataset.manifest.pop("modes")
    assert shortfall(dataset, Counter(), Counter(), 1, 3600.0, 900.0).endswith(
        "no failure rate to scale by: more days, more nodes or more acceleration"
    )


# --- directories: refused or created, in one line --------------------------------------------------

MISSING = "missing/dir"
FILE = "a-file"  # a file where a directory's parent should be


@pytest.fixture
def places(tmp_path: Path) -> Path:
    (tmp_path / FILE).write_text("")
    return tmp_path


# (argv with {m}: a missing directory, {f}: a path under a file, {t}: tmp_path), the flag named
REFUSED = [
    (["train", "--data", "{m}", "--out", "{t}/model"], "--data {m}: no such directory"),
    (["train", "--data", "{t}", "--out", "{f}/model"], "--out {f}/model: cannot be created"),
    (["train", "--data", "{t}", "--out", "{t}/m", "--rows-cache", "{f}/c"], "--rows-cache {f}/c: cannot be created"),
    (["evaluate", "--model", "{m}", "--data", "{t}"], "--model {m}: no such directory"),
    (["evaluate", "--model", "{t}", "--data", "{m}"], "--data {m}: no such directory"),
    (["evaluate", "--model", "{t}", "--data", "{t}", "--false-alarm-data", "{m}"], "--false-alarm-data {m}: no such"),
    (["evaluate", "--model", "{t}", "--data", "{t}", "--reference", "{t}={m}"], "--reference {m}: no such directory"),
    (["evaluate", "--model", "{t}", "--data", "{t}", "--json", "{f}/x.json"], "--json {f}/x.json: its directory"),
    (["simulate", "--out", "{f}/twin"], "--out {f}/twin: cannot be created"),
    (["goodput", "--model", "{m}"], "--model {m}: no such directory"),
    (["goodput", "--model", "{t}", "--replay-data", "{m}"], "--replay-data {m}: no such directory"),
    (["goodput", "--model", "{t}", "--cache", "{f}/c"], "--cache {f}/c: cannot be created"),
    (["goodput", "--model", "{t}", "--cache", "{t}/c", "--plot", "{f}/p.png"], "--plot {f}/p.png: its directory"),
    (["failures", "--slurm-events", "{t}/e", "--out", "{f}/f.csv"], "--out {f}/f.csv: its directory"),
    (["collect", "--once", "--proc-root", "{m}"], "--proc-root {m}: no such directory"),
    (["collect", "--once", "--sys-root", "{m}"], "--sys-root {m}: no such directory"),
    (["demo", "--model", "{m}"], "--model {m}: no such directory"),
    (["demo", "--model", "{t}", "--out", "{f}/out"], "--out {f}/out: cannot be created"),
    (["score", "--model", "{m}", "--data", "{t}"], "--model {m}: no such directory"),
    (["score", "--model", "{t}", "--data", "{m}"], "--data {m}: no such directory"),
    (["score", "--model", "{t}", "--data", "{t}", "--csv", "{f}/a.csv"], "--csv {f}/a.csv: its directory"),
    (["calibrate", "--model", "{m}", "--data", "{t}"], "--model {m}: no such directory"),
    (["calibrate", "--model", "{t}", "--data", "{m}"], "--data {m}: no such directory"),
    (["calibrate", "--model", "{t}", "--data", "{t}", "--failures", "{m}/f.csv"], "--failures {m}/f.csv: no such"),
    (["calibrate", "--model", "{t}", "--data", "{t}", "--json", "{f}/c.json"], "--json {f}/c.json: its directory"),
    (["import-prometheus", "--export", "{m}", "--out", "{t}/o"], "--export {m}: no such file"),
    (["import-prometheus", "--export", "{t}", "--failures", "{m}/f.csv", "--out", "{t}/o"], "--failures {m}/f.csv"),
    (["import-prometheus", "--export", "{t}", "--out", "{f}/o"], "--out {f}/o: cannot be created"),
    (["import-prometheus", "--export", "{t}", "--out", "{t}/o", "--spill-dir", "{f}/s"], "--spill-dir {f}/s: cannot"),
    (["import-prometheus", "--url", "http://127.0.0.1:1", "--out", "{t}/o", "--fetch-dir", "{f}/x"], "--fetch-dir"),
]  # fmt: skip


def _fill(args: list[str], places: Path) -> list[str]:
    m, f = places / MISSING, places / FILE
    return [a.format(m=m, f=f, t=places) for a in args]


@pytest.mark.parametrize(
    ("argv", "named"), REFUSED, ids=[" ".join([*a[:1], n.split()[0]]) for a, n in REFUSED]
)
def test_a_directory_flag_is_refused_in_one_line(
    argv: list[str], named: str, places: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_fill(argv, places)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    (text,) = _fill([named], places)
    assert line.startswith(f"faultcast{' ' + argv[0] if argv[0] != 'collect' else ''}: {text}"), line
    assert not (places / MISSING).exists()


SERVE_REFUSED = [
    (["serve", "--insecure", "--model", "{m}", "--state-dir", "{t}/state"], "--model {m}: no such directory"),
    (["serve", "--insecure", "--model", "{t}", "--state-dir", "{f}/state"], "--state-dir {f}/state: cannot be created"),
    (["serve", "--insecure", "--model", "{t}", "--state-dir", "{t}/s", "--port-file", "{f}/p"], "--port-file {f}/p"),
    (["token", "--role", "admin", "--name", "me", "--tokens-file", "{f}/t"], "--tokens-file {f}/t: its directory"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "named"), SERVE_REFUSED, ids=[n.split()[0] for _, n in SERVE_REFUSED])
def test_serve_refuses_a_directory_in_one_logged_line(
    argv: list[str], named: str, places: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(_fill(argv, places)) == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    (text,) = _fill([named], places)
    assert record.getMessage().startswith(text)
    assert "\n" not in record.getMessage()


def test_serve_s_refusal_is_one_line_on_stderr(places: Path) -> None:
    done = subprocess.run(
        [FAULTCAST, "serve", "--insecure", "--model", str(places / MISSING), "--state-dir", str(places / "state")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith(f"--model {places / MISSING}: no such directory")
    assert not (places / "state").exists()


def test_output_directories_are_created(places: Path, capsys: pytest.CaptureFixture[str]) -> None:
    twin = places / "new" / "twins" / "one"
    assert main(["simulate", "--nodes", "2", "--days", "0.05", "--out", str(twin)]) == 0
    assert (twin / "manifest.json").is_file()
    spill = places / "new" / "spill"
    export = places / "export.json"
    export.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n"},
         "values": [[60, "40"], [120, "41"]]}]}}))  # fmt: skip
    out = places / "new" / "imported"
    assert (
        main(["import-prometheus", "--export", str(export), "--out", str(out), "--spill-dir", str(spill)])
        == 0
    )
    assert spill.is_dir()
    assert (out / "telemetry.parquet").is_file()
    tokens = places / "new" / "secrets" / "tokens"
    assert main(["token", "--role", "admin", "--name", "me", "--tokens-file", str(tokens)]) == 0
    assert tokens.is_file()
