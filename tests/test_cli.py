"""`faultcast collect` as an operator runs it: a real process, real output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from faultcast.catalogue import Scope, metrics_for
from faultcast.collector.nvml.source import nvml_available
from faultcast.collector.spool import Spool
from faultcast.readings import NodeSnapshot
from faultcast.service.rpc.telemetry import TelemetryServicer, create_server

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FAULTCAST, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_once_in_prometheus_format_has_the_promised_breadth() -> None:
    done = _run("collect", "--source", "simulated", "--once", "--format", "prometheus")
    assert done.returncode == 0, done.stderr
    families = list(text_string_to_metric_families(done.stdout))
    gpu_names = {f.name for f in families if any("gpu" in s.labels for s in f.samples)}
    network_prefixes = ("faultcast_net_", "faultcast_ib_", "faultcast_peer_", "faultcast_tcp_")
    network_names = {f.name for f in families if f.name.startswith(network_prefixes)}
    assert len(gpu_names) >= 25, sorted(gpu_names)
    assert len(network_names) >= 8, sorted(network_names)
    temps = next(f for f in families if f.name == "DCGM_FI_DEV_GPU_TEMP")
    assert sorted(int(s.labels["gpu"]) for s in temps.samples) == list(range(8))


def test_once_in_json_names_every_gpu_metric_with_nulls_for_missing() -> None:
    done = _run(
        "collect", "--source", "simulated", "--gpus", "2", "--node", "n9", "--once", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["node"] == "n9"
    assert [g["index"] for g in report["gpus"]] == [0, 1]
    assert set(report["gpus"][0]["values"]) == {m.name for m in metrics_for(Scope.GPU)}
    assert report["gpus"][0]["values"]["fan_speed"] is None
    assert report["gpus"][0]["values"]["gpu_temp"] > 0


def test_the_nvml_source_fails_clearly_without_a_gpu_and_auto_says_what_it_chose() -> None:
    available, why = nvml_available()
    nvml = _run("collect", "--source", "nvml", "--once", "--format", "json")
    auto = _run("collect", "--source", "auto", "--once", "--format", "json")
    if available:  # on a GPU machine both read the real hardware
        assert nvml.returncode == 0, nvml.stderr
        assert json.loads(auto.stdout)["source"] == "nvml"
        return
    assert nvml.returncode == 2
    assert "--source nvml" in nvml.stderr
    assert why in nvml.stderr or "NVML" in nvml.stderr
    assert auto.returncode == 0
    assert "using the simulated source" in auto.stderr
    assert json.loads(auto.stdout)["source"] == "simulated"


def test_a_bounded_run_prints_the_live_table_and_a_summary() -> None:
    done = _run(
        "collect", "--source", "simulated", "--prometheus-port", "0", "--prometheus-address", "127.0.0.1",
        "--interval", "200ms", "--duration", "1s", "--table", "1s",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "serving /metrics on http://127.0.0.1:" in done.stdout
    assert "  0 " in done.stdout  # GPU 0's row of the table
    summary = done.stdout[done.stdout.index("summary") :]
    scrapes = int(summary.split("scrapes ")[1].split()[0])
    assert scrapes >= 2
    assert "GPUs 8 (0 lost)" in summary


def test_bad_arguments_are_refused_with_the_reason() -> None:
    done = _run("collect", "--interval", "fast")
    assert done.returncode == 2
    assert "'fast' is not a duration" in done.stderr


def test_serve_refuses_a_metrics_port_file_without_metrics(tmp_path: Path) -> None:
    """The file would never be written and a harness waiting for it would hang: refused before any
    model is read (so none is needed here)."""
    done = _run(
        "serve", "--model", str(tmp_path / "no-model"), "--state-dir", str(tmp_path / "state"), "--insecure",
        "--no-prometheus", "--metrics-port-file", str(tmp_path / "metrics-port"),
    )  # fmt: skip  # flag and value side by side
    assert done.returncode == 2
    assert "--metrics-port-file contradicts --no-prometheus" in done.stderr
    assert not (tmp_path / "metrics-port").exists()


def test_the_command_line_parses_without_loading_the_model_stack() -> None:
    """Every `faultcast collect` on every node builds the whole parser first: LightGBM, scikit-learn
    and pandas load only when a command that needs them runs."""
    probe = (
        "import sys; from faultcast.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('lightgbm', 'sklearn', 'pandas', 'pyarrow') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_metrics_prints_the_catalogue() -> None:
    done = _run("metrics")
    assert done.returncode == 0
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(metrics_for(Scope.GPU)) + sum(
        len(metrics_for(s)) for s in Scope if s is not Scope.GPU
    )
    assert any("`DCGM_FI_DEV_GPU_TEMP`" in row for row in rows)


def test_collect_ships_every_scrape_to_the_service(tmp_path: Path) -> None:
    received: list[NodeSnapshot] = []
    server, port = create_server(TelemetryServicer(received.append))
    try:
        done = _run(
            "collect", "--source", "simulated", "--gpus", "2", "--node", "ship-test", "--no-prometheus",
            "--service", f"127.0.0.1:{port}", "--insecure", "--spool", str(tmp_path / "spool.sqlite"),
            "--interval", "100ms", "--duration", "1s", "--ship-step", "0",
        )  # fmt: skip
    finally:
        server.stop(grace=None)
    assert done.returncode == 0, done.stderr
    summary = done.stdout[done.stdout.index("summary") :]
    scrapes = int(summary.split("scrapes ")[1].split()[0])
    # On exit the shipper flushes: every scrape arrived once, in order, and the spool is empty.
    assert f"acked through {scrapes}, spool depth 0, dropped 0" in summary
    assert [s.sequence for s in received] == list(range(1, scrapes + 1))
    assert {s.node for s in received} == {"ship-test"}
    spool = Spool(tmp_path / "spool.sqlite")
    assert (spool.last_sequence, spool.acked_through, spool.depth) == (scrapes, scrapes, 0)
