"""A real Prometheus server scrapes a real `faultcast collect` process and answers queries about it;
and, with the shipped rules loaded, a real service fed by a simulated collector, against which every
query of the shipped Grafana dashboard must return data."""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import start_http_server

from faultcast.service.server import Service
from faultcast.testing.system import require_binary
from tests.prometheus_api import api, running_prometheus, until
from tests.test_deploy import RULES, panel_queries

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
NODE = "prom-test-node"


@pytest.fixture
def collector_port() -> Iterator[int]:
    proc = subprocess.Popen(
        [
            FAULTCAST,
            "collect",
            "--source",
            "simulated",
            "--node",
            NODE,
            "--prometheus-address",
            "127.0.0.1",
            "--prometheus-port",
            "0",
            "--interval",
            "1s",
            "--duration",
            "300s",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
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
    require_binary("prometheus")  # before anything else is set up: fail (CI) or skip at once
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: faultcast\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{collector_port}']\n"
    )
    with running_prometheus(config, tmp_path) as port:
        yield port


def _names(port: int, selector: str) -> set[str]:
    result = api(port, "query", query=f"group by (__name__) ({selector})")["result"]
    return {r["metric"]["__name__"] for r in result}


def test_prometheus_scrapes_the_collector(prometheus_port: int) -> None:
    targets = until(
        lambda: [t for t in api(prometheus_port, "targets")["activeTargets"] if t["health"] == "up"],
        "the collector target to be up",
    )
    assert targets[0]["labels"]["job"] == "faultcast"

    gpu_names = until(lambda: _names(prometheus_port, f'{{Hostname="{NODE}", gpu!=""}}'), "GPU series")
    assert len(gpu_names) >= 25, sorted(gpu_names)
    assert {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "faultcast_nvlink_crc_flit_errors_worst_link",
        "faultcast_gpu_lost",
    } <= gpu_names

    network = _names(prometheus_port, f'{{Hostname="{NODE}", __name__=~"faultcast_(net|ib|peer|tcp)_.+"}}')
    assert len(network) >= 8, sorted(network)
    assert "faultcast_ib_symbol_error_total" in network

    per_gpu = api(prometheus_port, "query", query=f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname="{NODE}"}})')
    assert per_gpu["result"][0]["value"][1] == "8"


# --- the dashboard on a healthy running system -------------------------------------------------------

SCORED_NODE = "dash-node"
# The collector scrapes every 0.5 s at 120x: samples 60 simulated seconds apart (the model's cadence),
# two a second. The slowest panel, feature drift, waits for the service to have scored 500 feature rows
# (63 samples of the node's 8 GPUs): about 32 s at this pace, 63 s at one sample a second.
SCRAPE_INTERVAL, SPEED = "0.5s", 120
# The twin starts this far back, so that at 120 simulated seconds a second the collector's samples
# stay within the service's default age and clock-skew limits for the whole test (it reaches the wall
# clock after about 150 s, and then runs at real time).
BACKFILL_S = 5 * 3600
# What Grafana puts in its variables for a 1 s scrape interval (its $__rate_interval is at least four
# scrapes); $node is filled with a node the service scores.
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "1m"}


@dataclass(frozen=True)
class Fleet:
    prometheus_port: int
    node: str


def _spawn_collector(service_port: int, spool: Path) -> tuple[subprocess.Popen[str], int]:
    """A simulated node that pushes to the service and serves its own /metrics (dcgm-exporter names)."""
    proc = subprocess.Popen(
        [
            FAULTCAST,
            "collect",
            "--source",
            "simulated",
            "--node",
            SCORED_NODE,
            "--prometheus-address",
            "127.0.0.1",
            "--prometheus-port",
            "0",
            "--interval",
            SCRAPE_INTERVAL,
            "--speed",
            str(SPEED),
            "--sim-start",
            str(int(time.time()) - BACKFILL_S),
            "--service",
            f"127.0.0.1:{service_port}",
            "--insecure",
            "--spool",
            str(spool),
            "--duration",
            "300s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving /metrics" not in line:
        proc.kill()
        raise AssertionError(f"the collector did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture(scope="module")
def healthy_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """A real service (default limits, insecure gRPC) with its /metrics on a port, one simulated
    collector shipping to it, and a real Prometheus scraping both every second with the shipped rules."""
    require_binary("prometheus")  # before anything else is set up: fail (CI) or skip at once
    model: Path = request.getfixturevalue("service_model")  # trained only when Prometheus is here
    tmp_path = tmp_path_factory.mktemp("healthy-fleet")
    (tmp_path / "state").mkdir()
    service = Service.open(model, tmp_path / "state")
    with contextlib.ExitStack() as stack:
        service_port = service.start("127.0.0.1:0")
        stack.callback(service.stop, 0)
        metrics_server, _ = start_http_server(0, addr="127.0.0.1", registry=service.metrics.registry)
        stack.callback(metrics_server.server_close)
        stack.callback(metrics_server.shutdown)
        collector, collector_port = _spawn_collector(service_port, tmp_path / "spool.sqlite")
        stack.callback(collector.wait, 30)
        stack.callback(collector.terminate)
        targets = {"faultcast": metrics_server.server_port, "faultcast-collector": collector_port}
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}
                for job, target in targets.items()
            ],
        }
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # YAML is a superset of JSON
        port = stack.enter_context(running_prometheus(config_file, tmp_path))
        yield Fleet(port, SCORED_NODE)


def _returns_data(port: int, query: str) -> bool:
    """Whether an instant query gives at least one series with a number (NaN is a gap in Grafana)."""
    return _lacks(port, query, "") is None


def _lacks(port: int, query: str, legend: str) -> str | None:
    """What Grafana would show wrong for a query and its legend: no data, or a legend naming a
    label its series lack (shown blank); None when neither."""
    result = api(port, "query", query=query)["result"]
    if not any(not math.isnan(float(series["value"][1])) for series in result):
        return "no data"
    named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    lacking = {label for series in result for label in named if label not in series["metric"]}
    return f"the legend names {sorted(lacking)}, which its series lack" if lacking else None


def _label_values(port: int, label: str, metric: str) -> list[str]:
    """What Grafana's label_values(metric, label) offers (it asks this API)."""
    values: list[str] = api(port, f"label/{label}/values", **{"match[]": metric})
    return values


def test_every_dashboard_query_returns_data_on_a_healthy_system(healthy_fleet: Fleet) -> None:
    port = healthy_fleet.prometheus_port
    until(
        lambda: (
            {t["labels"]["job"] for t in api(port, "targets")["activeTargets"] if t["health"] == "up"}
            == {"faultcast", "faultcast-collector"}
        ),
        "the service and the collector to be up",
    )
    nodes = until(
        lambda: _label_values(port, "node", "faultcast_failure_risk"), "scored GPUs (the $node variable)"
    )
    assert nodes == [healthy_fleet.node]

    queries = panel_queries({**GRAFANA_VARIABLES, "$node": nodes[0]})
    assert len(queries) >= 30, "fewer dashboard queries than expected: is the dashboard read?"
    wrong: dict[str, str] = {}

    def settle() -> bool:
        # Rates need a few scrapes of a scoring service: ask again until every query has its data.
        wrong.clear()
        for where, (query, legend) in queries.items():
            problem = _lacks(port, query, legend)
            if problem is not None:
                wrong[where] = f"{problem}: {query}"
        return not wrong

    with contextlib.suppress(AssertionError):
        until(settle, "every dashboard query to return data", timeout=120)
    assert wrong == {}, "dashboard queries that show nothing, or blanks, on a healthy system"


def test_the_shipped_rules_evaluate_against_the_real_service(healthy_fleet: Fleet) -> None:
    """Every rule evaluates without error on the series a real service exposes (the risk rule joins
    each GPU's risk to the one threshold its target serves)."""
    port = healthy_fleet.prometheus_port
    until(lambda: _returns_data(port, "faultcast_failure_risk"), "scored GPUs")
    joined = "count(faultcast_failure_risk >= bool on (job, instance) group_left faultcast_alert_threshold)"
    until(lambda: _returns_data(port, joined), "the risk-to-threshold join")
    gpus = api(port, "query", query="count(faultcast_failure_risk)")["result"][0]["value"][1]
    assert api(port, "query", query=joined)["result"][0]["value"][1] == gpus

    def rules() -> list[dict[str, Any]]:
        return [rule for group in api(port, "rules")["groups"] for rule in group["rules"]]

    evaluated = until(
        lambda: (found := rules()) and all(rule["health"] != "unknown" for rule in found) and found,
        "every shipped rule to be evaluated",
    )
    assert {rule["name"]: rule.get("lastError", "") for rule in evaluated if rule["health"] != "ok"} == {}
