"""A real Prometheus server scrapes a real `faultcast collect` process and answers queries about it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, require_binary

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
NODE = "prom-test-node"


def _api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


def _until(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll an observable condition of the real servers until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def collector_port() -> Iterator[int]:
    proc = subprocess.Popen(
        [FAULTCAST, "collect", "--source", "simulated", "--node", NODE, "--prometheus-address", "127.0.0.1",
         "--prometheus-port", "0", "--interval", "1s", "--duration", "300s"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving /metrics" in line, line
        yield int(line.rsplit(":", 1)[1].split("/")[0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def prometheus_port(tmp_path: Path, collector_port: int) -> Iterator[int]:
    binary = require_binary("prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: faultcast\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{collector_port}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _names(port: int, selector: str) -> set[str]:
    result = _api(port, "query", query=f"group by (__name__) ({selector})")["result"]
    return {r["metric"]["__name__"] for r in result}


def test_prometheus_scrapes_the_collector(prometheus_port: int) -> None:
    targets = _until(
        lambda: [t for t in _api(prometheus_port, "targets")["activeTargets"] if t["health"] == "up"],
        "the collector target to be up",
    )
    assert targets[0]["labels"]["job"] == "faultcast"

    gpu_names = _until(lambda: _names(prometheus_port, f'{{Hostname="{NODE}", gpu!=""}}'), "GPU series")
    assert len(gpu_names) >= 25, sorted(gpu_names)
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "faultcast_nvlink_crc_flit_errors_worst_link", "faultcast_gpu_lost"} <= gpu_names  # fmt: skip

    network = _names(prometheus_port, f'{{Hostname="{NODE}", __name__=~"faultcast_(net|ib|peer|tcp)_.+"}}')
    assert len(network) >= 8, sorted(network)
    assert "faultcast_ib_symbol_error_total" in network

    per_gpu = _api(prometheus_port, "query", query=f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{NODE}"}})')
    assert per_gpu["result"][0]["value"][1] == "8"
