"""A discrete-event simulation of one synchronous training job through failures and alerts.

The job computes in cycles of `interval_s` of compute followed by a blocking checkpoint write.
A failure that was not foreseen crashes it: the work since the last complete save is lost, the
crash goes unnoticed for `detect_s` (`evident_detect_s` for a failure that leaves evidence), then
the job restarts (`restart_s`) on a spare node. A policy that acts on alerts starts a snapshot
`react_s` after an alert; when the snapshot completes before the failure, the job restarts without
the doomed node (`migrate_s`) and the failure later hits an empty node. A failure before the
snapshot completes is a crash as above. A policy with a protect tier (`ProtectTier`) also acts on
the lower tier's warnings: a crash it warned of loses at most one replica interval, and every
warning is charged its replicas and readied spare. Every second of wall time lands in exactly one bucket of
`Outcome`, so the accounting adds up.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from enum import Enum

from faultcast.modes import FailureMode

# Failure modes whose failure shows in the telemetry or the node's stream the moment it happens: a
# critical Xid (48/94/95 HBM and SRAM, 74 NVLink, 79 off the bus after power, PCIe, cooling and
# detachment faults, 119/120 firmware), an InfiniBand port down, a host gone silent. Silent data
# corruption, software bugs and NCCL timeouts without a hardware cause show nothing: the job learns
# of them from its collective's timeout.
EVIDENT_MODES: frozenset[str] = frozenset(FailureMode) - {
    FailureMode.SILENT_DATA_CORRUPTION,
    FailureMode.SOFTWARE,
    FailureMode.NCCL_TIMEOUT,
}


def _check_numbers(settings: object, *, positive: str, unit: str = "") -> None:
    """ValueError for a field of the dataclass `settings` that is negative or not finite (None is
    allowed: not set), or for its field `positive` when it is not above 0."""
    for name in (f.name for f in dataclasses.fields(settings)):  # type: ignore[arg-type]
        value = getattr(settings, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number{unit} >= 0, got {value}")
    if getattr(settings, positive) <= 0:
        raise ValueError(f"{positive} must be positive")


@dataclass(frozen=True, slots=True)
class JobCosts:
    """What each event costs the job, in seconds of wall time; ValueError for a negative or non-finite
    one, or a checkpoint that costs nothing."""

    checkpoint_s: float  # a periodic checkpoint blocks training this long
    snapshot_s: float  # a predictive snapshot blocks training this long
    detect_s: float  # a crash goes unnoticed this long (collective timeout, health checks)
    restart_s: float  # after a crash: reschedule, re-initialise, load the last checkpoint
    migrate_s: float  # after a snapshot: the same planned restart on other nodes
    react_s: float  # from an alert to its snapshot starting (delivery, next agreement step)
    drain_s: float  # a drained node in which inspection finds nothing is back this long after
    # A crash whose failure leaves evidence the service turns into a FAILED event (a critical Xid, a
    # GPU lost, a node gone silent: EVIDENT_MODES) is noticed this long after it happens, the job
    # ending its collectives at once; None: like any other, after detect_s.
    evident_detect_s: float | None = None

    def detect_for(self, mode: str) -> float:
        """How long a crash of this failure mode goes unnoticed."""
        if self.evident_detect_s is not None and mode in EVIDENT_MODES:
            return self.evident_detect_s
        return self.detect_s

    def __post_init__(self) -> None:
        _check_numbers(self, positive="checkpoint_s", unit=" of seconds")


@dataclass(frozen=True, slots=True)
class JobFailure:
    """One failure during the job, and whether (and when) an alert named its node first."""

    time_s: float  # since the job started
    mode: str
    alert_s: float | None  # when an alert named its node (None: no alert)
    takes_node: bool  # hardware: the node leaves for repair and a spare replaces it
    repair_s: float  # how long the node is out once it failed
    protect_s: float | None = None  # when a protect-tier warning named its node (None: none did)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One run of the job: its length in wall seconds, its failures in time order, and the false alarms
    (alerts on nodes that do not fail). The same scenario is played under every policy."""

    wall_s: float
    failures: tuple[JobFailure, ...]
    false_alarms: tuple[float, ...]  # alerts on nodes that do not fail (times)
    protect_false_alarms: tuple[float, ...] = ()  # protect-tier warnings on nodes that do not fail

    def oracle(self, lead_s: float) -> Scenario:
        """Every failure known `lead_s` ahead, and no false alarm."""
        return Scenario(
            self.wall_s,
            tuple(
                JobFailure(f.time_s, f.mode, max(0.0, f.time_s - lead_s), f.takes_node, f.repair_s)
                for f in self.failures
            ),
            (),
        )


REPLICA_OVERHEAD = 0.0282
"""The share of training time buddy replicas cost at one a minute: bench/replicas.py, 256 MiB per rank,
3 ranks on this 2-core machine (docs/benchmarks.md); the host copy alone is 0.35%."""


@dataclass(frozen=True, slots=True)
class ProtectTier:
    """The protect tier's effect and price. While a warning lasts the job replicates its state to a
    buddy's memory every `replica_s`, so a failure it warned of (at least react_s ahead) loses at most
    that much work; the replicas cost `overhead` of training time, and the spare readied for the
    warning idles `spare_share` of the job's GPUs, both for as long as the warning lasts: until the
    failure, or `warning_s` for a warning on a node that does not fail. ValueError for a negative or
    non-finite value, or an interval that is not positive."""

    replica_s: float = 60.0
    overhead: float = REPLICA_OVERHEAD
    warning_s: float = 1800.0
    spare_share: float = 0.0

    def __post_init__(self) -> None:
        _check_numbers(self, positive="replica_s")

    def price_s(self, warned_s: float) -> float:
        """Training time a warning of `warned_s` costs (replicas, and the idle spare as the job's share)."""
        return warned_s * (self.overhead + self.spare_share)


@dataclass(frozen=True, slots=True)
class NodeReplacement:
    """Buddy replicas every `replica_s` and a lost node replaced from a warm pool. A crash loses only
    the work since the newest replica (silent data corruption aside: its replicas are as wrong as
    the state) and is back `replace_s` after it is noticed: in place for a failure that takes no
    node (the agents restart their workers), on a warm spare for one that does while one is free
    (`warm_pool` of them, each re-armed `rearm_s` after it is taken), else the cold path
    (`restart_s`). The replicas cost `overhead` of the training time; the warm pool's idle GPUs,
    `pool_share` of the job's, are charged for the whole run. ValueError for a negative or
    non-finite value, or a replica interval that is not positive."""

    replica_s: float = 60.0
    overhead: float = REPLICA_OVERHEAD
    replace_s: float = 60.0
    warm_pool: int = 1
    rearm_s: float = 300.0
    pool_share: float = 0.0

    def __post_init__(self) -> None:
        _check_numbers(self, positive="replica_s")


@dataclass(frozen=True, slots=True)
class Policy:
    """How the job protects itself: periodic checkpoints every `interval_s` of compute, and whether it
    snapshots and migrates on alerts. ValueError for an interval that is not positive."""

    name: str
    interval_s: float  # compute between periodic checkpoints (math.inf: none)
    acts_on_alerts: bool
    protect: ProtectTier | None = None  # acts on protect-tier warnings too
    replacement: NodeReplacement | None = None  # buddy replicas and one node replaced

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"{self.name}: the checkpoint interval must be positive, got {self.interval_s}")


@dataclass
class Outcome:
    """Where the wall time went, in seconds, and what happened."""

    wall_s: float = 0.0
    useful_s: float = 0.0  # compute whose result was kept
    recompute_s: float = 0.0  # compute lost to crashes (done again later)
    checkpoint_s: float = 0.0
    snapshot_s: float = 0.0  # snapshots for alerts on nodes that did fail (or whose failure came)
    migration_s: float = 0.0  # planned restarts after those snapshots
    restart_s: float = 0.0  # crash detection and restarts
    false_alarm_s: float = 0.0  # snapshots and planned restarts for alerts on healthy nodes
    protection_s: float = 0.0  # protect-tier warnings: replicas and readied spares, as training time
    replication_s: float = 0.0  # periodic buddy replicas' overhead, as training time
    warm_pool_s: float = 0.0  # the warm pool's idle GPUs, as the job's share of the wall time
    spare_wait_s: float = 0.0  # part of the restarts and migrations: no spare node was free
    crashes: int = 0
    migrations: int = 0
    false_alarm_migrations: int = 0
    averted: int = 0  # failures that hit a node the job had already left
    late_alerts: int = 0  # alerts whose snapshot the failure overtook
    checkpoints: int = 0
    protected_crashes: int = 0  # crashes a protect-tier warning had bounded to one replica interval
    replica_restores: int = 0  # crashes that went on from the newest buddy replica
    warm_replacements: int = 0  # of which on a warm spare (the others in place, or cold)

    @property
    def ettr(self) -> float:
        """Effective training time ratio: useful time over wall time."""
        return self.useful_s / self.wall_s if self.wall_s else math.nan

    @property
    def accounted_s(self) -> float:
        """The wall time the categories add up to (excludes spare_wait_s, which is part of restarts
        and migrations); equals wall_s for a run the engine finished."""
        return (
            self.useful_s
            + self.recompute_s
            + self.checkpoint_s
            + self.snapshot_s
            + self.migration_s
            + self.restart_s
            + self.false_alarm_s
            + self.protection_s
            + self.replication_s
            + self.warm_pool_s
        )


class _State(Enum):
    RUNNING = "running"
    SNAPSHOT = "snapshot"
    DOWN = "down"


class SparePool:
    """Spare nodes: a replacement is free now, or when the next node out comes back."""

    def __init__(self, spares: int) -> None:
        if spares < 0:
            raise ValueError(f"spares must be >= 0, got {spares}")
        self.free = spares
        self.out: list[float] = []  # return times of nodes out for repair or inspection

    def take(self, now_s: float) -> float:
        """The time a spare is available to replace a node, at or after now."""
        while self.out and self.out[0] <= now_s:
            heapq.heappop(self.out)
            self.free += 1
        if self.free > 0:
            self.free -= 1
            return now_s
        if not self.out:
            return math.inf  # no spares at all and nothing coming back
        return max(now_s, heapq.heappop(self.out))

    def send_out(self, back_s: float) -> None:
        """A node leaves the job's pool; it is free again at `back_s` (for take())."""
        heapq.heappush(self.out, back_s)


@dataclass
class _Job:
    policy: Policy
    costs: JobCosts
    pool: SparePool
    out: Outcome
    t: float = 0.0
    work: float = 0.0
    saved: float = 0.0
    cycle: float = 0.0  # compute since the last save
    writing: float | None = None  # seconds into a checkpoint write
    state: _State = _State.RUNNING
    snapshot_at: float | None = None  # a pending snapshot starts then
    snapshot_end: float = 0.0
    down_until: float = 0.0
    down_kind: str = "restart_s"
    pending: list[int] = field(default_factory=list)  # failure indexes (-1: a false alarm) to drain
    warm_ready: list[float] = field(default_factory=list)  # when each warm spare is (again) ready
    drained: set[int] = field(default_factory=set)

    # -- time passing ----------------------------------------------------------------------

    def run_to(self, until: float) -> None:
        """Compute and write checkpoints from t to until."""
        tau, delta = self.policy.interval_s, self.costs.checkpoint_s
        dt = until - self.t
        while dt > 0:
            if self.writing is not None:
                rest = delta - self.writing
                if dt < rest:
                    self.writing += dt
                    self.out.checkpoint_s += dt
                    break
                self.out.checkpoint_s += rest
                dt -= rest
                self._saved_checkpoint()
                continue
            rest = tau - self.cycle
            if dt < rest:
                self.work += dt
                self.cycle += dt
                break
            self.work += rest
            dt -= rest
            self.cycle = tau
            # Whole (write, compute) cycles at once: a 54-day job has thousands.
            whole = int(dt // (delta + tau))
            if whole:
                self.saved = self.work + (whole - 1) * tau
                self.work += whole * tau
                self.out.checkpoint_s += whole * delta
                self.out.checkpoints += whole
                dt -= whole * (delta + tau)
            self.writing = 0.0
        self.t = until

    def _saved_checkpoint(self) -> None:
        self.writing = None
        self.saved = self.work
        self.cycle = 0.0
        self.out.checkpoints += 1

    def pass_to(self, until: float) -> None:
        """Advance the clock in any state, booking the time to its bucket."""
        if self.state is _State.RUNNING:
            self.run_to(until)
            return
        spent = until - self.t
        if self.state is _State.SNAPSHOT:
            bucket = "false_alarm_s" if self._all_false() else "snapshot_s"
        else:
            bucket = self.down_kind
        setattr(self.out, bucket, getattr(self.out, bucket) + spent)
        self.t = until

    def next_internal(self) -> float:
        if self.state is _State.RUNNING:
            return self.snapshot_at if self.snapshot_at is not None else math.inf
        if self.state is _State.SNAPSHOT:
            return self.snapshot_end
        return self.down_until

    def on_internal(self) -> None:
        if self.state is _State.DOWN:
            self.state = _State.RUNNING
            self.cycle, self.writing = 0.0, None
        elif self.state is _State.SNAPSHOT:
            self.saved = self.work
            self._migrate()
        elif self.writing is not None and self.t + (self.costs.checkpoint_s - self.writing) > self.t + 1e-9:
            # A checkpoint is being written: it is the snapshot once it completes. (A rest the clock
            # cannot tell from now, as a year into a run, is the write ending now: else this repeats.)
            self.snapshot_at = self.t + (self.costs.checkpoint_s - self.writing)
        else:
            if self.writing is not None:  # the write ends now (to rounding)
                self._saved_checkpoint()
            self.snapshot_at = None
            if self.work == self.saved:  # nothing since the last save: migrate at once
                self._migrate()
            else:
                self.state = _State.SNAPSHOT
                self.snapshot_end = self.t + self.costs.snapshot_s

    # -- events ----------------------------------------------------------------------------

    def on_alert(self, index: int) -> None:
        """An alert names a node: a failure's (index >= 0) or a healthy one's (-1)."""
        if self.state is _State.DOWN:
            # The job is restarting anyway: it comes back without the node.
            spare = self._drain(index)
            self.out.spare_wait_s += max(0.0, spare - self.down_until)
            self.down_until = max(self.down_until, spare)
            return
        self.pending.append(index)
        if self.state is _State.RUNNING and self.snapshot_at is None:
            self.snapshot_at = self.t + self.costs.react_s

    def on_failure(self, index: int, failure: JobFailure) -> None:
        if index in self.drained:
            self.out.averted += 1
            return
        if index in self.pending:
            self.out.late_alerts += 1
        self.out.crashes += 1
        if self.state is not _State.DOWN:
            lost = self.work - self.saved
            tier = self.policy.protect
            if (
                tier is not None
                and failure.protect_s is not None
                and failure.protect_s + self.costs.react_s <= self.t
            ):
                # Warned in time: the newest replica in a buddy's memory is at most one interval old.
                if lost > tier.replica_s:
                    lost = tier.replica_s
                    self.saved = self.work - lost
                self.out.protected_crashes += 1
            replacement = self.policy.replacement
            if replacement is not None and failure.mode != FailureMode.SILENT_DATA_CORRUPTION:
                # The newest replica is as old as the time into the current replica interval.
                since = self.t % replacement.replica_s
                if lost > since:
                    lost = since
                    self.saved = self.work - lost
                self.out.replica_restores += 1
            self.out.recompute_s += lost
            self.work = self.saved
        spare = self.t
        for other in self.pending:
            if other != index:
                spare = max(spare, self._drain(other))
        self.pending.clear()
        self.snapshot_at, self.writing, self.cycle = None, None, 0.0
        if failure.takes_node:
            self.pool.send_out(self.t + failure.repair_s)
            spare = max(spare, self.pool.take(self.t))
        ready = self.t + self.costs.detect_for(failure.mode)
        self.out.spare_wait_s += max(0.0, spare - ready)
        ready = max(ready, spare)
        restarted = ready + self._restart_s(failure, ready)
        self.down_until = max(self.down_until, restarted) if self.state is _State.DOWN else restarted
        self.state, self.down_kind = _State.DOWN, "restart_s"

    def _restart_s(self, failure: JobFailure, ready: float) -> float:
        """How long the restart after a crash noticed at `ready` takes: the replacement's time in place
        or on a free warm spare (taken, and re-armed later), else the cold path."""
        replacement = self.policy.replacement
        if replacement is None or failure.mode == FailureMode.SILENT_DATA_CORRUPTION:
            return self.costs.restart_s
        if not failure.takes_node:
            return replacement.replace_s
        if self.warm_ready:
            slot = min(range(len(self.warm_ready)), key=self.warm_ready.__getitem__)
            if self.warm_ready[slot] <= ready:
                self.warm_ready[slot] = ready + replacement.rearm_s
                self.out.warm_replacements += 1
                return replacement.replace_s
        return self.costs.restart_s

    def _all_false(self) -> bool:
        return bool(self.pending) and all(i < 0 for i in self.pending)

    def _drain(self, index: int) -> float:
        """Take the node out of the job; returns when a spare can replace it. A failing node
        comes back once repaired after its failure (booked then); a healthy one after inspection."""
        if index >= 0:
            self.drained.add(index)
        else:
            self.pool.send_out(self.t + self.costs.drain_s)
        return self.pool.take(self.t)

    def _migrate(self) -> None:
        all_false = self._all_false()
        spare = self.t
        for index in self.pending:
            spare = max(spare, self._drain(index))
        self.pending.clear()
        self.out.spare_wait_s += spare - self.t
        self.down_until = spare + self.costs.migrate_s
        self.state = _State.DOWN
        self.down_kind = "false_alarm_s" if all_false else "migration_s"
        if all_false:
            self.out.false_alarm_migrations += 1
        else:
            self.out.migrations += 1


def simulate(scenario: Scenario, policy: Policy, costs: JobCosts, spares: int) -> Outcome:
    """Run the job through the scenario's wall time under the policy."""
    out = Outcome(wall_s=scenario.wall_s)
    job = _Job(policy, costs, SparePool(spares), out)
    if policy.replacement is not None:
        job.warm_ready = [0.0] * policy.replacement.warm_pool
    # (time, order, kind, index): at equal times a failure comes before an alert.
    events: list[tuple[float, int, int]] = []
    for i, f in enumerate(scenario.failures):
        events.append((f.time_s, 0, i))
        if policy.acts_on_alerts and f.alert_s is not None and f.alert_s < f.time_s:
            events.append((f.alert_s, 1, i))
    if policy.acts_on_alerts:
        events.extend((t, 2, -1) for t in scenario.false_alarms)
    events.sort()
    position = 0
    while True:
        external = events[position][0] if position < len(events) else math.inf
        internal = job.next_internal()
        now = min(external, internal, scenario.wall_s)
        job.pass_to(now)
        if now >= scenario.wall_s:
            break
        if internal <= external:
            job.on_internal()
            continue
        _, kind, index = events[position]
        position += 1
        if kind == 0:
            failure = scenario.failures[index]
            if index in job.drained:  # it fails out of the job, under inspection: repair from now
                job.pool.send_out(failure.time_s + (failure.repair_s if failure.takes_node else 0.0))
            job.on_failure(index, failure)
        else:
            job.on_alert(index)
    out.useful_s = job.work
    if policy.protect is not None:
        _charge_protection(scenario, policy.protect, costs.snapshot_s, out)
    if policy.replacement is not None:
        _charge_replacement(policy.replacement, out)
    return out


def _charge_replacement(replacement: NodeReplacement, out: Outcome) -> None:
    """The replicas' overhead on the compute, and the warm pool's idle GPUs over the whole run, taken
    from the kept compute (as protect-tier warnings are)."""
    out.replication_s = min(replacement.overhead * out.useful_s, out.useful_s)
    out.useful_s -= out.replication_s
    out.warm_pool_s = min(replacement.pool_share * out.wall_s, out.useful_s)
    out.useful_s -= out.warm_pool_s


def _charge_protection(scenario: Scenario, tier: ProtectTier, snapshot_s: float, out: Outcome) -> None:
    """The warnings' price, taken from the kept compute: each failure's warning lasts until the
    failure, a false one `warning_s` (clipped to the run); every warning also takes one snapshot
    (SNAPSHOT_ONLY asks for one). A small share of compute, so its interplay with crashes is left out."""
    spans = [f.time_s - f.protect_s for f in scenario.failures if f.protect_s is not None]
    spans += [min(tier.warning_s, scenario.wall_s - t) for t in scenario.protect_false_alarms]
    price = min(tier.price_s(sum(spans)) + len(spans) * snapshot_s, out.useful_s)
    out.protection_s += price
    out.useful_s -= price
