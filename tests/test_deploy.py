"""The shipped Prometheus rules and Grafana dashboard: real promtool checks them, and they name only
metrics that something exports (the service's EXPORTED_NAMES, the collector's catalogue, `up`)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

# PyYAML comes with the dev extra (dask depends on it); its stubs are not installed.
import yaml  # type: ignore[import-untyped]
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultcast.catalogue import METRICS
from faultcast.service.metrics import EXPORTED_NAMES, REJECT_REASONS, ServiceMetrics
from faultcast.testing.system import require_binary

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "faultcast-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "faultcast-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "faultcast-dashboard.json"
METRICS_PAGE = ROOT / "docs" / "metrics.md"

# Series Prometheus itself makes: `up` for every target, ALERTS for every pending or firing alert
# (the risk rule reads its own to hold a firing alert, as the service holds its alert).
BUILTIN_NAMES = frozenset({"up", "ALERTS"})

# --- metric names in a PromQL expression -------------------------------------------------------------

_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")
_GRAFANA_VARIABLE = re.compile(r"\$(?:\{\w+(?::\w+)?\}|\w+)")
_LABEL_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
# by/without/on/ignoring/group_left/group_right with their list of label names.
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
# Grafana's label_values(metric, label): the second argument is a label name.
_LABEL_VALUES = re.compile(r"\blabel_values\s*\(\s*([^,()]*?)\s*,\s*\w+\s*\)")
# A whole identifier, not part of a number (1e3, 0x1f) or of a longer name, and not a call (rate(...)).
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "group_left", "group_right", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana variable query) selects."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    text = _LABEL_MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _LABEL_VALUES.sub(r"(\1)", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}


def test_name_extraction_keeps_metrics_and_skips_functions_labels_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, job) (rate(a_seconds_bucket{le!="+Inf", job=~"f{2}"}[5m] '
        "offset 1m))) > 1e-3 and on (job) group_left (instance) up == bool 0x1F or vector(0) "
        "unless sum(rate(b_total{reason='x y'}[$__rate_interval])) without (mode) * Inf "
        '> 1 or record:name:rate5m{node=~"$node"}'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "up", "b_total", "record:name:rate5m"}
    assert metric_names("label_values(faultcast_failure_risk, node)") == {"faultcast_failure_risk"}
    assert metric_names('label_values(up{job="faultcast"}, instance)') == {"up"}


# --- the files ---------------------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        rules.extend(group["rules"])
    return rules


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, with those inside (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _targets() -> dict[str, dict[str, Any]]:
    """Every panel target by where it is (panel id, title, refId)."""
    return {
        f"panel {panel['id']} {panel['title']!r} {target['refId']}": target
        for panel in _panels(_dashboard()["panels"])
        for target in panel.get("targets", [])
    }


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable."""
    exprs = [(where, str(target["expr"])) for where, target in _targets().items()]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append((f"variable {variable['name']}", str(variable["definition"])))
    return exprs


def _collector_names() -> set[str]:
    """Prometheus names of the collector's metrics, as docs/metrics.md lists them."""
    page = METRICS_PAGE.read_text()
    return {m.prometheus_name for m in METRICS if f"`{m.prometheus_name}" in page}


# --- promtool ----------------------------------------------------------------------------------------


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run([promtool, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_promtool_accepts_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_unit_tests_both_firing_and_not() -> None:
    alerts = {str(rule["alert"]) for rule in _rules() if "alert" in rule}
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(str(check["alertname"]))
    assert alerts - firing == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown not firing"
    assert (firing | quiet) - alerts == set(), "tests for alerts the rules do not define"


def test_the_risk_rule_follows_the_served_threshold_not_a_constant() -> None:
    """A constant copied from one model (0.5 once, while the model served 0.098) never fires for
    another; the rule reads faultcast_alert_threshold, and nothing compares risk with a number."""
    (rule,) = [r for r in _rules() if r.get("alert") == "FaultcastGpuFailureRiskHigh"]
    expr = " ".join(str(rule["expr"]).split())
    assert "faultcast_failure_risk >= on (job, instance) group_left faultcast_alert_threshold" in expr
    assert not re.search(r"faultcast_failure_risk\s*(?:>=?|<=?|==)\s*[0-9.]", expr), expr
    # The likely mode stays out of the labels: a label that changes would restart `for:`.
    assert "faultcast_failure_likely_mode" not in expr


def test_the_rejects_rule_advises_on_every_reason_the_service_counts() -> None:
    (rule,) = [r for r in _rules() if r.get("alert") == "FaultcastIngestRejects"]
    description = str(rule["annotations"]["description"])
    unadvised = {reason for reason in REJECT_REASONS if f'"{reason}"' not in description}
    assert unadvised == set(), "reasons FaultcastIngestRejects gives no advice for"


def test_every_alert_has_a_severity_summary_and_description() -> None:
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def panel_queries(variables: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Every panel query and its legend by where it is, with Grafana's variables filled in as
    `variables` says."""
    queries = {}
    for where, target in _targets().items():
        expr = str(target["expr"])
        for variable, value in variables.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
        queries[where] = (expr, str(target.get("legendFormat", "")))
    return queries


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables filled in, is valid PromQL (as a recording rule)."""
    values = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$node": ".*"}
    rules = [
        {"record": f"dashboard:query_{index}", "expr": expr}
        for index, (expr, _) in enumerate(panel_queries(values).values())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# --- metric names ------------------------------------------------------------------------------------


def test_the_rules_use_only_service_metrics() -> None:
    recorded = {str(rule["record"]) for rule in _rules() if "record" in rule}
    used: dict[str, set[str]] = {}
    for rule in _rules():
        used[str(rule.get("alert") or rule.get("record"))] = metric_names(str(rule["expr"]))
    assert {"faultcast_failure_risk", "faultcast_alert_threshold", "faultcast_alert_hold_threshold"} <= used[
        "FaultcastGpuFailureRiskHigh"
    ]
    assert "faultcast_scoring_latency_seconds_bucket" in used["FaultcastScoringSlow"]
    assert "faultcast_node_silent" in used["FaultcastNodeSilent"]
    assert "faultcast_node_silent" in used["FaultcastNodeSilentDuringIncident"]
    assert "faultcast_ingest_clock_ahead_seconds" in used["FaultcastNodeClockAhead"]
    known = set(EXPORTED_NAMES) | BUILTIN_NAMES | recorded
    unknown = {name: names - known for name, names in used.items() if names - known}
    assert unknown == {}


def test_the_dashboard_uses_only_exported_metrics() -> None:
    used = {where: metric_names(expr) for where, expr in dashboard_exprs()}
    everything = set().union(*used.values())
    assert "faultcast_failure_risk" in everything
    assert "DCGM_FI_DEV_GPU_TEMP" in everything
    known = set(EXPORTED_NAMES) | _collector_names() | BUILTIN_NAMES
    unknown = {where: names - known for where, names in used.items() if names - known}
    assert unknown == {}


def test_exported_names_match_what_the_service_exposes() -> None:
    metrics = ServiceMetrics()
    # Labelled metrics expose no sample until a child exists. Those with a known set of values
    # (reasons, modes, outcomes) start every child at construction; these are per node, GPU or
    # actuator, and come with their first value.
    metrics.failure_risk.labels(node="node-a", gpu="0").set(0.1)
    metrics.ingest_lag.labels(node="node-a").set(0.5)
    metrics.clock_ahead.labels(node="node-a").set(0.0)
    metrics.likely_mode.labels(node="node-a", gpu="0", mode="hbm_wear").set(1)
    metrics.node_silent.labels(node="node-b", during_incident="false").set(1)
    metrics.remediations.labels(actuator="noop", outcome="ok").inc()
    metrics.model_info.info({"version": "test"})
    metrics.feature_drift_psi.labels(group="thermal").set(0.05)  # only with a model's reference.json

    families = list(text_string_to_metric_families(generate_latest(metrics.registry).decode()))
    untouched = {family.name for family in families if not family.samples}
    assert untouched == set(), "labelled metrics this test does not touch yet: add a .labels(...) call"
    samples = {
        sample.name
        for family in families
        for sample in family.samples
        if sample.name.startswith("faultcast_") and not sample.name.endswith("_created")
    }
    assert set(EXPORTED_NAMES) - samples == set(), "EXPORTED_NAMES lists names the service does not expose"
    assert samples - set(EXPORTED_NAMES) == set(), "the service exposes names EXPORTED_NAMES lacks"
    assert len(EXPORTED_NAMES) == len(set(EXPORTED_NAMES))


# --- the dashboard -----------------------------------------------------------------------------------


def test_the_dashboard_is_well_formed() -> None:
    dashboard = _dashboard()
    panels = list(_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert dashboard["uid"]
    assert dashboard["schemaVersion"] >= 36
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["definition"] == "label_values(faultcast_failure_risk, node)"
    for panel in panels:
        position = panel["gridPos"]
        assert position["x"] >= 0, panel["title"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_dashboard_shows_every_service_metric() -> None:
    """Silent nodes, clocks, retries, refusals, throttling and the backlog had no panel once."""
    used = set().union(*(metric_names(expr) for _, expr in dashboard_exprs()))
    assert set(EXPORTED_NAMES) - used == set(), "service metrics no dashboard panel shows"


@pytest.mark.parametrize("needle", ["faultcast_failure_risk", "faultcast_scoring_latency_seconds_bucket"])
def test_the_dashboard_shows_the_key_service_metrics(needle: str) -> None:
    assert any(needle in expr for _, expr in dashboard_exprs())
