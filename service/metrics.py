"""The service's Prometheus metrics: one place that names them, for the code, the shipped alerting
rules (deploy/prometheus/faultcast-rules.yml) and the dashboard (deploy/grafana/)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from faultcast.failure_signs import Evidence
from faultcast.model.features.groups import GROUPS as VISIBILITY_GROUPS
from faultcast.modes import FailureMode

# Scoring latency: from a sample's arrival to its GPUs' risks being known (tens of ms expected).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# Every label value a labelled counter can take, each series exported at 0 from the start: a series
# that appears only with its first event shows "No data" on a healthy system, and rate() or
# increase() miss that first event. tests/test_metric_labels.py scans the service's source for the
# values it passes and fails on one missing here.
REJECT_REASONS: tuple[str, ...] = (
    # the stream (service/rpc/telemetry.py)
    "no_hello",
    "schema_mismatch",
    "repeated_hello",
    "no_sequence",
    "wrong_node",
    "malformed",
    # the sample (service/rpc/validation.py)
    "bad_node_name",
    "unknown_node",
    "future_timestamp",
    "stale_timestamp",
    "oversize_field",
    # scoring (service/scoring.py, service/server.py)
    "too_many_nodes",
    "late",
    "scoring_error",
    # the transport: a message that does not decode as its protobuf type (service/server.py)
    "malformed_message",
)
BLANK_REASONS: tuple[str, ...] = (
    "non_finite_value",
    "implausible_value",
    "negative_counter",
    "gpu_index_out_of_range",
    "duplicate_gpu_index",
    "duplicate_device",
)
AUTH_DENIED_REASONS: tuple[str, ...] = (
    "bad_token",
    "unknown_token",
    "no_identity",
    "foreign_domain",
    "bad_identity",
    "role",
    "wrong_node",
    "registration",
    "wrong_job",
)
THROTTLED_WHAT: tuple[str, ...] = (
    "push_rate",
    "push_backlog",
    "streams",
    "calls",
    "subscribers",
    "health_watches",
    "job_nodes",
    "job_subscribers",
    "spool_ids",
)
# The service's background threads (a death restarts the thread and is counted).
THREADS: tuple[str, ...] = ("scoring", "cursors", "remediator", "archive", "retrain")
# What the service writes to its state database (a failed write is retried and counted).
STATE_WRITES: tuple[str, ...] = (
    "alerts",
    "cursors",
    "remediation",
    "jobs",
    "acks",
    "settings",
    "scoring",  # a node's saved scoring state
    "journal",  # the sample journal (a file beside the database)
    "reports",  # a trainer's failure report, stored at once (ReportFailure answers; nobody retries it)
    "probe",  # a write of the database's own, trying whether writes work again
    "labels",  # the fleet's label log (failures, verdicts)
    "models",  # the model registry's log
)
# The model's failure modes, and "unknown" for an alert whose mode the service cannot name.
ALERT_MODES: tuple[str, ...] = (*(m.value for m in FailureMode), "unknown")
MODEL_RELOAD_OUTCOMES: tuple[str, ...] = ("ok", "rejected")
# The model registry's events (service/state/models.py) and the changes an admin may ask of it.
MODEL_REGISTRY_EVENTS: tuple[str, ...] = ("added", "promoted", "rolled_back", "shadowed", "shadow_stopped")
MODEL_REGISTRY_ACTIONS: tuple[str, ...] = ("add", "promote", "rollback", "shadow")
SHADOW_MODELS: tuple[str, ...] = ("serving", "challenger")  # the shadow's two models
# What happens to a pre-scheduled spare (service/remediation/spares/prescheduler.py).
SPARE_EVENTS: tuple[str, ...] = ("asked", "ready", "handed_over", "released", "failed")


class ServiceMetrics:
    """Every metric the service exports, registered on its own registry (tests make many)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # Registered in this order, which is the order /metrics lists them in.
        self._add_risk_and_alerts(self.registry)
        self._add_ingest_and_scoring(self.registry)
        self._add_delivery_and_remediation(self.registry)
        self._add_model(self.registry)
        self._add_callers(self.registry)
        self._add_service_health(self.registry)
        self._start_labelled_series_at_zero()

    def _add_risk_and_alerts(self, r: CollectorRegistry) -> None:
        """Each GPU's risk and likely mode, the thresholds, silent nodes, alerts."""
        # Keyed by node and GPU only: a label that changes (the likely mode) would start a new series
        # and reset every `for:` timer of a rule on it. The mode is its own series, below.
        self.failure_risk = Gauge(
            "faultcast_failure_risk",
            "Calibrated probability that the GPU fails within the model's horizon (latest score).",
            ["node", "gpu"],
            registry=r,
        )
        self.likely_mode = Gauge(
            "faultcast_failure_likely_mode",
            "1 for the most likely failure mode of a GPU whose risk is near the alert threshold (join on "
            "node and gpu with faultcast_failure_risk); absent for the others.",
            ["node", "gpu", "mode"],
            registry=r,
        )
        self.alert_threshold = Gauge(
            "faultcast_alert_threshold",
            "The risk at which the serving model opens an alert (what rules compare faultcast_failure_risk with).",
            registry=r,
        )
        self.alert_protect_threshold = Gauge(
            "faultcast_alert_protect_threshold",
            "The risk at which an alert opens at the protect tier (replicas and a readied spare, no move); "
            "0 when the model serves one tier. faultcast_alert_threshold is then the move tier's.",
            registry=r,
        )
        self.alerts_by_tier = Gauge(
            "faultcast_alerts_by_tier",
            "Alerts open now, by the tier they stand at (protect: cheap protection; move: the job moves).",
            ["tier"],
            registry=r,
        )
        self.alert_hold_threshold = Gauge(
            "faultcast_alert_hold_threshold",
            "The risk an open alert must stay at or above to stay open (hysteresis, below the threshold).",
            registry=r,
        )
        self.node_silent = Gauge(
            "faultcast_node_silent",
            "1 while a node that sent samples has sent none for the silence limit; during_incident says "
            "whether an alert was open on it when it fell silent (it may be the failure itself).",
            ["node", "during_incident"],
            registry=r,
        )
        self.silent_nodes = Gauge(
            "faultcast_silent_nodes", "Nodes silent now (no sample for the silence limit).", registry=r
        )
        self.active_alerts = Gauge(
            "faultcast_active_alerts", "Alerts open now, by failure mode.", ["mode"], registry=r
        )
        self.alerts = Counter("faultcast_alerts", "Alerts raised, by failure mode.", ["mode"], registry=r)
        self.failures = Counter(
            "faultcast_failures",
            "Failures seen happen (FAILED events), by what showed them, whether an alert foresaw them, and "
            'the node ("" for a trainer\'s report; "other" past the first FAILURE_NODE_LABELS nodes).',
            ["evidence", "foreseen", "node"],
            registry=r,
        )
        self._failure_nodes: set[str] = set()  # the nodes the failures counter names so far
        self.flapping_nodes = Gauge(
            "faultcast_flapping_nodes",
            "Nodes whose collector streams keep breaking and reopening (FLAP_BREAKS within FLAP_WINDOW_S, "
            "service/failure_watch.py): logged by name, never counted towards a cut-off of the service.",
            registry=r,
        )

    def count_failure(self, evidence: str, foreseen: str, node: str) -> None:
        """One FAILED event. The node labels hardware evidence only (the page names the node to repair;
        a trainer's report drains nothing), and only the first FAILURE_NODE_LABELS nodes by name: later
        ones share "other", so a flood of node names cannot grow the series without bound."""
        if evidence == Evidence.TRAINER_REPORT.value:
            node = ""
        elif node not in self._failure_nodes:
            if len(self._failure_nodes) < FAILURE_NODE_LABELS:
                self._failure_nodes.add(node)
            else:
                node = "other"
        self.failures.labels(evidence, foreseen, node).inc()

    def flapping(self, node: str, now_flapping: bool, nodes_flapping: int) -> None:
        """FailureWatch's FlapListener: how many nodes flap now (the node is named in the log)."""
        self.flapping_nodes.set(nodes_flapping)

    def _add_ingest_and_scoring(self, r: CollectorRegistry) -> None:
        """Samples taken, refused and blanked; lag and clock skew; scoring latency."""
        self.samples = Counter(
            "faultcast_ingest_gpu_samples", "GPU samples accepted from collectors.", registry=r
        )
        self.node_samples = Counter(
            "faultcast_ingest_node_samples", "Node samples (messages) accepted from collectors.", registry=r
        )
        self.rejects = Counter(
            "faultcast_ingest_rejects", "Samples refused, by reason.", ["reason"], registry=r
        )
        self.blanked = Counter(
            "faultcast_ingest_values_blanked",
            "Single values blanked inside otherwise kept samples (infinity, negative counter, ...), by reason.",
            ["reason"],
            registry=r,
        )
        self.duplicates = Counter(
            "faultcast_ingest_duplicates",
            "Samples dropped as already stored (a collector's replay).",
            registry=r,
        )
        self.ingest_lag = Gauge(
            "faultcast_ingest_lag_seconds",
            "Arrival time minus event time of the latest accepted sample, by node; never negative (a sample "
            "stamped ahead of the service's clock counts 0 here and shows in faultcast_ingest_clock_ahead_seconds).",
            ["node"],
            registry=r,
        )
        self.clock_ahead = Gauge(
            "faultcast_ingest_clock_ahead_seconds",
            "How far the event time of the latest accepted sample was ahead of the service's clock, by node "
            "(0 when not ahead): the node's clock runs fast.",
            ["node"],
            registry=r,
        )
        self.scoring_latency = Histogram(
            "faultcast_scoring_latency_seconds",
            "From a sample's arrival to its GPUs' risks being scored.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )

    def _add_delivery_and_remediation(self, r: CollectorRegistry) -> None:
        """Alert subscriptions, remediations, their retries and the circuit breaker."""
        self.subscribers = Gauge("faultcast_subscribers", "Open alert subscriptions.", registry=r)
        self.remediations = Counter(
            "faultcast_remediations",
            "Remediations finished, by actuator and outcome (ok, failed after every retry, refused by the "
            "circuit breaker or a pause, joined: a failure on a node taken out lately, one incident).",
            ["actuator", "outcome"],
            registry=r,
        )
        # Pre-scheduled spares (service/remediation/spares/prescheduler.py). No provider label (one per
        # service, like the actuator's); every event at 0 from the start, so a service without spares shows zeros.
        self.spares = Counter(
            "faultcast_spares",
            "Spares readied during alerts, by event (asked, ready, handed_over, released, failed).",
            ["event"],
            registry=r,
        )
        for event in SPARE_EVENTS:
            self.spares.labels(event)
        # No actuator label (one actuator per service): faultcast_remediations_total names it.
        self.remediation_retries = Counter(
            "faultcast_remediation_retries",
            "Remediation attempts after a failed one (an actuator error or a not-ok outcome).",
            registry=r,
        )
        self.remediation_retries_pending = Gauge(
            "faultcast_remediation_retries_pending",
            "Remediations that failed and wait, in backoff, for their next attempt.",
            registry=r,
        )
        self.circuit_open = Gauge(
            "faultcast_remediation_circuit_open",
            "1 while the circuit breaker refuses to take more nodes out.",
            registry=r,
        )

    def _add_model(self, r: CollectorRegistry) -> None:
        """The model serving and its reloads."""
        self.model_info = Info(
            "faultcast_model", "The model serving now (version, training time, git revision).", registry=r
        )
        self.model_reloads = Counter(
            "faultcast_model_reloads", "Model reloads, by outcome (ok, rejected).", ["outcome"], registry=r
        )
        self.model_registry_events = Counter(
            "faultcast_model_registry_events",
            "The model registry's events since the service started, by event (added, promoted, rolled_back, "
            "shadowed, shadow_stopped).",
            ["event"],
            registry=r,
        )
        self.model_registry_refusals = Counter(
            "faultcast_model_registry_refusals",
            "Registry changes refused since the service started, by action (add, promote, rollback).",
            ["action"],
            registry=r,
        )
        self.shadow_steps = Counter(
            "faultcast_shadow_steps",
            "Node steps kept for the shadow comparison since the service started, by model (serving, challenger).",
            ["model"],
            registry=r,
        )
        self.shadow_over_threshold = Counter(
            "faultcast_shadow_over_threshold",
            "Shadowed node steps whose highest GPU risk reached the model's own threshold, by model "
            "(serving, challenger): how often each would alert.",
            ["model"],
            registry=r,
        )
        self.feature_drift_psi = Gauge(
            "faultcast_feature_drift_psi",
            "Population stability index of the scored feature rows of the last hours against the model's "
            "training rows, by feature group (the largest of its features'); 0.1 watch, 0.25 major. Absent "
            "when the model has no reference.json.",
            ["group"],
            registry=r,
        )
        self.feature_group_visible = Gauge(
            "faultcast_model_feature_group_visible",
            "Share of the serving model's features in the group whose inputs arrive in the samples "
            "received lately: 1 the group sees, 0 it is blind (faultcast calibrate and faultcast score "
            "name what to export for it); every group starts at 0.",
            ["group"],
            registry=r,
        )
        self.calibration_timestamp = Gauge(
            "faultcast_calibration_timestamp_seconds",
            "When `faultcast calibrate --apply` chose the serving threshold (unix seconds); 0 when the "
            "threshold serving did not come from calibration.",
            registry=r,
        )

    def _add_callers(self, r: CollectorRegistry) -> None:
        """Callers refused or held back."""
        self.auth_denied = Counter(
            "faultcast_auth_denied",
            "Calls refused by authentication or authorization, by reason (no_identity, unknown_token, "
            "role, wrong_node, wrong_job, ...).",
            ["reason"],
            registry=r,
        )
        self.throttled = Counter(
            "faultcast_throttled",
            "Times a caller was held back: push_rate and push_backlog (a Push stream waited), streams, "
            "calls, subscribers, health_watches, job_nodes, job_subscribers and spool_ids (a call refused "
            "with RESOURCE_EXHAUSTED).",
            ["what"],
            registry=r,
        )

    def _add_service_health(self, r: CollectorRegistry) -> None:
        """The scoring backlog, restarted threads, the state database."""
        self.backlog = Gauge(
            "faultcast_scoring_backlog", "Completed steps waiting for the scorer.", registry=r
        )
        self.thread_restarts = Counter(
            "faultcast_thread_restarts",
            "Background threads (scoring, cursors, remediator) that died on an error and were restarted.",
            ["thread"],
            registry=r,
        )
        self.state_write_failures = Counter(
            "faultcast_state_write_failures",
            "Writes to the state database that failed (full disk, I/O error), by what was written; each is "
            "kept and retried.",
            ["what"],
            registry=r,
        )
        self.states_saved = Counter(
            "faultcast_scoring_states_saved",
            "Nodes' scoring states saved (a restart goes on from them, replaying the journal after).",
            registry=r,
        )
        self.state_writable = Gauge(
            "faultcast_state_writable",
            "1 while the state database takes writes; 0 while they fail (health is NOT_SERVING then).",
            registry=r,
        )
        self.state_writable.set(1)
        self.state_writes_waiting = Gauge(
            "faultcast_state_writes_waiting",
            "Alert events kept in memory because the state database refused them, waiting to be written.",
            registry=r,
        )
        # The rolling archive of what was scored (service/archive/writer.py); set from its counts.
        self.archive_bytes = Gauge(
            "faultcast_archive_bytes", "Bytes the archive of scored samples holds on disk.", registry=r
        )
        self.archive_rows = Gauge(
            "faultcast_archive_rows",
            "GPU rows (one GPU, one model step) written to the archive since the service started.",
            registry=r,
        )
        self.archive_dropped = Gauge(
            "faultcast_archive_dropped_rows",
            "GPU rows the archive could not keep since the service started (its bound, a failed write).",
            registry=r,
        )
        self.archive_days = Gauge("faultcast_archive_days", "Settled days the archive holds.", registry=r)

    def _start_labelled_series_at_zero(self) -> None:
        # Series per node or GPU (risk, lag, silence) and per actuator (remediations, made by the
        # remediator that knows its actuator) come with their first value; the rest start at 0.
        for values, metric in (
            (REJECT_REASONS, self.rejects),
            (BLANK_REASONS, self.blanked),
            (AUTH_DENIED_REASONS, self.auth_denied),
            (THROTTLED_WHAT, self.throttled),
            (ALERT_MODES, self.alerts),
            (ALERT_MODES, self.active_alerts),
            (MODEL_RELOAD_OUTCOMES, self.model_reloads),
            (MODEL_REGISTRY_EVENTS, self.model_registry_events),
            (MODEL_REGISTRY_ACTIONS, self.model_registry_refusals),
            (SHADOW_MODELS, self.shadow_steps),
            (SHADOW_MODELS, self.shadow_over_threshold),
            (THREADS, self.thread_restarts),
            (STATE_WRITES, self.state_write_failures),
        ):
            for value in values:
                metric.labels(value)
        for foreseen in ("true", "false"):  # a node's own series start with its first failure
            self.failures.labels(Evidence.TRAINER_REPORT.value, foreseen, "")
        for tier in ALERT_TIERS:
            self.alerts_by_tier.labels(tier)
        for group in VISIBILITY_GROUPS:
            self.feature_group_visible.labels(group)


FAILURE_NODE_LABELS = 256
"""Nodes named by faultcast_failures_total; failures of further nodes count under node="other"."""

ALERT_TIERS = ("protect", "move")
"""The alert tiers' label values (faultcast_alerts_by_tier), the proto's AlertTier without the prefix."""


# Every metric family name as Prometheus exposes it: what rules and dashboards may use.
EXPORTED_NAMES: tuple[str, ...] = (
    "faultcast_failure_risk",
    "faultcast_failure_likely_mode",
    "faultcast_alert_threshold",
    "faultcast_alert_hold_threshold",
    "faultcast_alert_protect_threshold",
    "faultcast_alerts_by_tier",
    "faultcast_node_silent",
    "faultcast_failures_total",
    "faultcast_flapping_nodes",
    "faultcast_silent_nodes",
    "faultcast_active_alerts",
    "faultcast_alerts_total",
    "faultcast_ingest_gpu_samples_total",
    "faultcast_ingest_node_samples_total",
    "faultcast_ingest_rejects_total",
    "faultcast_ingest_values_blanked_total",
    "faultcast_ingest_duplicates_total",
    "faultcast_ingest_lag_seconds",
    "faultcast_ingest_clock_ahead_seconds",
    "faultcast_scoring_latency_seconds_bucket",
    "faultcast_scoring_latency_seconds_sum",
    "faultcast_scoring_latency_seconds_count",
    "faultcast_subscribers",
    "faultcast_remediations_total",
    "faultcast_remediation_retries_total",
    "faultcast_remediation_retries_pending",
    "faultcast_remediation_circuit_open",
    "faultcast_spares_total",
    "faultcast_model_info",
    "faultcast_model_reloads_total",
    "faultcast_model_registry_events_total",
    "faultcast_model_registry_refusals_total",
    "faultcast_shadow_steps_total",
    "faultcast_shadow_over_threshold_total",
    "faultcast_feature_drift_psi",
    "faultcast_model_feature_group_visible",
    "faultcast_calibration_timestamp_seconds",
    "faultcast_auth_denied_total",
    "faultcast_throttled_total",
    "faultcast_scoring_backlog",
    "faultcast_thread_restarts_total",
    "faultcast_state_write_failures_total",
    "faultcast_scoring_states_saved_total",
    "faultcast_state_writable",
    "faultcast_state_writes_waiting",
    "faultcast_archive_bytes",
    "faultcast_archive_rows",
    "faultcast_archive_dropped_rows",
    "faultcast_archive_days",
)
