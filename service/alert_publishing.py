"""Telling the world what the alert book decided, once it is durable: a log line per event, the
listeners (the remediator, subscribers), and the metrics (each GPU's risk and likely mode, alerts
by mode and tier, silent nodes, failures, the thresholds served).

The book decides and stores; this module only says. Nothing here changes an alert.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from prometheus_client import Gauge

from faultcast.model.artifact import FaultModel
from faultcast.service.alert_events import mode_of
from faultcast.service.metrics import ALERT_TIERS, ServiceMetrics
from faultcast.service.scoring import ScoredStep
from faultcast.v1 import alerts_pb2 as apb

# The alert lines keep the logger name operators filter them by: the book's, as before the split.
log = logging.getLogger("faultcast.service.alert_book")

Listener = Callable[[Sequence[apb.Alert]], None]


class AlertPublisher:
    """The log, the listeners and the metrics of one alert book. `open_now`: the newest event of
    every open alert, read without the book's lock (a scrape must not wait while the scoring thread
    holds it, which it does for as long as the database refuses writes); `silent_count`: how many
    nodes are silent now."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        open_now: Callable[[], list[apb.Alert]],
        silent_count: Callable[[], int],
    ) -> None:
        self.metrics = metrics
        self._open_now = open_now
        self._listeners: list[Listener] = []
        # Each GPU's risk series (the gauge child) and the likely mode shown for it.
        self._risk_child: dict[tuple[str, int], Gauge] = {}
        self._mode_shown: dict[tuple[str, int], str] = {}
        metrics.silent_nodes.set_function(lambda: float(silent_count()))
        for name in ALERT_TIERS:
            tier = apb.AlertTier.Value(f"ALERT_TIER_{name.upper()}")
            metrics.alerts_by_tier.labels(name).set_function(functools.partial(self._open_at_tier, tier))

    def _open_at_tier(self, tier: int) -> float:
        """How many alerts stand at `tier` now (an alert of a service older than tiers counts as MOVE)."""
        return float(sum(1 for a in self._open_now() if (a.tier or apb.ALERT_TIER_MOVE) == tier))

    def use(self, model: FaultModel) -> None:
        """The thresholds of the model serving from now on."""
        self.metrics.alert_threshold.set(model.threshold)
        self.metrics.alert_protect_threshold.set(model.protect_threshold or 0.0)
        self.metrics.alert_hold_threshold.set(model.policy.hold(model.open_threshold))

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every batch of stored events, after they are durable."""
        self._listeners.append(listener)

    # -- events ---------------------------------------------------------------------------------

    def announce(self, stored: Sequence[apb.Alert]) -> None:
        """A log line for each stored event, then the listeners hear of them all."""
        for alert in stored:
            _log_event(alert)
        if stored:
            for listener in self._listeners:
                listener(stored)

    def count_open(self, alert: apb.Alert, by: int = 1) -> None:
        """An alert counted among (or, `by` -1, taken out of) the active alerts of its mode."""
        self.metrics.active_alerts.labels(mode_of(alert)).inc(by)

    def opened(self, alert: apb.Alert) -> None:
        """A new alert stored: counted as raised and as active."""
        self.metrics.alerts.labels(mode_of(alert)).inc()
        self.count_open(alert)

    def mode_changed(self, before: apb.Alert, after: apb.Alert) -> None:
        """An open alert's event changed its mode: it counts as active under the new one."""
        if mode_of(before) != mode_of(after):
            self.count_open(before, -1)
            self.count_open(after)

    def failures(self, stored: Sequence[apb.Alert]) -> None:
        """FAILED events stored: counted by evidence and by whether an alert foresaw them."""
        for event in stored:
            evidence = (
                apb.FailureEvidence.Name(event.failure.evidence).removeprefix("FAILURE_EVIDENCE_").lower()
            )
            foreseen = "true" if event.failure.foreseen_by else "false"
            self.metrics.count_failure(evidence, foreseen, event.node)

    # -- nodes ----------------------------------------------------------------------------------

    def silent(self, name: str, during: bool) -> None:
        """The node is silent (`during`: an alert was open when it fell silent; at start, as saved);
        its risk series go."""
        self.metrics.node_silent.labels(name, "true" if during else "false").set(1.0)
        for key in [k for k in self._risk_child if k[0] == name]:
            self._forget_risk(key)

    def fell_silent(self, name: str, limit_s: float, cleared: int) -> None:
        """The node fell silent just now, its `cleared` open alerts with it."""
        self.silent(name, cleared > 0)
        if cleared:
            log.error(
                "node %s fell silent (no sample for %.0f s) with %d alert(s) open: it may have failed; "
                "its alerts clear as 'node silent'",
                name,
                limit_s,
                cleared,
            )
        else:
            log.warning("node %s fell silent: no sample for %.0f s", name, limit_s)

    def heard_again(self, name: str) -> None:
        """A silent node sends again."""
        self.metrics.node_silent.remove(name, "true")
        self.metrics.node_silent.remove(name, "false")
        log.warning("node %s is sending samples again", name)

    def risk(self, s: ScoredStep, gpus: int) -> None:
        """Each present GPU's risk on its own series (node, gpu); the likely mode, where the scorer
        named one (rows near the threshold), on a series of its own so that a change of mode never
        breaks the risk series. A GPU that went dark loses both."""
        for gpu in range(gpus):
            key = (s.node, gpu)
            held = self._risk_child.get(key)
            if not s.present[gpu]:
                if held is not None:
                    self._forget_risk(key)
                continue
            if held is None:
                # The labelled child is kept: at 10,000 GPUs, looking it up by labels on every
                # score is a measurable share of the scoring thread.
                held = self.metrics.failure_risk.labels(s.node, str(gpu))
                self._risk_child[key] = held
            held.set(float(s.risk[gpu]))
            mode = s.mode[gpu] if s.mode[gpu] not in ("", "none") else None
            shown = self._mode_shown.get(key)
            if mode != shown:
                if shown is not None:
                    self.metrics.likely_mode.remove(s.node, str(gpu), shown)
                if mode is not None:
                    self.metrics.likely_mode.labels(s.node, str(gpu), mode).set(1.0)
                    self._mode_shown[key] = mode
                else:
                    self._mode_shown.pop(key, None)

    def _forget_risk(self, key: tuple[str, int]) -> None:
        node, gpu = key
        if self._risk_child.pop(key, None) is not None:
            self.metrics.failure_risk.remove(node, str(gpu))
        shown = self._mode_shown.pop(key, None)
        if shown is not None:
            self.metrics.likely_mode.remove(node, str(gpu), shown)


def _log_event(alert: apb.Alert) -> None:
    """The log line of an OPENED, UPDATED or FAILED event (a CLEARED event has none)."""
    mode = mode_of(alert)
    where = f"{alert.node} gpu {alert.gpu}" if alert.gpu >= 0 else f"{alert.node} (node)"
    if alert.kind == apb.EVENT_KIND_OPENED:
        log.warning(
            "alert %d: %s %s risk %.2f, failure expected in about %.0f min (%s)",
            alert.id,
            where,
            mode,
            alert.risk,
            alert.time_to_failure.p50_seconds / 60,
            apb.RecommendedAction.Name(alert.action),
        )
    elif alert.kind == apb.EVENT_KIND_UPDATED:
        log.warning(
            "alert %d (update of %d): %s now %s, risk %.2f, %s",
            alert.id,
            alert.opened_id,
            where,
            mode,
            alert.risk,
            apb.RecommendedAction.Name(alert.action),
        )
    elif alert.kind == apb.EVENT_KIND_FAILED:
        log.error(
            "alert %d: FAILED %s: %s (%s)%s",
            alert.id,
            where,
            alert.failure.detail,
            mode,
            f", foreseen by alert {', '.join(map(str, alert.failure.foreseen_by))}"
            if alert.failure.foreseen_by
            else ", not foreseen",
        )
