"""The prediction service: ingest, scoring, alerts, remediation and the RPCs, wired together.

`Service(model, store, config)` builds the parts in memory from a loaded model, an open state store
and a `ServiceConfig` (`Service.open(model_dir, state_dir, config)` loads and opens them);
`start(address)` first takes back what an earlier run left (each node's saved scoring state and
the journalled samples after it: `recover`), then starts the scoring, cursor and remediation threads
and binds one gRPC server with the telemetry, alerts, admin, health and reflection services. Nothing
here reads the wall clock but the edges: arrival times (ingest lag, latency) and grace timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2

from faultcast.failure_signs import FailureSign
from faultcast.model.artifact import FaultModel, ModelError, load
from faultcast.readings import NodeSnapshot
from faultcast.service.alert_book import AlertBook, BookNodeState
from faultcast.service.archive.writer import Archive, ArchiveSettings
from faultcast.service.config import ServiceConfig
from faultcast.service.drift_monitor import DriftMonitor
from faultcast.service.failure_events import EVIDENCE_TO_PB, TrainerReport
from faultcast.service.failure_watch import FailureWatch
from faultcast.service.label_desk import LabelDesk
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.model_registry import (
    Refusal,
    RegisteredModel,
    RegistryRefusedError,
    choose_at_start,
    of_store,
)
from faultcast.service.node_history import LabelHistory
from faultcast.service.pending_failures import PendingFailures
from faultcast.service.remediation.actuators import Actuator, NoopActuator
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.remediation.spares.prescheduler import Prescheduler, SpareProvider, SpareSetting
from faultcast.service.retrain_schedule import Retrainer, RetrainSchedule
from faultcast.service.rpc.api import AdminServicer, AlertsServicer
from faultcast.service.rpc.auth import AccessPolicy, AuthInterceptor
from faultcast.service.rpc.health import ALL, Health
from faultcast.service.rpc.reflection import enable_reflection
from faultcast.service.rpc.telemetry import MAX_MESSAGE_BYTES, AsyncTelemetryServicer, TelemetryServicer
from faultcast.service.rpc.validation import SampleRejected
from faultcast.service.scoring import ScoredStep, Scorer, model_version
from faultcast.service.scoring_state import (
    NodeState,
    StateRefused,
    book_signature,
    decode,
    encode,
    features_signature,
)
from faultcast.service.shadow import Shadow
from faultcast.service.shadow_compare import Comparison, Span, compare
from faultcast.service.state.db import StateWriteError
from faultcast.service.state.models import ModelEvent
from faultcast.service.state.sample_journal import JournalFull, SampleJournal
from faultcast.service.state.scoring import SavedState
from faultcast.service.state.store import StateStore
from faultcast.service.supervise import start_supervised
from faultcast.service.training_labels import training_labels, write
from faultcast.service.visibility_monitor import VisibilityMonitor
from faultcast.tls import ServerTLS
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    tpb.DESCRIPTOR.services_by_name["Telemetry"].full_name,
    apb.DESCRIPTOR.services_by_name["Alerts"].full_name,
    apb.DESCRIPTOR.services_by_name["Admin"].full_name,
)
_CURSOR_SAVE_S = 1.0
_ADMIN_THREADS = 4  # admins' calls only: a pause must not queue behind anyone else's work
_LOOP_WAIT_S = 10.0  # for the event loop to finish what it was handed (then the caller goes on)
_SILENCE_CHECK_S = 1.0  # how often the scoring thread looks for nodes gone silent
JOURNAL_DIR = "journal"  # beside the state database: the samples taken since each node's saved state
ARCHIVE_DIR = "archive"  # beside the state database: what was scored, in the training data format
ARCHIVE_EVERY_S = 30.0  # how often finished steps are written and due days settled
_TOP_FEATURES = 5  # what each alert event names of its reasons (AlertBook's default)
DEFAULT_CONFIG = ServiceConfig()  # today's defaults, for callers that change none


class Service:
    """The prediction service: built from a loaded model and an open state store, in memory only;
    `start` starts its threads and the gRPC server, `stop` ends them and closes the store.
    `Service.open(model_dir, state_dir, config)` loads and opens both for a caller that has neither."""

    def __init__(
        self,
        model: FaultModel,
        store: StateStore,
        config: ServiceConfig = DEFAULT_CONFIG,
        *,
        model_dir: Path,
        actuator: Actuator | None = None,
        metrics: ServiceMetrics | None = None,
        policy: AccessPolicy | None = None,
        spares: SpareProvider | None = None,
        journal_dir: Path | None = None,
    ) -> None:
        """`model` was loaded from `model_dir` (a reload without a path reads it again); the
        service owns `store` from now on (`stop` closes it). `journal_dir`: where taken samples are
        journalled (default: `journal/` beside the state database). `policy`: who may call what
        (faultcast.service.rpc.auth); None serves everyone as admin, which `start` permits only without
        TLS and says so in the log. `spares`: where replacements are readied during an alert
        (service/remediation/spares/prescheduler.py; None: the job is requeued after its snapshot, as without)."""
        self.config = config
        self.model_dir = model_dir  # where the model serving now came from
        self.started_from = model_dir  # what a reload without a path reads again
        self.metrics = metrics or ServiceMetrics()
        self.policy = policy or AccessPolicy(insecure=True, metrics=self.metrics)
        self.caller_limits = config.caller_limits
        self._warn_if_blind(model)
        # What health checks answer; `health.set_serving(...)` from any thread (service/rpc/health.py).
        self.health = Health(
            SERVICE_NAMES, limits=self.caller_limits, policy=self.policy, on_throttle=self._throttled
        )
        self.stopping = threading.Event()
        self.store = store
        store.watch(on_writable=self._on_writable, on_write_failed=self._on_write_failed)
        self.scorer = Scorer(
            model,
            lateness_steps=config.lateness_steps,
            max_nodes=config.max_nodes,
            history=LabelHistory(store),
        )
        self.book = AlertBook(
            model,
            self.store,
            self.metrics,
            actions=config.actions,
            top_features=_TOP_FEATURES,
            silent_after_steps=config.silent_after_steps,
            stopping=self.stopping,
        )
        self.failure_watch = FailureWatch(
            hold_s=config.failure_hold_s, silence_grace_s=config.silence_grace_s, flaps=self.metrics
        )
        self._failures: list[FailureSign] = []  # signs taken at ingest, for the scoring thread to publish
        self.pending_failures = PendingFailures(self.store.settings)  # and on disk until published
        self._reporting = threading.Lock()
        self.journal = SampleJournal(
            journal_dir or store.path.parent / JOURNAL_DIR, max_bytes=config.journal_bytes
        )
        # Taking a sample and writing it to the journal happen together, and a node's state is
        # captured between two of them: a saved state never holds a sample the journal lacks.
        self._ingest_lock = threading.Lock()
        # node -> the journal segment of its first sample since its state was last saved (absent: it
        # took none, and needs nothing of the journal: a node that died pins no segment), and how many
        # samples it has taken in all (a save covers what it took up to its capture).
        self._unsaved_since: dict[str, int] = {}
        self._taken: dict[str, int] = {}
        # node -> journal bytes of its samples since its last save; the nodes to save at the scoring
        # thread's next turn so that the journal stays within its bounds (`_journal_room`).
        self._unsaved_bytes: dict[str, int] = {}
        self._save_for_room: set[str] = set()
        self._saving_failed = False
        self._journal_failing = False
        self._recovered = False
        self.prescheduler = (
            Prescheduler(spares, self.store.jobs.all, self.metrics, kept=SpareSetting(self.store.settings))
            if spares is not None
            else None
        )
        self.remediator = Remediator(
            self.store,
            actuator or NoopActuator(),
            self.metrics,
            grace_s=config.grace_s,
            breaker=config.breaker(),
            retry=config.retry,
            prescheduler=self.prescheduler,
            incident_s=config.incident_s,
        )
        if self.prescheduler is not None:
            self.book.listen(self.prescheduler.on_alerts)  # the spare is asked for first
        self.book.listen(self.remediator.on_alerts)
        self.archive = self._open_archive(model, store)
        self.limits = replace(config.limits, gpus_per_node=model.feature_config.gpus_per_node)
        self.telemetry = TelemetryServicer(
            self._ingest, limits=self.limits, metrics=self.metrics, cursors=self.store.cursors.load()
        )
        self._work = threading.Condition()
        # One scoring at a time: a caller's score_now returns only after the scoring thread's batch
        # in flight has reached the alert book, so what it pushed before is scored when it returns.
        self._scoring = threading.Lock()
        self._ready = 0  # completed steps waiting to be scored
        self.latest_event_s = 0.0  # event time of the newest sample taken (the demo's clock)
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None
        self._aio_thread: threading.Thread | None = None
        self._pool: futures.ThreadPoolExecutor | None = None
        self._admin_pool: futures.ThreadPoolExecutor | None = None
        self._cursor_thread: threading.Thread | None = None
        self._archive_thread: threading.Thread | None = None
        self._retrain_thread: threading.Thread | None = None
        self._reload_lock = threading.Lock()
        self._settings_changed_by = ""
        # The models this state directory may serve (<state_dir>/models/), promoted without a restart.
        self.registry = of_store(store, self._registry_event)
        self.shadow: Shadow | None = None  # a challenger scored beside the serving model (`start` resumes it)
        self._describe(model)
        self.drift = DriftMonitor(self.metrics.feature_drift_psi, self.metrics.calibration_timestamp)
        self.drift.use(model_dir, model)
        self.visibility = VisibilityMonitor(self.metrics.feature_group_visible)
        self.visibility.use(model)
        self.metrics.backlog.set_function(lambda: float(self.scorer.backlog()))
        for outcome in ("ok", "rejected"):
            self.metrics.model_reloads.labels(outcome)

    @classmethod
    def open(
        cls,
        model_dir: Path,
        state_dir: Path,
        config: ServiceConfig = DEFAULT_CONFIG,
        *,
        actuator: Actuator | None = None,
        metrics: ServiceMetrics | None = None,
        policy: AccessPolicy | None = None,
        spares: SpareProvider | None = None,
    ) -> Service:
        """Load the model in `model_dir` and open the state store in `state_dir`, then build the
        service (not started). Raises ModelError for a bad artifact (there is nothing to serve) and
        StateError for a damaged database (starting over in its place would lose the log).

        When the state directory's model registry has a model serving (promoted, not rolled back), that
        model serves instead of `model_dir`, and the log says so (service/model_registry.py)."""
        store = StateStore.in_dir(state_dir)
        try:
            chosen = choose_at_start(model_dir, of_store(store))
            try:
                model = load(chosen)
            except ModelError as exc:
                if chosen == model_dir:
                    raise
                # The registry's model no longer loads (a new faultcast, another catalogue): serve
                # --model rather than nothing, and say so loudly.
                log.error(
                    "the registry's serving model does not load (%s); serving %s instead", exc, model_dir
                )
                chosen, model = model_dir, load(model_dir)
            model_dir = chosen
        except BaseException:
            store.close()
            raise
        return cls(
            model,
            store,
            config,
            model_dir=model_dir,
            actuator=actuator,
            metrics=metrics,
            policy=policy,
            spares=spares,
        )

    def _throttled(self, what: str) -> None:
        self.metrics.throttled.labels(what).inc()

    def _on_write_failed(self, what: str) -> None:
        self.metrics.state_write_failures.labels(what).inc()

    def _on_writable(self, writable: bool, why: str) -> None:
        """The state database stopped taking writes, or takes them again: health and the gauge say
        so (probes and load balancers look elsewhere; FaultcastStateUnwritable fires)."""
        self.metrics.state_writable.set(1.0 if writable else 0.0)
        self.health.set_serving(ALL, writable)
        if writable:
            log.warning("the state database %s takes writes again; serving", self.store.path)
        else:
            log.error(
                "the state database %s refuses writes (%s): health is NOT_SERVING; what could not be "
                "written is held and retried",
                self.store.path,
                why,
            )

    def _restarted(self, thread: str) -> None:
        self.metrics.thread_restarts.labels(thread).inc()

    @staticmethod
    def _warn_if_blind(model: FaultModel) -> None:
        # Training writes a threshold of 1 when none met the false-alarm budget: it never alerts.
        if model.threshold >= 1.0:
            log.error(
                "model %s has alert threshold %.6g: it never raises an alert (training found no threshold "
                "within the false-alarm budget); give it one with `faultcast goodput --apply` or retrain",
                model_version(model),
                model.threshold,
            )

    def _malformed(self) -> None:
        self.metrics.rejects.labels("malformed_message").inc()

    @property
    def model(self) -> FaultModel:
        """The model serving now (changes on reload)."""
        return self.scorer.model

    def _describe(self, model: FaultModel) -> None:
        self.metrics.model_info.info(
            {
                "version": model_version(model),
                "trained_at": model.card.created_at or "",
                "git_revision": model.card.git_revision or "",
                "horizon_s": f"{model.horizon_s:.0f}",
                "cadence_s": f"{model.feature_config.cadence_s:.0f}",
                "threshold": f"{model.threshold:.6f}",
                "protect_threshold": f"{model.protect_threshold or 0.0:.6f}",
                # threshold.json beside the model (faultcast goodput --apply), or training's choice
                "threshold_source": "threshold.json" if model.threshold_choice is not None else "training",
                # the registry's id of the model serving; empty when it is one from outside (--model)
                "registry_id": self.model_dir.name if self.model_dir.parent == self.registry.root else "",
            }
        )

    # -- ingest and scoring -------------------------------------------------------------------

    def _ingest(self, snapshot: NodeSnapshot) -> None:
        # Evidence of a failure counts even in a sample the scorer refuses (one come after its step).
        signs = self.failure_watch.observe(snapshot)
        if signs:
            self.pending_failures.add(signs)  # on disk before the sample is acknowledged
            with self._work:
                self._failures += signs
                self._work.notify()
        with self._ingest_lock:
            # Journalled first: a sample the scorer then refuses is refused again on a replay.
            self._journal(snapshot)
            arrival = time.monotonic()
            completed = self.scorer.add(snapshot, arrival)
            shadow = self.shadow
            if shadow is not None:  # only what the serving scorer took, so both see the same samples
                shadow.add(snapshot, arrival)
            self.visibility.observe(snapshot)  # a sampled look: cheap on this path
            if self.archive is not None:
                self.archive.observe(snapshot)
        self.book.arrived(snapshot.node, snapshot.time_unix_nano / 1e9)
        self.latest_event_s = max(self.latest_event_s, snapshot.time_unix_nano / 1e9)
        if completed:
            with self._work:
                self._ready += completed
                self._work.notify()

    def _journal(self, snapshot: NodeSnapshot) -> None:
        """Write the sample to the journal (the ingest lock held). A disk that refuses it does not
        stop ingest: the sample is scored all the same, and only a restart before its node's next
        save would lose it (said once per outage, counted in faultcast_state_write_failures)."""
        held = self.journal.bytes
        try:
            segment = self.journal.append(snapshot)
        except OSError as exc:
            self.metrics.state_write_failures.labels("journal").inc()
            if not self._journal_failing:
                log.error(
                    "the sample journal %s refuses writes (%s): samples are scored, but a restart before "
                    "their node's state is saved again would lose them",
                    self.journal.directory,
                    exc,
                )
            self._journal_failing = True
            if isinstance(exc, JournalFull):
                self._journal_room(set(self._unsaved_since))
            return
        if self._journal_failing:
            log.warning("the sample journal takes writes again")
            self._journal_failing = False
        node = snapshot.node
        self._unsaved_since.setdefault(node, segment)
        self._taken[node] = self._taken.get(node, 0) + 1
        self._unsaved_bytes[node] = self._unsaved_bytes.get(node, 0) + self.journal.bytes - held
        if self.journal.bytes > self.journal.max_bytes // 2:  # every node that pins a segment
            self._journal_room(set(self._unsaved_since))
        elif self._unsaved_bytes[node] > self.config.journal_node_bytes:
            self._journal_room({node})

    def _journal_room(self, nodes: set[str]) -> None:
        """Have the scoring thread save these nodes at its next turn (the ingest lock held): their
        saved states cover their journalled samples, and the segments holding them can go."""
        if nodes <= self._save_for_room or self._saving_failed:  # a failing save is not tried per sample
            return
        self._save_for_room |= nodes
        with self._work:
            self._ready += 1  # wakes the scoring thread, which scores what waits and saves these
            self._work.notify()

    def score_now(self) -> list[apb.Alert]:
        """Score what is waiting and run the alert policy; the scoring thread's one step. Returns once
        every step completed before the call has been through the alert book."""
        with self._scoring:
            self._save_for_journal()
            scored = self.scorer.score_pending()
            if not scored:
                return []
            alerts = self.book.observe(scored, announce=False)
            self.drift.observe(scored)
            # A node whose alerts changed is saved at once, before anyone acts on its events (a
            # restart must go on after them); the others every checkpoint_steps steps.
            due = self.scorer.due_for_saving({s.node for s in scored}, self.config.checkpoint_steps)
            self._save_states(sorted({a.node for a in alerts} | due))
            self.book.announce(alerts)
        done = time.monotonic()
        self._observe_shadow(scored)  # after the alerts: the shadow never delays one
        for s in scored:
            self.metrics.scoring_latency.observe(done - s.arrival_s)
        return alerts

    def _save_cursors(self) -> None:
        """Every second, off the scoring thread (the write waits for the disk, synchronous=FULL),
        only the cursors that moved since the last save."""
        saved: dict[tuple[str, int], int] = {}
        while not self.stopping.wait(_CURSOR_SAVE_S):
            if not self.store.writable:
                self.store.probe()  # a refused report or registration is retried by nobody here
            now = self.telemetry.cursors()
            moved = {key: seq for key, seq in now.items() if saved.get(key) != seq}
            if moved:
                try:
                    self.store.cursors.save(moved)
                except StateWriteError:
                    continue  # reported by the store; what moved is saved at the next try
            saved = now

    # -- the archive of what was scored --------------------------------------------------------

    def _open_archive(self, model: FaultModel, store: StateStore) -> Archive | None:
        config = self.config
        if not config.archive:
            return None
        settings = ArchiveSettings(
            config.archive_dir or store.path.parent / ARCHIVE_DIR,
            model.feature_config.cadence_s,  # the grid of the model serving at start (a reload keeps it)
            keep_days=config.archive_days,
            max_bytes=config.archive_bytes,
            settle_s=config.archive_settle_s,
        )
        archive = Archive(settings, on_settled=self._write_archive_labels)
        self.metrics.archive_bytes.set_function(lambda: float(archive.bytes()))
        self.metrics.archive_rows.set_function(lambda: float(archive.counts.rows))
        self.metrics.archive_dropped.set_function(lambda: float(archive.counts.dropped))
        self.metrics.archive_days.set_function(lambda: float(len(archive.days())))
        return archive

    def _keep_archive(self) -> None:
        """Every ARCHIVE_EVERY_S, and whenever a part's worth of rows waits, off the ingest and scoring
        threads: write the finished steps, settle the days that are due, apply the bounds."""
        assert self.archive is not None
        while not self.stopping.is_set():
            self.archive.due.wait(ARCHIVE_EVERY_S)
            if not self.stopping.is_set():
                self.archive.maintain()

    def _take_challenger(self, model_dir: Path) -> None:
        """A scheduled retrain's challenger: into the registry, and shadowed beside the serving model
        (never promoted here); a refusal is logged and the shadow in place, if any, goes on."""
        try:
            entry, _ = self.add_model(str(model_dir), "service", "scheduled retrain")
            self.shadow_model(entry.id, "service", "scheduled retrain: shadowed until compared")
        except RegistryRefusedError as exc:
            log.error("the scheduled retrain's challenger %s was not taken: %s", model_dir, exc)
            return
        log.warning("scheduled retrain: challenger %s shadowed beside the serving model", entry.id)

    def _write_archive_labels(self, directory: Path) -> None:
        """The label log beside the settled days, so the archive is a data directory to train on."""
        try:
            write(training_labels(self.store, self.model.horizon_s), directory)
        except (OSError, StateWriteError, sqlite3.Error) as exc:
            log.error(
                "the archive's failure log could not be written (%s); written at the next settled day", exc
            )

    # -- saved scoring state ------------------------------------------------------------------

    def _save_for_journal(self) -> None:
        """Save the nodes `_journal_room` asked for (the scoring lock held), after beginning a new
        journal segment: all they took before it is then in segments their saved states cover."""
        with self._ingest_lock:
            nodes, self._save_for_room = self._save_for_room, set()
            if nodes:
                self.journal.rotate()
        self._save_states(sorted(nodes))

    def _save_states(self, nodes: list[str]) -> None:
        """Save these nodes' scoring state (on the scoring thread, no batch in flight: every step a
        node completed is either through the alert book or in its saved queue), then forget the
        journal segments every node's saved state covers. A refused write is logged once; the
        journal keeps the samples until a later save works."""
        if not nodes:
            return
        features = features_signature(self.model)
        book = book_signature(self.model, self.config.actions, _TOP_FEATURES)
        saved: list[SavedState] = []
        taken_at_capture: dict[str, tuple[int, int]] = {}
        refused: list[tuple[str, int]] = []  # nodes the scorer holds nothing of, and the segment then
        for name in nodes:
            with self._ingest_lock:
                segment = self.journal.segment
                scoring = self.scorer.node_state(name)
                taken_at_capture[name] = (self._taken.get(name, 0), self._unsaved_bytes.get(name, 0))
            if scoring is None:  # every sample it sent was refused: a replay refuses them again
                refused.append((name, segment))
                continue
            state = NodeState(scoring, self.book.node_state(name))
            saved.append(SavedState(name, features, book, self.store.alerts.last_id, segment, encode(state)))
        try:
            self.store.scoring.save(saved)
        except StateWriteError as exc:
            if not self._saving_failed:
                log.error("%s; the journal keeps the samples until a save works", exc)
            self._saving_failed = True
            return
        self._saving_failed = False
        self.metrics.states_saved.inc(len(saved))
        with self._ingest_lock:
            for name, segment in [(s.node, s.segment) for s in saved] + refused:
                taken, held = taken_at_capture[name]
                self._unsaved_bytes[name] = self._unsaved_bytes.get(name, 0) - held
                if self._taken.get(name, 0) == taken:
                    self._unsaved_since.pop(name, None)  # nothing taken since: it needs no journal
                    self._unsaved_bytes.pop(name, None)
                else:
                    self._unsaved_since[name] = segment  # what it took after the capture is from here on
        self._forget_journal()

    def _forget_journal(self) -> None:
        """Delete the segments no node needs: older than the first sample any node took since its
        state was last saved."""
        with self._ingest_lock:
            oldest = min(self._unsaved_since.values(), default=self.journal.segment)
        self.journal.forget_before(oldest)

    def recover(self) -> int:
        """Take back what an earlier run left: each node's saved scoring state (under the same
        features; its alert state under the same model and policy, the events the log holds after
        it expected again from the replay), then the journalled samples after it. Returns the
        samples replayed. Once, before any sample is taken (`start` calls it)."""
        if self._recovered:
            return 0
        self._recovered = True
        started = time.monotonic()
        features = features_signature(self.model)
        book = book_signature(self.model, self.config.actions, _TOP_FEATURES)
        newest = self.store.alerts.newest_by_node()
        taken: dict[tuple[str, int], int] = {}
        kept = stale = 0
        behind_nodes: list[str] = []
        restored_nodes: set[str] = set()
        for saved in self.store.scoring.load():
            if saved.features != features:
                stale += 1
                continue
            try:
                state = decode(saved.state, self.model)  # refused unless it fits the model
                self.scorer.restore_node(saved.node, state.scoring)
            except (StateRefused, ValueError, TypeError, AttributeError) as exc:
                # A blob that decodes but does not fit (planted, or from another version) is refused
                # like one that does not decode: the node starts over, the service starts.
                log.error("the saved scoring state of node %s is not taken back: %s", saved.node, exc)
                continue
            if state.book is not None and saved.book == book:
                if newest.get(saved.node, 0) > saved.log_head:
                    self._restore_behind(saved.node, state.book, saved.log_head)
                    behind_nodes.append(saved.node)
                else:
                    self.book.restore_node(saved.node, state.book)
            restored_nodes.add(saved.node)
            taken.update({(saved.node, spool): seq for spool, seq in state.scoring.cursors.items()})
            kept += 1
        replayed = 0
        now = time.monotonic()
        for entry in self.journal.entries():
            key = (entry.node, entry.spool_id)
            if entry.sequence <= taken.get(key, 0):
                continue  # in its node's saved state already
            taken[key] = entry.sequence
            self._unsaved_since.setdefault(entry.node, entry.segment)
            try:
                self.scorer.add(entry.snapshot, now)
            except SampleRejected:
                continue  # refused the first time too
            except Exception:  # a sample that broke the scorer breaks no restart
                log.exception(
                    "replaying journalled sample %d of %s failed; skipped", entry.sequence, entry.node
                )
                continue
            if self.archive is not None:  # a step archived before the restart is kept once
                self.archive.observe(entry.snapshot)
            replayed += 1
        for name in behind_nodes:  # what the journal could not bring back is judged afresh
            horizon = self.scorer.completed_through(name)
            self.book.give_up_after(name, horizon if horizon is not None else -math.inf)
        for name in set(self.scorer.nodes()) - restored_nodes:
            # No saved state: its replayed steps were judged before the kill (their events are in
            # the log); they warm its features, and its open alerts are judged from its next step.
            horizon = self.scorer.completed_through(name)
            if horizon is not None:
                self.book.quiet_until(name, horizon)
        self.telemetry.advance(taken)
        self._recover_failures()
        with self._work:
            self._ready += self.scorer.backlog()
        log.info(
            "took back the saved scoring state of %d node(s) (%d saved under other features, not taken; %d "
            "older than their last events, whose events are matched on replay) and replayed %d journalled "
            "sample(s) in %.1f s",
            kept,
            stale,
            len(behind_nodes),
            replayed,
            time.monotonic() - started,
        )
        return replayed

    def _recover_failures(self) -> None:
        """The failure signs an earlier run took and acknowledged but was killed before storing their
        FAILED events: published now (one stored meanwhile is not published twice)."""
        left = self.pending_failures.load()
        if not left:
            return  # the usual start: nothing of the log to read
        stored = {
            (e.node, e.gpu, e.failure.evidence, e.failure.xid, e.time_unix_nano)
            for e in self.store.alerts.failures()
        }
        missing = [
            s
            for s in left
            if (s.node, s.gpu, EVIDENCE_TO_PB[s.evidence], s.xid, s.time_unix_nano) not in stored
        ]
        self.pending_failures.done([s for s in left if s not in missing])
        if missing:
            log.warning(
                "%d failure(s) taken before the last stop had no FAILED event (a kill came between); "
                "publishing them",
                len(missing),
            )
            with self._work:
                self._failures += missing
                self._work.notify()

    def _restore_behind(self, name: str, book: BookNodeState, log_head: int) -> None:
        """A node killed between storing its events and saving its state: its saved alert state is
        older than the log. The replay derives score events again and takes them as the ones stored
        (`expect`); a silence it cannot derive: the node fell silent after its last save, which
        cleared its alerts and reset its runs, so that is its alert state, and its steps up to then
        are not judged again."""
        # FAILED events come from samples as they are taken, not from scores: a replay never derives them.
        after = [
            e
            for e in self.store.alerts.read_after(log_head, [name], 1_000_000)
            if e.kind != apb.EVENT_KIND_FAILED
        ]
        silences = [
            i
            for i, e in enumerate(after)
            if e.kind == apb.EVENT_KIND_CLEARED and e.clear_reason == apb.CLEAR_REASON_NODE_SILENT
        ]
        if not silences:
            self.book.restore_node(name, book)
            self.book.expect(name, after)
            return
        last = silences[-1]
        self.book.restore_node(name, BookNodeState(np.zeros_like(book.runs), [], book.heard_event_s))
        self.book.quiet_until(name, after[last].time_unix_nano / 1e9)
        self.book.expect(name, after[last + 1 :])

    def _loop(self) -> None:
        checked = time.monotonic()
        while not self.stopping.is_set():
            silence_due = self.failure_watch.next_silence_check()
            wait_s = _SILENCE_CHECK_S if silence_due is None else min(_SILENCE_CHECK_S, silence_due)
            with self._work:
                self._work.wait_for(
                    lambda: self._ready > 0 or bool(self._failures) or self.stopping.is_set(), wait_s
                )
                self._ready = 0
                signs, self._failures = self._failures, []
            try:
                before = set(self.book.silent_nodes())
                self._publish_failures(signs + self.failure_watch.silent())
                silenced = sorted(set(self.book.silent_nodes()) - before)
                if silenced:  # a NODE_SILENT failure silences its node: saved, as below
                    with self._scoring:
                        self._save_states(silenced)
                self.score_now()
                if time.monotonic() - checked >= _SILENCE_CHECK_S:
                    checked = time.monotonic()
                    before = set(self.book.silent_nodes())
                    cleared = self.book.check_silence(announce=False)
                    with self._scoring:  # a node that fell silent is saved: its journal can go
                        self._save_states(sorted(set(self.book.silent_nodes()) - before))
                    self.book.announce(cleared)
            except StateWriteError:
                return  # only while stopping: the alert book logged the events it could not store
            except Exception:  # a scoring bug must not stop ingest; it is logged and counted
                log.exception("scoring failed; the samples of this tick are lost, the service goes on")
                self.metrics.rejects.labels("scoring_error").inc()

    # -- model reload -------------------------------------------------------------------------

    def _publish_failures(self, signs: list[FailureSign]) -> None:
        """FAILED events for failures seen happen (the scoring thread: before the steps waiting, which
        cannot be as urgent); each holds its GPU or node (FailureWatch.hold)."""
        if not signs:
            return
        stored = self.book.failed([(sign, None) for sign in signs])
        for sign, event in zip(signs, stored, strict=True):
            self.failure_watch.hold(sign, event.id)
        self.pending_failures.done(signs)

    def report_failure(self, sign: FailureSign, report: TrainerReport) -> tuple[int, bool]:
        """A trainer's report (ReportFailure): its FAILED event's id, or that of the failure already
        known on the node (True). StateWriteError when the database refuses it now."""
        with self._reporting:  # ranks reporting one death at the same moment: one event
            known = self.failure_watch.held_on_node(sign.node)
            if known:
                return known, True
            if not self.store.writable:
                # Refused at once: the scoring thread may hold the alert book while it waits for the
                # database to take its events again, and an RPC must not wait behind it.
                raise StateWriteError(
                    "a trainer's failure report", sqlite3.OperationalError("writes refused")
                )
            (stored,) = self.book.failed([(sign, report)], wait=False)
            self.failure_watch.hold(sign, stored.id)
            return stored.id, False

    def reload(self, path: str | None = None) -> tuple[bool, str, str]:
        """Load and check the artifact at `path` (None: the directory the service was started with,
        so a bad reload can always be undone), then serve it; a bad one leaves the old model
        serving. Returns (loaded, version serving now, error)."""
        with self._reload_lock:
            target = Path(path) if path else self.started_from
            if not self.store.writable:
                # The alert book holds events it must store first, under the lock a swap needs.
                self.metrics.model_reloads.labels("rejected").inc()
                why = "the state database refuses writes; reload once health is SERVING again"
                log.error("model reload refused, the old model keeps serving: %s", why)
                return False, model_version(self.model), why
            try:
                model = load(target)
                if model.feature_config.gpus_per_node != self.model.feature_config.gpus_per_node:
                    raise ModelError(
                        f"{target}: built for {model.feature_config.gpus_per_node} GPUs per node, "
                        f"the service runs {self.model.feature_config.gpus_per_node}"
                    )
            except (ModelError, OSError, KeyError, ValueError) as exc:
                self.metrics.model_reloads.labels("rejected").inc()
                log.error("model reload refused, the old model keeps serving: %s", exc)
                return False, model_version(self.model), str(exc)
            self._warn_if_blind(model)
            with self._scoring:
                carried = self.scorer.swap_model(model)
                self.book.swap_model(model, carried)
                self._restart_saved_states(carried)
            self.model_dir = target
            self._describe(model)
            self.drift.use(target, model)
            self.visibility.use(model)
            self.metrics.model_reloads.labels("ok").inc()
            log.info(
                "serving model %s from %s (feature state %s)",
                model_version(model),
                target,
                "kept" if carried else "restarted",
            )
            return True, model_version(model), ""

    def _restart_saved_states(self, carried: bool) -> None:
        """After a reload: states saved under other features can never be taken back (they are
        dropped, with the journal before now); under the same features every node is saved again at
        once, its alert state now under the new model."""
        if carried:
            self._save_states(self.scorer.nodes())
            return
        try:
            self.store.scoring.clear()
        except StateWriteError as exc:
            log.error("%s; the next start finds them saved under other features and skips them", exc)
        with self._ingest_lock:
            self._unsaved_since.clear()
            segment = self.journal.rotate()
        self.journal.forget_before(segment)

    # -- the model registry (Admin/ListModels, AddModel, PromoteModel, RollbackModel) -----------

    def list_models(self) -> tuple[list[RegisteredModel], list[ModelEvent]]:
        """The registered models and the registry's log, oldest first."""
        return self.registry.models(), self.registry.events.all()

    def add_model(self, path: str, by: str, why: str) -> tuple[RegisteredModel, bool]:
        """Copy the model at `path` into the registry (ModelRegistry.add); RegistryRefusedError says why not."""
        with self._counted("add"):
            return self.registry.add(Path(path), by, why)

    def promote_model(self, model_id: str, by: str, why: str, force: bool = False) -> ModelEvent:
        """Serve a registered model now and log it (ModelRegistry.promote). The shadowed challenger is
        promoted only when the comparison finds it better, or with `force` (said in the log's why)."""
        with self._counted("promote"):
            shadow = self.shadow
            if shadow is not None and self.registry.find(model_id).id == shadow.model_id:
                verdict = self.compare_shadow()
                if not verdict.better and not force:
                    raise RegistryRefusedError(
                        Refusal.FAILED_PRECONDITION,
                        f"the challenger does not catch more at no more false alarms ({verdict.summary()}); "
                        "give force to promote it anyway",
                    )
                if not verdict.better:
                    why = f"{why} [forced over the shadow's comparison: {verdict.summary()}]"
            event = self.registry.promote(model_id, by, why, self.reload, self.model_dir)
            if shadow is not None and event.model_id == shadow.model_id:
                self.shadow = None  # the challenger serves: its shadow is over (the log says so too)
        log.warning("model %s promoted by %s (was %s): %s", event.model_id, by, event.from_model_id, why)
        return event

    def rollback_model(self, by: str, why: str) -> ModelEvent:
        """Serve again the registry's model that served before this one, and log it."""
        with self._counted("rollback"):
            event = self.registry.rollback(by, why, self.reload)
        log.warning("model rolled back by %s from %s to %s: %s", by, event.from_model_id, event.model_id, why)
        return event

    def shadow_model(self, model_id: str, by: str, why: str) -> ModelEvent:
        """Score a registered model beside the serving one from now on (ModelRegistry.shadow)."""

        def start(entry: RegisteredModel) -> None:
            self.shadow = self._load_shadow(entry.id)

        with self._counted("shadow"):
            return self.registry.shadow(model_id, by, why, start)

    def stop_shadow(self, by: str, why: str) -> ModelEvent:
        """End the shadow, and log it."""
        with self._counted("shadow"):
            event = self.registry.stop_shadow(by, why)
        self.shadow = None
        return event

    def compare_shadow(self) -> Comparison:
        """The shadowed challenger against the serving model on the fleet's labels over the shadow
        window (service/shadow_compare.py); FAILED_PRECONDITION when no challenger is shadowed."""
        shadow = self.shadow
        if shadow is None:
            raise RegistryRefusedError(Refusal.FAILED_PRECONDITION, "no challenger is shadowed")
        model = self.model
        labels = training_labels(self.store, model.horizon_s)
        return compare(
            self.store.shadow_steps.steps(shadow.model_id),
            [(f.node, f.time_ns) for f, _ in labels.failures],
            [Span(c.node, c.start_ns, c.end_ns) for c in labels.censored],
            serving_threshold=model.threshold,
            challenger_threshold=shadow.model.threshold,
            horizon_s=model.horizon_s,
            cadence_s=model.feature_config.cadence_s,
        )

    def _load_shadow(self, model_id: str) -> Shadow:
        """The registry's model as a challenger; RegistryRefusedError when this service cannot score it."""
        path = self.registry.path_of(model_id)
        try:
            model = load(path)
        except ModelError as exc:
            raise RegistryRefusedError(
                Refusal.FAILED_PRECONDITION, f"model {model_id} does not load: {exc}"
            ) from exc
        if model.feature_config.gpus_per_node != self.model.feature_config.gpus_per_node:
            raise RegistryRefusedError(
                Refusal.FAILED_PRECONDITION,
                f"model {model_id} is built for {model.feature_config.gpus_per_node} GPUs per node, the "
                f"service runs {self.model.feature_config.gpus_per_node}",
            )
        log.warning("shadowing model %s beside the serving model (it alerts nothing)", model_id)
        return Shadow(
            model_id,
            model,
            self.store.shadow_steps,
            self.metrics,
            lateness_steps=self.config.lateness_steps,
            max_nodes=self.config.max_nodes,
            history=LabelHistory(self.store),
        )

    def _resume_shadow(self) -> None:
        """At start: shadow the challenger the registry's log names, if it still loads."""
        model_id = self.registry.shadowing()
        if model_id is None or self.shadow is not None:
            return
        try:
            self.shadow = self._load_shadow(model_id)
        except RegistryRefusedError as exc:
            log.error("the shadowed challenger is not resumed: %s", exc)

    def _observe_shadow(self, scored: list[ScoredStep]) -> None:
        shadow = self.shadow
        if shadow is None:
            return
        try:
            shadow.observe(scored, self.model.threshold)
        except Exception:  # the shadow must never stop the serving path
            log.exception("the shadow could not score its steps; they are lost to the comparison")

    def _registry_event(self, event: ModelEvent) -> None:
        self.metrics.model_registry_events.labels(event.kind.value).inc()

    @contextlib.contextmanager
    def _counted(self, action: str) -> Iterator[None]:
        try:
            yield
        except (RegistryRefusedError, StateWriteError, OSError) as exc:
            self.metrics.model_registry_refusals.labels(action).inc()
            log.error("model registry: %s refused: %s", action, exc)
            raise

    # -- remediation settings (Admin/GetRemediation, SetRemediation) ---------------------------

    def remediation_settings(self) -> apb.RemediationSettings:
        """Whether remediation is paused (and by whom it was last changed), and the
        circuit breaker's limits."""
        breaker = self.remediator.breaker
        return apb.RemediationSettings(
            paused=self.remediator.paused_by is not None,
            max_drains=breaker.max_nodes,
            drain_window_seconds=breaker.window_s,
            changed_by=self._settings_changed_by,
        )

    def set_remediation(self, request: apb.SetRemediationRequest, by: str) -> apb.RemediationSettings:
        """Pause or resume remediation (kept across restarts) and resize the circuit breaker
        (until the next start, which takes the command line's); raises ValueError on bad values."""
        breaker = self.remediator.breaker
        max_drains = request.max_drains if request.HasField("max_drains") else breaker.max_nodes
        window = (
            request.drain_window_seconds if request.HasField("drain_window_seconds") else breaker.window_s
        )
        breaker.resize(max_drains, window)
        if request.HasField("paused"):
            self.remediator.set_paused(by if request.paused else None)
        self._settings_changed_by = by
        log.warning(
            "remediation settings changed by %s: paused %s, at most %d nodes per %.0f s",
            by,
            self.remediator.paused_by is not None,
            breaker.max_nodes,
            breaker.window_s,
        )
        return self.remediation_settings()

    # -- the server ---------------------------------------------------------------------------

    def start(
        self, address: str = "127.0.0.1:0", *, max_threads: int = 256, tls: ServerTLS | None = None
    ) -> int:
        """Start scoring, remediation and the gRPC server; returns the bound port. Without `tls`
        the port is plaintext: only with an insecure policy, and a warning says so.

        The server is `grpc.aio` on its own event loop: every collector keeps a Push stream open,
        and one loop carries them all (a sync server needs a thread per open stream), as do
        Subscribe and health Watch streams: an open stream holds no thread. Acknowledge,
        ListActiveAlerts and RegisterJob are plain methods run on `max_threads` shared threads;
        admins' calls run on threads of their own, so that no load of others can hold them back."""
        if tls is None and not self.policy.insecure:
            raise ValueError(
                "a policy that authenticates callers needs TLS (certificates and tokens travel in it)"
            )
        if tls is not None and self.policy.insecure:
            raise ValueError(
                "TLS with the insecure policy would admit every caller as admin; give a AccessPolicy"
            )
        credentials = tls.credentials() if tls is not None else None  # a bad file fails before any thread
        if credentials is None:
            log.warning(
                "INSECURE: serving %s in plaintext without authentication; any caller may push samples, "
                "read and acknowledge alerts, reload the model and set remediation",
                address,
            )
        self._resume_shadow()
        self.recover()
        self._thread = start_supervised("scoring", self._loop, self.stopping, self._restarted)
        self._cursor_thread = start_supervised("cursors", self._save_cursors, self.stopping, self._restarted)
        if self.archive is not None:
            self._archive_thread = start_supervised(
                "archive", self._keep_archive, self.stopping, self._restarted
            )
        if self.config.retrain_every_s > 0:
            retrainer = Retrainer(
                RetrainSchedule(
                    self.config.retrain_every_s, self.config.retrain_flags, self.config.retrain_warm_start
                ),
                self.store.path.parent,
                self.store.settings,
                self._take_challenger,
                serving_dir=lambda: self.model_dir,
            )
            self._retrain_thread = start_supervised(
                "retrain", lambda: retrainer.loop(self.stopping), self.stopping, self._restarted
            )
        self.remediator.start()
        if self.prescheduler is not None:
            self.prescheduler.start()
        self._aio_loop = asyncio.new_event_loop()
        self._aio_thread = threading.Thread(
            target=self._aio_loop.run_forever, name="faultcast-grpc", daemon=True
        )
        self._aio_thread.start()
        port = asyncio.run_coroutine_threadsafe(
            self._serve(address, max_threads, credentials), self._aio_loop
        ).result()
        self.health.set_serving(ALL, self.store.writable).result(timeout=_LOOP_WAIT_S)
        return port

    async def _serve(self, address: str, max_threads: int, credentials: grpc.ServerCredentials | None) -> int:
        self._pool = futures.ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="faultcast-rpc")
        self._admin_pool = futures.ThreadPoolExecutor(_ADMIN_THREADS, thread_name_prefix="faultcast-admin")
        server = grpc.aio.server(
            migration_thread_pool=self._pool,
            interceptors=[AuthInterceptor(self.policy, self.caller_limits, self._throttled, self._malformed)],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                *_keepalive(self.config.keepalive_s),
            ],
        )
        telemetry = AsyncTelemetryServicer(
            self.telemetry,
            self.policy,
            limits=self.caller_limits,
            backlog=self.scorer.backlog,
            on_throttle=self._throttled,
            streams=self.failure_watch,
        )
        tpb_grpc.add_TelemetryServicer_to_server(telemetry, server)
        alerts = AlertsServicer(
            self.store,
            self.remediator,
            self.stopping,
            self.metrics.subscribers.inc,
            self.policy,
            serving_model=lambda: self.model,
            limits=self.caller_limits,
            on_throttle=self._throttled,
            prescheduler=self.prescheduler,
            report_failure=self.report_failure,
        )
        apb_grpc.add_AlertsServicer_to_server(alerts, server)
        labels = LabelDesk(self.store, lambda: self.model.horizon_s)
        apb_grpc.add_AdminServicer_to_server(AdminServicer(self, self._admin_pool, labels), server)
        self.health.attach(server, asyncio.get_running_loop())
        enable_reflection(
            server, (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        )
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
        if port == 0:
            raise OSError(f"could not bind the service to {address}")
        await server.start()
        self._server = server
        return port

    async def _shutdown(self, server: grpc.aio.Server, grace_s: float) -> None:
        await server.stop(grace_s)  # after the grace period every call still open is cancelled
        for pool in (self._pool, self._admin_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        # Subscribers wait on the loop's executor (half a second at most): let them finish first.
        await asyncio.get_running_loop().shutdown_default_executor()

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop taking requests, finish the waiting scores, save the cursors, close the state.
        Bounded whatever is open: calls still open after `grace_s` are cancelled, and no open
        stream holds a thread."""
        self.health.enter_graceful_shutdown()  # before the server stops: watchers see NOT_SERVING
        self.stopping.set()
        if self.archive is not None:
            self.archive.due.set()  # its thread waits on it
        with self._work:
            self._work.notify_all()
        if self._server is not None and self._aio_loop is not None:
            stopped = asyncio.run_coroutine_threadsafe(self._shutdown(self._server, grace_s), self._aio_loop)
            try:
                stopped.result(timeout=grace_s + _LOOP_WAIT_S)
            except TimeoutError:
                log.error(
                    "the gRPC server did not stop within %.0f s; stopping the rest", grace_s + _LOOP_WAIT_S
                )
            self._aio_loop.call_soon_threadsafe(self._aio_loop.stop)
            if self._aio_thread is not None:
                self._aio_thread.join(timeout=10)
        for thread in (self._thread, self._cursor_thread, self._archive_thread, self._retrain_thread):
            if thread is not None:
                thread.join(timeout=10)
        with contextlib.suppress(StateWriteError):  # the alert book logged what it could not store
            self.score_now()
            with self._scoring:  # a clean stop leaves nothing to replay
                self._save_states(self.scorer.nodes())
        self.journal.close()
        if self.archive is not None:
            self.archive.close()  # the steps being filled, as they are: nothing taken is left out
        self.remediator.stop()
        if self.prescheduler is not None:
            self.prescheduler.stop()
        try:
            self.store.cursors.save(self.telemetry.cursors())
        except StateWriteError as exc:
            log.error("%s; collectors will replay the samples since the last saved cursors", exc)
        self.store.close()

    def wait(self) -> None:
        """Block until the gRPC server has stopped."""
        if self._server is not None and self._aio_loop is not None:
            asyncio.run_coroutine_threadsafe(self._server.wait_for_termination(), self._aio_loop).result()


def _keepalive(every_s: float) -> list[tuple[str, int]]:
    """Server options that ping every stream's peer every `every_s` and drop one that does not answer
    a ping within 1.5 times that: a collector's node that lost power or hung sends no reset, and its
    stream must still end within seconds (FailureWatch then calls the node silent). Pings go out
    whether or not data does: a collector shipping one sample a minute is pinged every `every_s` all
    the same. The answer comes from gRPC's own threads, not the Python code; half a period more leaves
    room for a peer whose machine is busy (a dropped subscriber resumes, a dropped collector that
    reconnects within the grace is no failure)."""
    every_ms = max(1, round(every_s * 1000))
    answer_ms = max(1, round(every_s * 1500))
    return [
        ("grpc.keepalive_time_ms", every_ms),
        ("grpc.keepalive_timeout_ms", answer_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # The deadline of every ping's answer: without it gRPC core (1.85) waits a minute, keepalive or not.
        ("grpc.http2.ping_timeout_ms", answer_ms),
    ]
