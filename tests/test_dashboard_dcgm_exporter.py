"""The shipped Grafana dashboard on a stock NVIDIA dcgm-exporter: a real Prometheus scrapes an
exposition of dcgm-exporter's default counters (and nothing of faultcast's), and every panel either
shows data or says on its face (its title, or its row's) that it needs faultcast's own collector or
service; a line of a panel that shows data may lack data only where the panel's description says
what it needs."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from faultcast.testing.system import require_binary
from tests.prometheus_api import api, running_prometheus, until
from tests.test_dcgm_parity import DCGM_EXPORTER_TYPES
from tests.test_dcgm_parity import DEFAULT_COUNTERS as DEFAULT_ROWS
from tests.test_deploy import DASHBOARD, metric_names
from tests.test_prometheus_scrape import GRAFANA_VARIABLES, _lacks

# How a panel says on its face that it needs more than dcgm-exporter: its title or its row's title.
NEEDS_SERVE = "(faultcast serve)"
NEEDS_COLLECT = "(needs faultcast collect)"
# How a panel with data says, in its description, that one of its lines needs more.
NEEDS_IN_DESCRIPTION = ("needs faultcast collect", "needs faultcast serve")

# dcgm-exporter 4.5.3-4.8.2's default counters (etc/default-counters.csv's enabled rows, as
# test_dcgm_parity lists them) with their declared types; DCGM_FI_DRIVER_VERSION is a label there, and
# the one row the types table leaves out (faultcast does not export it), the vGPU licence state, is a
# gauge. The DCGM_FI_PROF_* fields are exported on GPUs with profiling metrics (A100, H100).
DEFAULT_COUNTERS = {
    name: DCGM_EXPORTER_TYPES.get(name, "gauge") for name in DEFAULT_ROWS if name != "DCGM_FI_DRIVER_VERSION"
}
HOSTS = ("dgx-a", "dgx-b")
GPUS = 2
# The one GPU that reported an Xid (79: fallen off the bus), so the Xid panel has a code to show.
XID_GPU, XID_CODE = ("dgx-b", 1), 79


class StockExporter(ThreadingHTTPServer):
    """What dcgm-exporter 4.8's /metrics serves for HOSTS x GPUS with its default counters, in its
    text format and label order (gpu, UUID, pci_bus_id, device, modelName, Hostname, then its label
    fields, then DCGM_FI_DEV_XID_ERRORS's err_code and err_msg). One server stands for every host:
    the series carry their Hostname, as each host's exporter would give them. Counters grow with
    every scrape."""

    scrapes = 0

    def exposition(self) -> str:
        self.scrapes += 1
        lines = []
        for name, kind in DEFAULT_COUNTERS.items():
            lines += [f"# HELP {name} {name} (test).", f"# TYPE {name} {kind}"]
            for host_index, host in enumerate(HOSTS):
                for gpu in range(GPUS):
                    labels = (
                        f'gpu="{gpu}",UUID="GPU-0000000{host_index}-0000-0000-0000-00000000000{gpu}",'
                        f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
                        f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                        'DCGM_FI_DRIVER_VERSION="550.90.07"'
                    )
                    value: float = 40.0 + gpu
                    if kind == "counter":
                        value = 1000.0 * self.scrapes
                    if name == "DCGM_FI_DEV_XID_ERRORS":
                        value = XID_CODE if (host, gpu) == XID_GPU else 0
                        message = "GPU has fallen off the bus" if value else "No Error"
                        labels += f',err_code="{int(value)}",err_msg="{message}"'
                    lines.append(f"{name}{{{labels}}} {value}")
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: StockExporter

    def do_GET(self) -> None:
        body = self.server.exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line a scrape on stderr says nothing


@contextlib.contextmanager
def stock_exporter() -> Iterator[int]:
    """The exposition served on 127.0.0.1, on a port the kernel picked; yields the port."""
    server = StockExporter(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@pytest.fixture
def prometheus_port(tmp_path: Path) -> Iterator[int]:
    """A real Prometheus scraping only the stock exporter, every second."""
    require_binary("prometheus")  # before anything else is set up: fail (CI) or skip at once
    with contextlib.ExitStack() as stack:
        exporter_port = stack.enter_context(stock_exporter())
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "dcgm-exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
            ],
        }
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # YAML is a superset of JSON
        yield stack.enter_context(running_prometheus(config_file, tmp_path))


# --- the dashboard's panels, each with what it shows on its face -------------------------------------


@dataclass(frozen=True)
class Panel:
    where: str  # id and title, for messages
    face: str  # what is on the dashboard's face about it: its row's title and its own
    description: str
    targets: tuple[tuple[str, str, str], ...]  # (refId, expr, legend)


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def dashboard_panels() -> list[Panel]:
    """Every panel that queries, with the title of the row above it (rows hold their panels when
    collapsed, and stand above them by position when not)."""
    panels: list[Panel] = []

    def add(panel: dict[str, Any], row: str) -> None:
        targets = tuple(
            (str(t["refId"]), str(t["expr"]), str(t.get("legendFormat", ""))) for t in panel["targets"]
        )
        panels.append(
            Panel(f"panel {panel['id']} {panel['title']!r}", f"{row} / {panel['title']}",
                  str(panel.get("description", "")), targets)
        )  # fmt: skip

    row = ""
    ordered = sorted(_dashboard()["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    for panel in ordered:
        if panel["type"] == "row":
            row = str(panel["title"])
            for inner in panel.get("panels", []):
                add(inner, row)
        else:
            add(panel, row)
    return panels


def _names(port: int) -> set[str]:
    """The names of every series Prometheus holds now."""
    result = api(port, "query", query='group by (__name__) ({__name__=~".+"})')["result"]
    return {series["metric"]["__name__"] for series in result}


def _needs_faultcast(face: str) -> bool:
    return NEEDS_SERVE in face or NEEDS_COLLECT in face


def _variables(port: int) -> dict[str, str]:
    """Grafana's variables as Grafana fills them on this Prometheus: each label_values(metric, label)
    query variable with what the API offers, or its All value when it offers nothing (a variable
    with includeAll and no options is All, in the variables of Grafana 9 and of its scenes since)."""
    variables = dict(GRAFANA_VARIABLES)
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = (
            part.strip() for part in variable["definition"].removeprefix("label_values(")[:-1].split(",")
        )
        offered: list[str] = api(port, f"label/{label}/values", **{"match[]": metric})
        assert offered == [], f"${variable['name']} offers {offered} on a stock dcgm-exporter"
        assert variable["includeAll"], f"${variable['name']} is empty, and has no All, on dcgm-exporter"
        variables[f"${variable['name']}"] = str(variable["allValue"])
    return variables


def test_the_dashboard_tells_which_panels_need_faultcast() -> None:
    """The marks the test reads are there: the service's rows, and the collector's own panels."""
    panels = dashboard_panels()
    serve = [p for p in panels if NEEDS_SERVE in p.face]
    collect = [p for p in panels if NEEDS_COLLECT in p.face]
    assert any("faultcast_failure_risk" in expr for p in serve for _, expr, _ in p.targets)
    assert any("faultcast_xid_events_total" in expr for p in collect for _, expr, _ in p.targets)
    # A faultcast_* series comes only from faultcast: a panel that reads nothing else says so.
    for panel in panels:
        names = set().union(*(metric_names(expr) for _, expr, _ in panel.targets)) - {"up"}
        if names and all(name.startswith("faultcast_") for name in names):
            assert _needs_faultcast(panel.face), f"{panel.where} reads only faultcast's metrics: {names}"
    description = _dashboard()["description"]
    assert NEEDS_SERVE in description
    assert NEEDS_COLLECT in description


def test_every_panel_shows_data_on_a_stock_dcgm_exporter_or_says_what_it_needs(prometheus_port: int) -> None:
    port = prometheus_port
    until(
        lambda: [t for t in api(port, "targets")["activeTargets"] if t["health"] == "up"],
        "the stock exporter to be up",
    )
    scraped = until(
        lambda: (found := _names(port)) >= set(DEFAULT_COUNTERS) and found,
        "every default counter to be scraped",
    )
    assert {name for name in scraped if name.startswith("faultcast_")} == set()

    variables = _variables(port)
    panels = dashboard_panels()
    assert len(panels) >= 30, "fewer dashboard panels than expected: is the dashboard read?"
    queries: dict[str, dict[str, tuple[str, str]]] = {}  # panel -> refId -> (query, legend)
    for panel in panels:
        for ref, expr, legend in panel.targets:
            for variable, value in variables.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
            queries.setdefault(panel.where, {})[ref] = (expr, legend)
    wrong: dict[str, str] = {}
    shown: set[str] = set()

    def settle() -> bool:
        # Rates need a few scrapes: ask again until every panel that should show data does.
        wrong.clear()
        shown.clear()
        for panel in panels:
            empty: dict[str, str] = {}
            blank: dict[str, str] = {}
            for ref, (expr, legend) in queries[panel.where].items():
                problem = _lacks(port, expr, legend)
                if problem == "no data":
                    empty[ref] = expr
                elif problem is not None:
                    blank[ref] = f"{problem}: {expr}"
            if len(empty) < len(panel.targets):
                shown.add(panel.where)
            if _needs_faultcast(panel.face):
                continue  # it says on its face what it needs: with or without data
            if blank:
                wrong[panel.where] = f"blanks in its legend: {blank}"
            elif len(empty) == len(panel.targets):
                wrong[panel.where] = f"shows nothing, and does not say it needs faultcast: {empty}"
            elif empty and not any(phrase in panel.description for phrase in NEEDS_IN_DESCRIPTION):
                wrong[panel.where] = f"lines without data, which its description does not explain: {empty}"
        return not wrong

    with contextlib.suppress(AssertionError):
        until(settle, "every panel that needs no faultcast part to show data", timeout=60)
    settle()  # once more outside `until`, which would take a failing query for one not ready yet
    assert wrong == {}, "panels empty, or blank, on a stock dcgm-exporter without saying what they need"

    # Not a dashboard of marks alone: the GPU panels say they need nothing more, and show data.
    unmarked = {p.where for p in panels if not _needs_faultcast(p.face)}
    assert len(unmarked) >= 4, unmarked
    assert unmarked <= shown

    # The Xid panel shows the code the exporter reported, on its GPU.
    (xid,) = [p for p in panels if any("DCGM_FI_DEV_XID_ERRORS" in expr for _, expr, _ in p.targets)]
    expr = xid.targets[0][1].replace("$node", variables["$node"])
    codes = {
        (r["metric"]["Hostname"], r["metric"]["gpu"]): float(r["value"][1])
        for r in api(port, "query", query=expr)["result"]
    }
    host, gpu = XID_GPU
    assert codes[(host, str(gpu))] == XID_CODE
    assert sorted(codes.values()) == [0.0] * (len(HOSTS) * GPUS - 1) + [XID_CODE]
