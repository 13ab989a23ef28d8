"""What a service is told to do: every tunable of `Service`, with its default, checked in one place.

`faultcast serve` builds one from its flags; tests and the demo build one with the few fields they
change (`ServiceConfig(grace_s=3600.0)`). The collaborators (the actuator, the access policy, the
metrics registry) are not configuration: they are passed to `Service` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from faultcast.service.remediation.actuators import CircuitBreaker, RetryPolicy
from faultcast.service.rpc.limits import CallerLimits
from faultcast.service.rpc.validation import Limits

if TYPE_CHECKING:  # the model package loads LightGBM: `faultcast serve`'s flags read defaults from here
    from faultcast.model.alert_content import ActionPolicy


def _default_actions() -> ActionPolicy:
    from faultcast.model.alert_content import ActionPolicy

    return ActionPolicy()


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """The service's tunables. Raises ValueError on a value the service cannot run with (nested
    parts, `RetryPolicy` and `CallerLimits`, check their own when they are built)."""

    # Which samples are taken (clock skew, age, the fleet's inventory); gpus_per_node is the
    # model's, whatever is given here.
    limits: Limits = field(default_factory=Limits)
    # Grid steps a node's samples may arrive late and still be placed (faultcast.model.features.online).
    lateness_steps: int = 1
    # Remediate this long after a snapshot-and-migrate alert without SNAPSHOT_DONE.
    grace_s: float = 300.0
    # The circuit breaker: at most `max_drains` distinct nodes taken out per `drain_window_s`.
    max_drains: int = 4
    drain_window_s: float = 3600.0
    # When a failed remediation is tried again, and how often.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Which action an alert recommends (watch, snapshot, snapshot and migrate).
    actions: ActionPolicy = field(default_factory=_default_actions)
    # Nodes the scorer keeps state for; samples of more are refused.
    max_nodes: int = 100_000
    # Per-caller rates and caps (streams, calls, subscribers, health watches, backlog).
    caller_limits: CallerLimits = field(default_factory=CallerLimits)
    # Model steps without a sample after which a node counts as silent (its alerts clear).
    silent_after_steps: int = 5
    # A node's scoring state is saved every this many scored steps (and whenever its alerts change):
    # a restart replays at most this many steps of its samples from the journal.
    checkpoint_steps: int = 15
    # A failure that happened (a FAILED event) holds its GPU, or its node, this long: the evidence
    # that follows it (the "GPU lost" after the Xid 79, every rank reporting one death) is folded in.
    failure_hold_s: float = 600.0
    # A node taken out of service is not taken out again within this long, whatever the alert: the
    # Xid, the silence after it and the alert that foresaw them are one incident, one drain (its jobs
    # were requeued once; repair takes longer). A failure stored and never remediated (a kill came
    # between) is remediated at the next start if it is this recent.
    incident_s: float = 3600.0
    # A node whose collector stream broke and that opened none again within this long has failed
    # (a collector stopped on purpose says goodbye and never counts; this is for crashes and blips).
    silence_grace_s: float = 2.0
    # The service pings every stream's peer this often, and a peer that answers a ping not within
    # 1.5 times this long is gone (a node powered off or hung sends no reset): with the grace, a node
    # that stops answering is FAILED within 2.5 x keepalive_s + silence_grace_s, and one more grace
    # when others broke with it; when half the fleet broke at once (a cut-off of the service), 30 s
    # (CUT_REJOIN_S) after some node is heard again.
    keepalive_s: float = 1.0
    # The sample journal holds at most this many bytes: past half of it every node it holds samples
    # of is saved (their segments can go), and at it a sample is scored but not journalled (a restart
    # before its node's next save loses it; logged once, counted in faultcast_state_write_failures).
    # A thousand nodes at one 19 KB sample a second fill under a quarter of it between saves.
    journal_bytes: int = 64 << 30
    # A node whose samples since its last save pass this many journal bytes is saved at once (a
    # node at 1 Hz writes about 17 MB between its saves every checkpoint_steps of 60 s).
    journal_node_bytes: int = 64 << 20
    # The rolling archive of what was scored, in the training data format (service/archive/writer.py):
    # in `archive/` beside the state database unless `archive_dir` says, at most `archive_days` days
    # and `archive_bytes` bytes; a day is settled (merged into one file) `archive_settle_s` of event
    # time after it ends. Off with archive=False.
    archive: bool = True
    archive_dir: Path | None = None
    archive_days: float = 90.0
    archive_bytes: int = 20 << 30
    archive_settle_s: float = 3600.0
    # The scheduled retrain (service/retrain_schedule.py): every `retrain_every_s` seconds (0: never),
    # `faultcast retrain` with these flags on the archive and label log, the challenger shadowed.
    retrain_every_s: float = 0.0
    retrain_flags: tuple[str, ...] = ()
    # Each scheduled retrain continues the model serving at that moment (`faultcast retrain --warm-start`).
    retrain_warm_start: bool = False

    def __post_init__(self) -> None:
        CircuitBreaker.check(self.max_drains, self.drain_window_s)
        if self.failure_hold_s < 0 or self.silence_grace_s <= 0 or self.keepalive_s <= 0:
            raise ValueError(
                f"failure_hold_s must be >= 0, silence_grace_s and keepalive_s > 0; got {self.failure_hold_s}, "
                f"{self.silence_grace_s} and {self.keepalive_s}"
            )
        if self.incident_s <= 0:
            raise ValueError(f"incident_s must be positive, not {self.incident_s}")
        if self.checkpoint_steps < 1:
            raise ValueError(f"checkpoint_steps must be at least 1, not {self.checkpoint_steps}")
        if self.retrain_every_s < 0 or (self.retrain_every_s and not self.archive):
            raise ValueError(
                f"retrain_every_s must be >= 0 and needs the archive; got {self.retrain_every_s} "
                f"with the archive {'on' if self.archive else 'off'}"
            )
        if self.archive_days <= 0 or self.archive_bytes <= 0:
            raise ValueError(
                f"archive_days and archive_bytes must be positive; got {self.archive_days} and {self.archive_bytes}"
            )
        if self.journal_bytes <= 0 or self.journal_node_bytes <= 0:
            raise ValueError(
                f"journal_bytes and journal_node_bytes must be positive; got {self.journal_bytes} and "
                f"{self.journal_node_bytes}"
            )

    def breaker(self) -> CircuitBreaker:
        """A new circuit breaker with this configuration's limits."""
        return CircuitBreaker(self.max_drains, self.drain_window_s)
