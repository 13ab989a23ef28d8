"""Scored steps in, alert events out: the model's alert policy per GPU, one open alert per GPU (per
node for node-level modes), each OPEN event carrying the failure mode, the risk, the estimated time
to failure, the top contributing features and a recommended action; CLEARED events when the risk
stays low, the GPU goes dark or the horizon passes. Events go to the durable log first, then to
whoever listens (the remediator, metrics).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import Gauge

from faultcast.model.alerting import AlertTracker
from faultcast.model.artifact import FaultModel
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.scoring import ScoredStep, model_version
from faultcast.service.state import StateStore
from faultcast.sim.modes import BY_NAME, Level
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

MODE_TO_PB: dict[str, apb.FailureMode.ValueType] = {
    "hbm_wear": apb.FAILURE_MODE_HBM_WEAR,
    "cooling": apb.FAILURE_MODE_COOLING,
    "power": apb.FAILURE_MODE_POWER,
    "nvlink": apb.FAILURE_MODE_NVLINK,
    "pcie": apb.FAILURE_MODE_PCIE,
    "infiniband": apb.FAILURE_MODE_NETWORK,
    "detachment": apb.FAILURE_MODE_DETACHMENT,
    "firmware": apb.FAILURE_MODE_FIRMWARE,
}
PB_TO_MODE = {v: k for k, v in MODE_TO_PB.items()}
_CLOSE_REASONS = ("risk below threshold", "horizon passed", "gpu dark")


# Stronger actions rank higher: an open alert is updated when its recommended action escalates.
_ACTION_RANK = {
    apb.RECOMMENDED_ACTION_WATCH: 1,
    apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY: 2,
    apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE: 3,
}


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """Which action an alert recommends. Every alert is above the model's threshold, which meets
    the false-alarm budget. Snapshot and migrate when the failure looks near (median time to failure
    within `migrate_within_s`) or likely (`migrate_risk`); before that, snapshot only: a checkpoint
    is cheap and bounds what a failure can cost, while draining waits for more certainty. Watch when
    the most likely mode has no precursors (a firmware fault): no snapshot schedule can be aimed
    at it. An open alert escalates (an OPEN update event) when later scores call for more."""

    migrate_within_s: float = 1200.0
    migrate_risk: float = 0.3

    def action(self, mode: str, risk: float, ttf_s: float) -> apb.RecommendedAction.ValueType:
        spec = BY_NAME.get(mode)
        if spec is None or not spec.predictable:
            return apb.RECOMMENDED_ACTION_WATCH
        if ttf_s <= self.migrate_within_s or risk >= self.migrate_risk:
            return apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
        return apb.RECOMMENDED_ACTION_SNAPSHOT_ONLY


Listener = Callable[[Sequence[apb.Alert]], None]


class AlertBook:
    def __init__(
        self,
        model: FaultModel,
        store: StateStore,
        metrics: ServiceMetrics,
        *,
        actions: ActionPolicy = ActionPolicy(),
        top_features: int = 5,
    ) -> None:
        self.store, self.metrics, self.actions, self.top_features = store, metrics, actions, top_features
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._slots: dict[str, int] = {}  # node -> its first slot
        # Each GPU's risk series (the gauge child) and the likely mode shown for it.
        self._risk_child: dict[tuple[str, int], Gauge] = {}
        self._mode_shown: dict[tuple[str, int], str] = {}
        self._open: dict[int, apb.Alert] = {}  # slot -> the OPEN event it belongs to
        self._node_open: dict[str, tuple[apb.Alert, set[int]]] = {}  # node-level alert, its slots
        self._restored = {(a.node, a.gpu): a for a in store.open_alerts()}
        self._use(model)
        for alert in self._restored.values():
            self.metrics.active_alerts.labels(PB_TO_MODE.get(alert.mode, "unknown")).inc()

    def _use(self, model: FaultModel) -> None:
        self.model = model
        self.version = model_version(model)
        self.g = model.feature_config.gpus_per_node
        self.tracker = AlertTracker(model.policy, model.feature_config.cadence_s, model.threshold)

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def active(self) -> list[apb.Alert]:
        with self._lock:
            seen = {a.id: a for a in self._open.values()}
            seen.update({a.id: a for a, _ in self._node_open.values()})
            seen.update({a.id: a for a in self._restored.values()})
            return sorted(seen.values(), key=lambda a: a.id)

    def swap_model(self, model: FaultModel, carried_over: bool) -> None:
        """A new model serves from now on. Its threshold and policy apply at once; open alerts stay
        open and are tracked by the new model (or, when the features restarted, clear as their GPUs
        are scored again)."""
        with self._lock:
            old = self.tracker
            self._use(model)
            n = len(old.opened)
            self.tracker._grow(n)
            if carried_over:
                self.tracker.opened[:n] = old.opened
                self.tracker.above_run[:n], self.tracker.below_run[:n] = old.above_run, old.below_run
            else:
                # Opened at step 0: each open alert expires (CLEARED, "horizon passed") the next time
                # its GPU is scored, and the new model raises it again if it agrees.
                self.tracker.opened[list(self._open)] = 0
                for _, slots in self._node_open.values():
                    self.tracker.opened[list(slots)] = 0

    def _slot_base(self, node: str, step: int) -> int:
        base = self._slots.get(node)
        if base is None:
            base = len(self._slots) * self.g
            self._slots[node] = base
            self.tracker._grow(base + self.g)
            for gpu in range(-1, self.g):
                restored = self._restored.pop((node, gpu), None)
                if restored is None:
                    continue
                opened = int(restored.time_unix_nano // int(self.model.feature_config.cadence_s * 1e9))
                slots = range(base, base + self.g) if gpu < 0 else [base + gpu]
                self.tracker.opened[list(slots)] = min(opened, step)
                if gpu < 0:
                    self._node_open[node] = (restored, set(slots))
                else:
                    self._open[base + gpu] = restored
        return base

    def observe(self, scored: Sequence[ScoredStep]) -> list[apb.Alert]:
        """Run the policy over scored steps (oldest first); returns the stored events."""
        stored: list[apb.Alert] = []
        with self._lock:
            for s in scored:
                base = self._slot_base(s.node, s.step)
                new, closed, reasons = self.tracker.update(
                    s.step, np.arange(base, base + self.g), s.risk, s.present
                )
                self._publish_risk(s)
                events: list[apb.Alert] = []
                for slot, reason in zip(closed.tolist(), reasons.tolist(), strict=True):
                    events.extend(self._close(s, slot, _CLOSE_REASONS[reason]))
                opening = self._open_alerts(s, [slot - base for slot in new.tolist()])
                events.extend(self._escalations(s, base, set(new.tolist())))
                if not events and not opening:
                    continue
                # Stored (and so numbered) before anything else sees them.
                saved = self.store.append(events + [alert for alert, _ in opening])
                self._rebind(saved[: len(events)])
                for (_, slots), alert in zip(opening, saved[len(events) :], strict=True):
                    if alert.gpu < 0:
                        self._node_open[s.node] = (alert, slots)
                    else:
                        self._open[base + alert.gpu] = alert
                stored.extend(saved)
        for alert in stored:
            mode = PB_TO_MODE.get(alert.mode, "unknown")
            if alert.state == apb.ALERT_STATE_OPEN and alert.opened_id != alert.id:
                log.warning("alert %d (update of %d): %s now %s", alert.id, alert.opened_id, alert.node,
                            apb.RecommendedAction.Name(alert.action))  # fmt: skip
            elif alert.state == apb.ALERT_STATE_OPEN:
                self.metrics.alerts.labels(mode).inc()
                self.metrics.active_alerts.labels(mode).inc()
                log.warning(
                    "alert %d: %s gpu %d %s risk %.2f, failure expected in about %.0f min",
                    alert.id, alert.node, alert.gpu, mode, alert.risk, alert.time_to_failure_seconds / 60,
                )  # fmt: skip
            else:
                self.metrics.active_alerts.labels(mode).dec()
        if stored:
            for listener in self._listeners:
                listener(stored)
        return stored

    def _escalations(self, s: ScoredStep, base: int, just_opened: set[int]) -> list[apb.Alert]:
        """OPEN update events for open alerts of this node whose recommended action escalates."""
        out = []
        candidates = [(base + g, self._open.get(base + g)) for g in range(self.g)]
        node_alert = self._node_open.get(s.node)
        if node_alert is not None:
            candidates += [(slot, node_alert[0]) for slot in sorted(node_alert[1])]
        updated: set[int] = set()
        for slot, alert in candidates:
            gpu = slot - base
            if alert is None or slot in just_opened or alert.opened_id in updated or not s.present[gpu]:
                continue
            risk, ttf = float(s.risk[gpu]), float(s.ttf_s[gpu])
            if risk < self.model.threshold:
                continue  # only a score that would raise an alert may escalate one
            action = self.actions.action(PB_TO_MODE.get(alert.mode, "unknown"), risk, ttf)
            if _ACTION_RANK[action] <= _ACTION_RANK.get(alert.action, 0):
                continue
            update = apb.Alert()
            update.CopyFrom(alert)
            update.id = 0
            update.risk, update.time_to_failure_seconds, update.action = risk, ttf, action
            update.time_unix_nano = int(s.time_s * 1e9)
            out.append(update)
            updated.add(alert.opened_id)
        return out

    def _rebind(self, saved: list[apb.Alert]) -> None:
        """Open alerts that got an update event are tracked by it from now on."""
        for update in saved:
            if update.state != apb.ALERT_STATE_OPEN:
                continue
            for slot, alert in list(self._open.items()):
                if alert.opened_id == update.opened_id:
                    self._open[slot] = update
            for node, (alert, slots) in list(self._node_open.items()):
                if alert.opened_id == update.opened_id:
                    self._node_open[node] = (update, slots)

    def _publish_risk(self, s: ScoredStep) -> None:
        """Each present GPU's risk on its own series (node, gpu); the likely mode, where the scorer
        named one (rows near the threshold), on a series of its own so that a change of mode never
        breaks the risk series. A GPU that went dark loses both."""
        for gpu in range(self.g):
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

    def _close(self, s: ScoredStep, slot: int, reason: str) -> list[apb.Alert]:
        alert = self._open.pop(slot, None)
        if alert is not None:
            return [self._cleared(alert, s, reason)]
        node_alert = self._node_open.get(s.node)
        if node_alert is not None and slot in node_alert[1]:
            node_alert[1].discard(slot)
            if not node_alert[1]:
                del self._node_open[s.node]
                return [self._cleared(node_alert[0], s, reason)]
        return []

    def _cleared(self, alert: apb.Alert, s: ScoredStep, reason: str) -> apb.Alert:
        return apb.Alert(
            node=alert.node, gpu=alert.gpu, gpu_uuid=alert.gpu_uuid, mode=alert.mode,
            risk=float(np.nanmax(s.risk)) if alert.gpu < 0 and s.present.any()
            else float(s.risk[alert.gpu]) if alert.gpu >= 0 and s.present[alert.gpu] else 0.0,
            state=apb.ALERT_STATE_CLEARED, time_unix_nano=int(s.time_s * 1e9), model_version=self.version,
            opened_id=alert.opened_id, cleared_reason=reason,
        )  # fmt: skip

    def _open_alerts(self, s: ScoredStep, gpus: list[int]) -> list[tuple[apb.Alert, set[int]]]:
        """OPEN events for the GPUs whose policy opened, with the slots each covers; a node-level
        mode makes one alert for the node (the GPUs that join later join it)."""
        if not gpus:
            return []
        contributions = self.model.contributions(s.features[gpus], top=self.top_features)
        base = self._slots[s.node]
        out: list[tuple[apb.Alert, set[int]]] = []
        for gpu, top in zip(gpus, contributions, strict=True):
            mode = s.mode[gpu] or "unknown"
            spec = BY_NAME.get(mode)
            node_level = spec is not None and spec.level is Level.NODE
            if node_level:
                joined = self._node_open.get(s.node) or next(((a, sl) for a, sl in out if a.gpu < 0), None)
                if joined is not None:
                    joined[1].add(base + gpu)
                    continue
            risk, ttf = float(s.risk[gpu]), float(s.ttf_s[gpu])
            alert = apb.Alert(
                node=s.node, gpu=-1 if node_level else gpu, gpu_uuid="" if node_level else s.uuids[gpu],
                mode=MODE_TO_PB.get(mode, apb.FAILURE_MODE_UNSPECIFIED), risk=risk, time_to_failure_seconds=ttf,
                top_features=[apb.FeatureContribution(feature=n, value=v, contribution=c) for n, v, c in top],
                action=self.actions.action(mode, risk, ttf), state=apb.ALERT_STATE_OPEN,
                time_unix_nano=int(s.time_s * 1e9), model_version=self.version,
            )  # fmt: skip
            out.append((alert, {base + gpu}))
        return out
