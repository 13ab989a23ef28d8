"""Every label value a labelled counter of the service can take is exported from the start (at 0),
so dashboards and rate() see a healthy system instead of "No data". The lists live in
faultcast.service.metrics; a scan of the service's source finds every value it passes to those
counters (directly, or through SampleRejected, AuthError, _reject, on_throttle and the blanking
counter) and fails when one is missing from the lists, or a listed one is never used."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultcast.service.alert_events import PB_TO_MODE
from faultcast.service.metrics import (
    ALERT_MODES,
    AUTH_DENIED_REASONS,
    BLANK_REASONS,
    MODEL_RELOAD_OUTCOMES,
    REJECT_REASONS,
    STATE_WRITES,
    THREADS,
    THROTTLED_WHAT,
    ServiceMetrics,
)
from faultcast.sim.modes import MODES

SERVICE = Path(__file__).resolve().parents[1] / "service"

# ServiceMetrics attribute -> the constant listing its label values.
LISTS: dict[str, tuple[str, ...]] = {
    "rejects": REJECT_REASONS,
    "blanked": BLANK_REASONS,
    "auth_denied": AUTH_DENIED_REASONS,
    "throttled": THROTTLED_WHAT,
    "model_reloads": MODEL_RELOAD_OUTCOMES,
    "thread_restarts": THREADS,
    "state_write_failures": STATE_WRITES,
}
# Callables that take a label value on the counter's behalf: name -> (counter, argument position).
CARRIERS: dict[str, tuple[str, int]] = {
    "SampleRejected": ("rejects", 0),
    "_reject": ("rejects", 0),
    "AuthError": ("auth_denied", 1),
    "on_throttle": ("throttled", 0),
    "_throttled": ("throttled", 0),
    "checked_write": ("state_write_failures", 0),  # StateDatabase.checked_write("jobs", ...)
    "checked_write_locked": ("state_write_failures", 0),
    "start_supervised": ("thread_restarts", 0),
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def label_values_in(source: str) -> dict[str, set[str]]:
    """Label values written as string literals in `source`, by ServiceMetrics attribute."""
    found: dict[str, set[str]] = defaultdict(set)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            # metrics.rejects.labels("scoring_error"), labels(reason="...")
            if isinstance(func, ast.Attribute) and func.attr == "labels" and _name(func.value) in LISTS:
                args = [*node.args, *(k.value for k in node.keywords)]
                value = _literal(args[0]) if args else None
                if value is not None:
                    found[_name(func.value)].add(value)
            carrier = CARRIERS.get(_name(func))
            if carrier is not None and len(node.args) > carrier[1]:
                value = _literal(node.args[carrier[1]])
                if value is not None:
                    found[carrier[0]].add(value)
        # validation.py counts blanked values as issues["negative_counter"] += 1
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript):
            if _name(node.target.value) == "issues":
                value = _literal(node.target.slice)
                if value is not None:
                    found["blanked"].add(value)
        # telemetry.py names a refusal before counting it: reason, message = "no_sequence", "..."
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs: list[tuple[ast.expr, ast.expr]] = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for name, value_node in pairs:
                    value = _literal(value_node)
                    if _name(name) == "reason" and value:
                        found["rejects"].add(value)
    return found


def _service_label_values() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(SERVICE.rglob("*.py")):
        for metric, values in label_values_in(path.read_text()).items():
            found[metric] |= values
    return found


def test_the_scan_finds_every_way_a_value_is_passed() -> None:
    """The scanner itself: each pattern the service uses, and nothing from variables or other calls."""
    source = """
metrics.rejects.labels("a").inc()
self.metrics.blanked.labels(reason="b").inc(2)
raise SampleRejected("c", "message")
raise AuthError(grpc.StatusCode.PERMISSION_DENIED, "d", "message")
self._reject("e")
gate.on_throttle("f")
self._throttled("g")
issues["h"] += 1
reason, message = "i", "text"
reason = "j"
self.metrics.model_reloads.labels("k").inc()
self._db.checked_write("l", lambda db: db.execute("..."))
db.checked_write_locked("l", lambda db: db.execute("..."))
start_supervised("m", self._loop, self.stopping, self._restarted)
metrics.rejects.labels(variable).inc()
log.warning("not a label %s", "x")
other.labels("y")
"""
    assert label_values_in(source) == {
        "rejects": {"a", "c", "e", "i", "j"},
        "blanked": {"b", "h"},
        "auth_denied": {"d"},
        "throttled": {"f", "g"},
        "model_reloads": {"k"},
        "state_write_failures": {"l"},
        "thread_restarts": {"m"},
    }


def test_every_label_value_the_service_passes_is_listed_and_every_listed_one_is_used() -> None:
    found = _service_label_values()
    for metric, listed in LISTS.items():
        assert found[metric], f"the scan found no {metric} value at all: has the source changed shape?"
        missing = found[metric] - set(listed)
        assert missing == set(), f"{metric}: add {sorted(missing)} to its list in service/metrics.py"
        unused = set(listed) - found[metric]
        assert unused == set(), f"{metric}: {sorted(unused)} listed but never passed by the service"
    assert len(set(REJECT_REASONS)) == len(REJECT_REASONS)


def test_alert_modes_are_the_failure_modes_and_unknown() -> None:
    assert set(ALERT_MODES) == {m.name for m in MODES} | {"unknown"}
    # Every mode an alert can carry (and the fallback the service counts it under) has its series.
    assert set(PB_TO_MODE.values()) <= set(ALERT_MODES)


def test_a_fresh_service_exports_every_listed_series_at_zero() -> None:
    metrics = ServiceMetrics()
    exposed: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created") and len(sample.labels) == 1:
                (value,) = sample.labels.values()
                exposed[sample.name][value] = sample.value
    expected = {
        "faultcast_ingest_rejects_total": REJECT_REASONS,
        "faultcast_ingest_values_blanked_total": BLANK_REASONS,
        "faultcast_auth_denied_total": AUTH_DENIED_REASONS,
        "faultcast_throttled_total": THROTTLED_WHAT,
        "faultcast_alerts_total": ALERT_MODES,
        "faultcast_active_alerts": ALERT_MODES,
        "faultcast_model_reloads_total": MODEL_RELOAD_OUTCOMES,
    }
    for name, values in expected.items():
        assert exposed[name] == dict.fromkeys(values, 0.0), name
