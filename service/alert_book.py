"""Scored steps in, alert events out, through the model's alert state machine (model/incidents.py,
the same one every offline figure runs): the incident tracking of the service.

One incident is one alert: an OPENED event (its id is the alert's opened_id) when the risk of a GPU
has reached the threshold for `k` scores; UPDATED events (same opened_id) when the likely mode
changes (held for `k` scores), the recommended action escalates, or the failure looks nearer (its
median time to failure enters a nearer 5/15/30-minute band); one CLEARED event when the risk has
stayed under the hold level, the GPUs went dark, or the node fell silent. What an event says is
built by service/alert_events.py, from the content the scorer's heads gave (computed once).

A node that sent samples and then sends none for `silent_after_steps` model steps by the service's
clock, while other nodes do, is silent: its open alerts clear (NODE_SILENT; the silence may be the
predicted failure itself, which the log, the CLEARED event's text and
`faultcast_node_silent{during_incident="true"}` say), its risk series are removed, and it is
counted, across restarts, until it speaks again. Any sample taken counts as speaking, not only one
that completes a step: a node sending many samples a step, or replaying its spool slowly, is never
silent while it sends, so its alerts do not depend on how fast its samples come. A node whose
samples come late (a clock behind, a spool replaying) is not silent; and when every node goes quiet
at once it is the service that is cut off, so none is marked silent (FaultcastIngestStalled says so
instead). A node whose collector stream broke and did not come back (its NODE_SILENT FAILED event,
service/failure_watch.py) is silent at once, whether or not other nodes are heard: a node alone in its
fleet, or one of a fleet gone quiet, has its foreseeing alerts cleared the same way, after the FAILED
event that names them.

Events go to the durable log first, then to whoever listens (service/alert_publishing.py: the log
lines, the remediator and subscribers, the metrics).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from faultcast.actions import Action
from faultcast.failure_signs import Evidence, FailureSign
from faultcast.model.alert_content import DEFAULT_ACTIONS, ActionPolicy
from faultcast.model.artifact import FaultModel
from faultcast.model.incidents import CloseReason, Incident, IncidentTracker
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.service.alert_events import EventWriter, mode_of
from faultcast.service.alert_publishing import AlertPublisher, Listener
from faultcast.service.failure_events import TrainerReport, failure_event
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.scoring import ScoredStep
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb

__all__ = [
    "AlertBook",
    "BookNodeState",
    "Listener",
    "SavedIncident",
]

log = logging.getLogger(__name__)

_SILENT_SETTING = "silent_nodes"  # the silent nodes, kept in the state store across restarts
# While the state database refuses alert events (a full disk), the scoring thread holds them and
# tries again, waiting this long at first and doubling up to the most.
_STORE_RETRY_S = (0.1, 5.0)

Clock = Callable[[], float]


@dataclass
class _Open:
    """An open alert: the newest event published for it, and a likely mode waiting to be confirmed."""

    latest: apb.Alert
    band: int  # the band of the scorer's median time to failure when the alert last spoke
    candidate: str = ""
    candidate_scores: int = 0


@dataclass
class SavedIncident:
    """An open alert of a node as saved: its incident (GPUs as indices within the node) and what the
    book keeps of it."""

    gpu: int
    opened_step: int
    mode: str
    gpus: list[int]
    gpus_at_open: list[int]
    latest: bytes  # the newest event published for it (an apb.Alert)
    band: int
    candidate: str
    candidate_scores: int


@dataclass
class BookNodeState:
    """A node's alert state: each GPU's runs (the tracker's rows: above, below, dark, open), its open
    alerts, and the event time of its newest scored step."""

    runs: np.ndarray
    incidents: list[SavedIncident]
    heard_event_s: float


@dataclass
class _Heard:
    """When a node was last heard of: the event time of its newest scored step and the service's
    clock when that step arrived."""

    event_s: float
    clock_s: float


class AlertBook:
    """Scored steps in, alert events out: runs the model's alert state machine per GPU, stores
    every event in the alert log before anyone hears of it (its `publisher` tells them), and marks
    silent nodes. Thread-safe."""

    def __init__(
        self,
        model: FaultModel,
        store: StateStore,
        metrics: ServiceMetrics,
        *,
        actions: ActionPolicy = DEFAULT_ACTIONS,
        top_features: int = 5,
        silent_after_steps: int = 5,
        clock: Clock = time.monotonic,
        stopping: threading.Event | None = None,
    ) -> None:
        """`silent_after_steps`: model steps without a sample after which a node is silent; `clock`:
        the service's clock (seconds), which times the silence; `stopping`: set when the service
        stops, which ends the wait for a state database that refuses writes."""
        self.store, self.metrics, self.actions, self.top_features = store, metrics, actions, top_features
        self.silent_after_steps, self.clock = silent_after_steps, clock
        self.stopping = stopping or threading.Event()
        self._silent_unsaved = False  # the silent nodes changed and could not be stored yet
        self._lock = threading.Lock()
        self._nodes: dict[str, int] = {}  # node name -> tracker node number
        self._names: list[str] = []
        self._alerts: dict[int, _Open] = {}  # incident key -> its alert
        self._heard: dict[str, _Heard] = {}
        # Per node, events stored before a restart that the replay from its saved state derives
        # again (`expect`): matched, not stored twice.
        self._expected: dict[str, deque[apb.Alert]] = {}
        self._quiet: dict[str, float] = {}  # node -> steps up to this event time are not judged again
        # node -> (event time, alerts of the log to take back before its first step after that time)
        self._deferred: dict[str, tuple[float, list[apb.Alert]]] = {}
        # Each node's newest sample that moved its event time on, and when it was taken (the
        # service's clock), set by ingest without the lock (one dict store): a node sending is never
        # silent, however many samples its steps hold; one whose clock is stuck is.
        self._arrived: dict[str, tuple[float, float]] = {}
        self._silent: dict[str, bool] = {}  # silent node -> whether an alert was open when it fell silent
        # Alerts a previous run left open, by node, until the node is scored (or falls silent).
        self._restored: dict[str, list[apb.Alert]] = {}
        self.publisher = AlertPublisher(metrics, self._open_unlocked, lambda: len(self._silent))
        self._use(model)
        started = self.clock()
        for alert in store.alerts.open_now():
            self._restored.setdefault(alert.node, []).append(alert)
            self.publisher.count_open(alert)
            # Not heard since this start: silent if it stays quiet for the limit while others speak.
            self._heard.setdefault(alert.node, _Heard(-math.inf, started))
        self._orphans: list[apb.Alert] = []  # restored alerts none of whose GPUs is free: they clear
        for name, during in json.loads(store.settings.get(_SILENT_SETTING) or "{}").items():
            self._silent[str(name)] = bool(during)
            self.publisher.silent(str(name), bool(during))

    def _open_unlocked(self) -> list[apb.Alert]:
        """The newest event of every open alert, without the book's lock (for the metrics' scrape:
        copying a dict's values is one step under the GIL)."""
        latest = [a.latest for a in list(self._alerts.values())]
        return latest + [a for alerts in list(self._restored.values()) for a in list(alerts)]

    def _use(self, model: FaultModel) -> None:
        self.model = model
        self.events = EventWriter(model, self.actions, self.top_features)
        self.g = model.feature_config.gpus_per_node
        self.cadence_s = model.feature_config.cadence_s
        # Alerts open at the protect tier's threshold when there is one (and hold at its hold level).
        self.tracker = IncidentTracker(model.policy, [model.open_threshold], self.g, NODE_LEVEL_MODES)
        self.publisher.use(model)

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every batch of stored events, after they are durable."""
        self.publisher.listen(listener)

    def active(self) -> list[apb.Alert]:
        """The newest event of every open alert, oldest alert first."""
        with self._lock:
            seen = {a.latest.opened_id: a.latest for a in self._alerts.values()}
            for alerts in self._restored.values():
                seen.update({a.opened_id: a for a in alerts})
            return [seen[k] for k in sorted(seen)]

    def swap_model(self, model: FaultModel, carried_over: bool) -> None:
        """A new model serves from now on; its threshold and policy apply at once. Open alerts stay
        open and are tracked by the new model: with the same features their runs carry over, else
        they restart, and the new model's scores decide whether each holds."""
        with self._lock:
            old = self.tracker
            self._use(model)
            if carried_over:
                self.tracker.carry_over(old)
                return
            for incident in old.open_incidents():
                slots = sorted(incident.slots)
                moved = self.tracker.restore(
                    incident.node, incident.gpu, slots, incident.opened_step, incident.mode
                )
                if moved is not None and incident.key in self._alerts:  # the old tracker's slots are disjoint
                    self._alerts[moved.key] = self._alerts.pop(incident.key)

    # -- saved state ----------------------------------------------------------------------------

    def node_state(self, name: str) -> BookNodeState | None:
        """The node's alert state, to save (None while it has none of its own: never scored since
        the start)."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return None
            base = node * self.g
            slots = list(range(base, base + self.g))
            held = {i.key: i for slot in slots if (i := self.tracker.by_slot[0].get(slot)) is not None}
            saved = []
            for key in sorted(held):
                incident, alert = held[key], self._alerts.get(key)
                if alert is None:
                    continue
                saved.append(
                    SavedIncident(
                        incident.gpu,
                        incident.opened_step,
                        incident.mode,
                        sorted(slot - base for slot in incident.slots),
                        [slot - base for slot in incident.slots_at_open],
                        alert.latest.SerializeToString(),
                        alert.band,
                        alert.candidate,
                        alert.candidate_scores,
                    )
                )
            heard = self._heard.get(name)
            return BookNodeState(
                self.tracker.runs(slots), saved, heard.event_s if heard is not None else -math.inf
            )

    def expect(self, name: str, stored: Sequence[apb.Alert]) -> None:
        """Events of the node the log holds after its saved state (a kill came between their write
        and the save): the replay from that state derives them again, and each is taken as the one
        stored instead of being stored twice."""
        with self._lock:
            if stored:
                self._expected[name] = deque(stored)

    def _still_open(self, stored: Sequence[apb.Alert]) -> list[apb.Alert]:
        """The newest event of each alert among `stored` that the log leaves open and the book does
        not hold (the lock held)."""
        newest: dict[int, apb.Alert] = {}
        for event in stored:
            newest[event.opened_id] = event
        held = {a.latest.opened_id for a in self._alerts.values()}
        return [e for k, e in newest.items() if e.state == apb.ALERT_STATE_OPEN and k not in held]

    def give_up_after(self, name: str, event_s: float) -> int:
        """The node's expected events later than `event_s` cannot be derived again (their samples
        are not in the journal: a power cut took its tail): the alerts they leave open in the log
        are taken into the tracker as after a restart, before the node's first step after
        `event_s` (its steps up to then are judged as before), to be judged by the next scores
        rather than stay open for ever. Returns how many events were given up."""
        with self._lock:
            waiting = self._expected.get(name)
            if not waiting:
                return 0
            lost: list[apb.Alert] = []
            while waiting and waiting[-1].time_unix_nano / 1e9 > event_s:
                lost.insert(0, waiting.pop())
            if not waiting:
                del self._expected[name]
            if lost:
                log.warning(
                    "node %s: %d alert event(s) stored before the restart come after the samples its "
                    "journal still holds; their open alerts are judged again by the next scores",
                    name,
                    len(lost),
                )
                self._deferred[name] = (event_s, self._still_open(lost))
            return len(lost)

    def quiet_until(self, name: str, event_s: float) -> None:
        """Steps of the node up to `event_s` are not judged again (it fell silent after them, which
        cleared its alerts and reset its runs: what a replay of them would undo)."""
        with self._lock:
            self._quiet[name] = event_s

    def restore_node(self, name: str, state: BookNodeState) -> None:
        """Take a node's saved alert state back, in place of the open alerts the log holds for it
        (the same alerts, with their runs): before the node is scored again."""
        with self._lock:
            if name in self._nodes:
                raise ValueError(f"node {name!r} has alert state already; restore it before it is scored")
            node = self._nodes[name] = len(self._names)
            self._names.append(name)
            self.tracker.grow((node + 1) * self.g)
            for alert in self._restored.pop(name, []):
                self.publisher.count_open(alert, -1)
            base = node * self.g
            self.tracker.set_runs(list(range(base, base + self.g)), state.runs)
            for saved in state.incidents:
                latest = apb.Alert.FromString(saved.latest)
                incident = self.tracker.adopt(
                    node,
                    saved.gpu,
                    [base + gpu for gpu in saved.gpus],
                    saved.opened_step,
                    saved.mode,
                    [base + gpu for gpu in saved.gpus_at_open],
                )
                self._alerts[incident.key] = _Open(
                    latest, saved.band, saved.candidate, saved.candidate_scores
                )
                self.publisher.count_open(latest)
            self._heard[name] = _Heard(state.heard_event_s, self.clock())

    # -- scoring ------------------------------------------------------------------------------

    def _node(self, name: str) -> int:
        """The node's tracker number; the first time, alerts a previous run left open on it are
        taken back into the tracker."""
        node = self._nodes.get(name)
        if node is not None:
            return node
        node = self._nodes[name] = len(self._names)
        self._names.append(name)
        self.tracker.grow((node + 1) * self.g)
        self._take_back(node, self._restored.pop(name, []))
        return node

    def _take_back(self, node: int, alerts: Sequence[apb.Alert], *, count: bool = False) -> None:
        """Open alerts of the log (a previous run's, or ones a replay could not derive again) taken
        into the tracker with fresh runs, so that the next scores decide whether each holds; one
        whose GPUs another alert holds is cleared as superseded at the next step (the lock held).
        `count`: not yet counted among the active alerts (those restored at start were)."""
        if count:
            for alert in alerts:
                self.publisher.count_open(alert)
        # GPU alerts first: a node-level alert takes back every GPU of the node no GPU alert holds (the
        # GPUs that held it at the restart are not recorded; those with a low risk soon let go).
        for alert in sorted(alerts, key=lambda a: (a.gpu < 0, a.opened_id)):
            gpus = range(self.g) if alert.gpu < 0 else [alert.gpu] if 0 <= alert.gpu < self.g else []
            opened = int(alert.time_unix_nano // int(self.cadence_s * 1e9))
            incident = self.tracker.restore(
                node,
                alert.gpu,
                [node * self.g + gpu for gpu in gpus],
                opened,
                mode_of(alert),
            )
            if incident is None:
                self._orphans.append(alert)
                continue
            ttf = alert.time_to_failure.p50_seconds if alert.HasField("time_to_failure") else float("inf")
            self._alerts[incident.key] = _Open(alert, self.events.band(ttf))

    def observe(self, scored: Sequence[ScoredStep], *, announce: bool = True) -> list[apb.Alert]:
        """Run the state machine over scored steps (oldest first); returns the stored events, told
        to the listeners unless `announce` is False (the caller then `announce`s them, after
        saving what must be on disk before anyone acts on them)."""
        stored: list[apb.Alert] = []
        with self._lock:
            for s in scored:
                quiet = self._quiet.get(s.node)
                if quiet is not None:
                    if s.time_s <= quiet:
                        continue
                    del self._quiet[s.node]
                node = self._node(s.node)
                deferred = self._deferred.get(s.node)
                if deferred is not None and s.time_s > deferred[0]:
                    del self._deferred[s.node]
                    self._take_back(node, deferred[1], count=True)
                self._hear(s)
                base = node * self.g
                (changes,) = self.tracker.update(
                    s.step, np.arange(base, base + self.g), s.risk, s.present, s.mode
                )
                self.publisher.risk(s, self.g)
                events = [self._cleared(i, s.time_s, s) for i in changes.closed]
                events += [self._orphan_cleared(alert, s.time_s) for alert in self._orphans]
                self._orphans.clear()
                events += self._updates(s, node, {i.key for i in changes.opened})
                opening = [(i, *self.events.opened(s, i)) for i in changes.opened]
                if not events and not opening:
                    continue
                stored.extend(self._store(events, opening))
        if announce:
            self.announce(stored)
        return stored

    def _store(
        self, events: list[apb.Alert], opening: list[tuple[Incident, apb.Alert, int]]
    ) -> list[apb.Alert]:
        """Store (and so number) the events before anything else sees them; track what they change,
        active alerts by mode included. `opening`: (incident, its OPENED event, its band)."""
        saved = self._append(events + [alert for _, alert, _ in opening])
        for event in saved[: len(events)]:
            for key, held in list(self._alerts.items()):
                if held.latest.opened_id != event.opened_id:
                    continue
                if event.state == apb.ALERT_STATE_CLEARED:
                    del self._alerts[key]
                    self.publisher.count_open(held.latest, -1)
                else:
                    self.publisher.mode_changed(held.latest, event)
                    held.latest = event
        for (incident, _, band), alert in zip(opening, saved[len(events) :], strict=True):
            self._alerts[incident.key] = _Open(alert, band)
            self.publisher.opened(alert)
        return saved

    def _append(self, events: list[apb.Alert]) -> list[apb.Alert]:
        """The events as stored, in order: those the log holds already (`expect`) as the log holds
        them, the others stored now (`_append_new`)."""
        recorded = self._recorded(events)
        fresh = iter(self._append_new([e for e, r in zip(events, recorded, strict=True) if r is None]))
        return [r if r is not None else next(fresh) for r in recorded]

    def _recorded(self, events: list[apb.Alert]) -> list[apb.Alert | None]:
        """For each event, the stored one it repeats, if it is the next event `expect` named for
        its node (the same kind, GPU and event time); None otherwise. An event that differs ends
        its node's expectations, with a warning: it and those after it are stored as new."""
        out: list[apb.Alert | None] = []
        for event in events:
            waiting = self._expected.get(event.node)
            if not waiting:
                out.append(None)
                continue
            logged = waiting[0]
            if (logged.kind, logged.gpu, logged.time_unix_nano) == (
                event.kind,
                event.gpu,
                event.time_unix_nano,
            ):
                waiting.popleft()
                out.append(logged)
            else:
                log.warning(
                    "node %s: after the restart its scores give %s of gpu %d at %d where the log holds %s "
                    "at %d (alert %d); it and the events after it are stored as new",
                    event.node,
                    apb.EventKind.Name(event.kind),
                    event.gpu,
                    event.time_unix_nano,
                    apb.EventKind.Name(logged.kind),
                    logged.time_unix_nano,
                    logged.id,
                )
                self._take_back(self._nodes[event.node], self._still_open(list(waiting)), count=True)
                waiting.clear()
                out.append(None)
            if not waiting:
                del self._expected[event.node]
        return out

    def _append_new(self, events: list[apb.Alert]) -> list[apb.Alert]:
        """Store the events, however long the database refuses them: the scoring thread waits here
        (steps queue in the scorer; once its backlog is full, collectors keep their samples in
        their spools), so no alert is lost and none is published before it is durable. Raises
        StateWriteError only when the service stops first."""
        if not events:
            return []
        delay_s, refused_since = _STORE_RETRY_S[0], 0.0
        while True:
            try:
                saved = self.store.alerts.append(events)
            except StateWriteError as exc:
                self.metrics.state_writes_waiting.set(len(events))
                if not refused_since:
                    refused_since = time.monotonic()
                    log.error(
                        "%s; holding %d alert event(s) and trying again (scoring waits meanwhile)",
                        exc,
                        len(events),
                    )
                if self.stopping.wait(delay_s):
                    log.error("stopping with %d alert event(s) never stored: %s", len(events), exc)
                    raise
                delay_s = min(2 * delay_s, _STORE_RETRY_S[1])
                continue
            if refused_since:
                self.metrics.state_writes_waiting.set(0)
                log.warning(
                    "stored %d held alert event(s) after %.0f s of refused writes",
                    len(events),
                    time.monotonic() - refused_since,
                )
            return saved

    def failed(
        self, failures: Sequence[tuple[FailureSign, TrainerReport | None]], *, wait: bool = True
    ) -> list[apb.Alert]:
        """Store a FAILED event for each failure seen (service/failure_events.py), built against the
        alerts open on its node now (they foresaw it), and tell the listeners. `wait`: hold them while
        the database refuses writes, as scored events are held; else StateWriteError at once (an RPC
        answers)."""
        with self._lock:
            events = []
            for sign, report in failures:
                open_here = [a.latest for a in self._alerts.values() if a.latest.node == sign.node]
                open_here += self._restored.get(sign.node, [])
                events.append(failure_event(sign, open_here, self.events.info, report))
            stored = self._append_new(events) if wait else self.store.alerts.append(events, held=False)
            cleared = [
                event
                for sign, _ in failures
                if sign.evidence is Evidence.NODE_SILENT
                for event in self._stream_silent(sign.node)
            ]
        self.publisher.failures(stored)
        self.announce([*stored, *cleared])
        return stored

    def announce(self, stored: Sequence[apb.Alert]) -> None:
        """Tell the listeners of stored events (those `observe` or `check_silence` returned
        unannounced), after a log line each."""
        self.publisher.announce(stored)

    # -- events -------------------------------------------------------------------------------

    def _updates(self, s: ScoredStep, node: int, just_opened: set[int]) -> list[apb.Alert]:
        """UPDATED events for this node's open alerts whose likely mode changed (for `k` scores), whose
        action escalates, or whose failure looks nearer. Only a score at or above the hold level
        speaks for an alert."""
        hold = self.model.policy.hold(self.model.open_threshold)
        out = []
        seen: set[int] = set()
        for slot in range(node * self.g, (node + 1) * self.g):
            incident = self.tracker.by_slot[0].get(slot)
            if incident is None or incident.key in just_opened or incident.key in seen:
                continue
            seen.add(incident.key)
            held = self._alerts.get(incident.key)
            gpus = [sl % self.g for sl in incident.slots if s.present[sl % self.g]]
            if held is None or not gpus:
                continue
            gpu = max(gpus, key=lambda g: float(s.risk[g]))
            risk, ttf = float(s.risk[gpu]), float(s.ttf_s[gpu])
            if not risk >= hold:
                continue
            latest = held.latest
            shown = mode_of(latest)
            mode = self._confirmed_mode(held, s.mode[gpu], shown)
            action = self.actions.action(mode, risk, ttf, self.events.move_at)
            was = Action.of(latest.action) or Action.WATCH
            # Only a score that would open an alert may escalate one.
            escalates = action.rank > was.rank and risk >= self.model.open_threshold
            # The tier rises (never falls) with a score at the move tier's threshold.
            rises = latest.tier == apb.ALERT_TIER_PROTECT and risk >= self.model.threshold
            nearer = self.events.band(ttf) < held.band
            if mode == shown and not escalates and not nearer and not rises:
                continue
            # The action never steps down within an incident: a drain asked for stays asked for.
            strongest = action if escalates else was
            held.band = min(held.band, self.events.band(ttf))
            out.append(self.events.updated(s, incident, gpu, mode, strongest, latest))
        return out

    def _confirmed_mode(self, held: _Open, scored: str, shown: str) -> str:
        """The alert's mode: a new likely mode replaces the shown one once it has been the likely
        mode for `k` consecutive scores (one score of another mode is noise)."""
        if scored in ("", "none", shown):
            held.candidate, held.candidate_scores = "", 0
            return shown
        if scored == held.candidate:
            held.candidate_scores += 1
        else:
            held.candidate, held.candidate_scores = scored, 1
        if held.candidate_scores >= self.model.policy.k:
            held.candidate, held.candidate_scores = "", 0
            return scored
        return shown

    def _orphan_cleared(self, alert: apb.Alert, time_s: float) -> apb.Alert:
        """A restored alert with no GPU of its own left (another alert holds them, or its GPU is out
        of the model's range) ends here."""
        text = "cleared after a restart: another alert holds its GPUs"
        return self._restored_cleared(alert, time_s, text, apb.CLEAR_REASON_SUPERSEDED)

    def _restored_cleared(
        self, alert: apb.Alert, time_s: float, text: str, reason: apb.ClearReason.ValueType
    ) -> apb.Alert:
        """The CLEARED event of an alert restored at start and never scored since (so not in the
        tracker): it was counted as active at the start, so it is counted down here."""
        self.publisher.count_open(alert, -1)
        return self.events.restored_cleared(alert, time_s, text, reason)

    def _cleared(self, incident: Incident, time_s: float, s: ScoredStep | None, text: str = "") -> apb.Alert:
        held = self._alerts.get(incident.key)
        latest = held.latest if held is not None else apb.Alert()
        return self.events.cleared(incident, latest, self._names[incident.node], time_s, s, text)

    # -- silence --------------------------------------------------------------------------------

    def _hear(self, s: ScoredStep) -> None:
        heard = self._heard.get(s.node)
        if heard is None:
            self._heard[s.node] = _Heard(s.time_s, self.clock())
        else:
            heard.event_s, heard.clock_s = max(heard.event_s, s.time_s), self.clock()
        if self._silent.pop(s.node, None) is not None:
            self.publisher.heard_again(s.node)
            self._save_silent()

    def _save_silent(self) -> None:
        """Keep the silent nodes across restarts; a refused write is tried again at the next check."""
        try:
            self.store.settings.save(
                _SILENT_SETTING, json.dumps(self._silent, sort_keys=True) if self._silent else None
            )
        except StateWriteError:
            self._silent_unsaved = True
        else:
            self._silent_unsaved = False

    def check_silence(self, *, announce: bool = True) -> list[apb.Alert]:
        """Mark silent the nodes not heard for `silent_after_steps` model steps by the service's
        clock while some other node was; returns the events stored (their open alerts clearing),
        told to the listeners unless `announce` is False."""
        limit_s = self.silent_after_steps * self.cadence_s
        stored: list[apb.Alert] = []
        with self._lock:
            if self._silent_unsaved:
                self._save_silent()
            now = self.clock()
            last = {
                name: max(h.clock_s, self._arrived.get(name, (0.0, -math.inf))[1])
                for name, h in self._heard.items()
            }
            if not any(now - at < limit_s for at in last.values()):
                return []  # the whole fleet is quiet: the service is cut off, not every node
            for name, heard in sorted(self._heard.items()):
                if name not in self._silent and now - last[name] >= limit_s:
                    stored.extend(self._fall_silent(name, heard, limit_s))
        if announce:
            self.announce(stored)
        return stored

    def _stream_silent(self, name: str) -> list[apb.Alert]:
        """The node's collector stream broke and did not come back (its NODE_SILENT FAILED event, the
        lock held): the node is silent now, whether or not another node is heard (check_silence waits
        for one, so a node alone in its fleet, or one of a fleet gone quiet, would keep its alerts open);
        its open alerts clear as NODE_SILENT, after the FAILED event that names them."""
        if name in self._silent:
            return []
        heard = self._heard.get(name, _Heard(-math.inf, -math.inf))
        last_clock_s = max(heard.clock_s, self._arrived.get(name, (0.0, -math.inf))[1])
        quiet_s = self.clock() - last_clock_s if math.isfinite(last_clock_s) else 0.0
        why = "its collector's stream broke and did not come back"
        return self._fall_silent(name, heard, quiet_s, why)

    def _fall_silent(self, name: str, heard: _Heard, limit_s: float, why: str = "") -> list[apb.Alert]:
        why = why or f"no sample for {self.silent_after_steps} model steps ({limit_s:.0f} s)"
        text = f"node silent: {why} while this alert was open; it may be the predicted failure itself"
        # The event time of a CLEARED event is the node's last scored step (its clock, not ours).
        last_s = heard.event_s if math.isfinite(heard.event_s) else 0.0
        events: list[apb.Alert] = []
        node = self._nodes.get(name)
        if node is not None:
            (changes,) = self.tracker.close_node(node, int(last_s // self.cadence_s), CloseReason.NODE_SILENT)
            events = [self._cleared(incident, last_s, None, text) for incident in changes.closed]
        for alert in self._restored.pop(name, []):
            at_s = max(last_s, alert.time_unix_nano / 1e9)  # never before the alert's own latest event
            events.append(self._restored_cleared(alert, at_s, text, apb.CLEAR_REASON_NODE_SILENT))
        during = bool(events)
        self._silent[name] = during
        self._save_silent()
        self.publisher.fell_silent(name, limit_s, len(events))
        return self._store(events, []) if events else []

    def arrived(self, node: str, event_s: float) -> None:
        """A sample of `node` stamped `event_s` was taken now (from ingest, any thread). It counts
        as the node speaking only when it moves the node's event time on: samples of a clock that
        stands still say nothing new, and such a node still falls silent."""
        last = self._arrived.get(node)
        if last is None or event_s > last[0]:
            self._arrived[node] = (event_s, self.clock())

    def silent_nodes(self) -> dict[str, bool]:
        """Silent nodes now, each with whether an alert was open when it fell silent."""
        with self._lock:
            return dict(self._silent)
