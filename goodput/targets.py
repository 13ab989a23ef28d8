"""The goodput target at a job's costs, and what stands in its way.

The target: policy (b') keeps at least 95% effective training time, and loses at most half the
GPU-hours that (a) loses. Both are bounds on (b')'s lost time (wall time less useful time), so what
stands in the way is the part of that lost time over the tighter bound, and the bucket of lost time
that weighs most is the cost to cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter

from faultcast.goodput.engine import JobCosts
from faultcast.goodput.report import BUCKETS, seconds
from faultcast.goodput.study import PolicyResult, lost_s

TARGET_ETTR = 0.95
TARGET_LOST_SHARE_OF_A = 0.5


@dataclass(frozen=True)
class TargetCheck:
    """(b') against the target, in seconds of the job's wall time (means over replications)."""

    ettr: float
    lost_s: float  # (b')'s
    baseline_lost_s: float  # (a)'s
    wall_s: float

    @property
    def ettr_met(self) -> bool:
        return self.ettr >= TARGET_ETTR

    @property
    def lost_met(self) -> bool:
        return self.lost_s <= TARGET_LOST_SHARE_OF_A * self.baseline_lost_s

    @property
    def met(self) -> bool:
        return self.ettr_met and self.lost_met

    @property
    def allowed_lost_s(self) -> float:
        """The most (b') may lose and meet both halves of the target."""
        return min((1.0 - TARGET_ETTR) * self.wall_s, TARGET_LOST_SHARE_OF_A * self.baseline_lost_s)

    @property
    def excess_s(self) -> float:
        """Lost time over the target (0 when it is met)."""
        return max(0.0, self.lost_s - self.allowed_lost_s)


def check(a: PolicyResult, tuned: PolicyResult) -> TargetCheck:
    """(b') (`tuned`) against the target, with (a) as the baseline."""
    return TargetCheck(tuned.ettr, tuned.mean(lost_s), a.mean(lost_s), tuned.mean(attrgetter("wall_s")))


@dataclass(frozen=True)
class LostPart:
    """One bucket of a policy's lost time, and the costs behind it."""

    bucket: str  # Outcome field
    label: str
    lost_s: float  # mean over replications
    share: float  # of the policy's lost time
    behind: str  # the costs (and counts) that make it


def lost_parts(r: PolicyResult, costs: JobCosts, unmeasured: frozenset[str] = frozenset()) -> list[LostPart]:
    """The policy's lost time by bucket, largest first. `unmeasured` names the JobCosts fields that are
    assumed rather than measured; the text says so beside them."""

    def cost(name: str) -> str:
        note = " (not measured)" if name in unmeasured else ""
        return f"{name.removesuffix('_s')} {seconds(getattr(costs, name))}{note}"

    per_run = {
        "checkpoints": r.mean(lambda o: o.checkpoints),
        "crashes": r.mean(lambda o: o.crashes),
        "migrations": r.mean(lambda o: o.migrations),
        "false alarms": r.mean(lambda o: o.false_alarm_migrations),
    }
    behind = {
        "checkpoint_s": f"{per_run['checkpoints']:,.0f} checkpoints x {cost('checkpoint_s')}",
        "recompute_s": f"{per_run['crashes']:.1f} crashes x the work since the last checkpoint "
        f"(interval {'none' if math.isinf(r.interval_s) else seconds(r.interval_s)})",
        "restart_s": f"{per_run['crashes']:.1f} crashes x ({cost('detect_s')} + {cost('restart_s')})",
        "snapshot_s": f"{per_run['migrations']:.1f} migrations x {cost('snapshot_s')}",
        "migration_s": f"{per_run['migrations']:.1f} migrations x {cost('migrate_s')}",
        "false_alarm_s": f"{per_run['false alarms']:.1f} false alarms x ({cost('snapshot_s')} + {cost('migrate_s')})",
        "protection_s": f"{r.mean(lambda o: o.protected_crashes):.1f} warned crashes; every protect-tier warning x "
        "its span x (replica overhead + the readied spare's share)",
        "replication_s": f"{r.mean(lambda o: o.replica_restores):.1f} crashes restored from replicas; the "
        "replicas' overhead x the compute",
        "warm_pool_s": f"{r.mean(lambda o: o.warm_replacements):.1f} nodes replaced warm; the pool's GPUs x the run",
    }
    total = r.mean(lost_s)
    parts = []
    for bucket, label in BUCKETS:
        mean = r.mean(attrgetter(bucket))
        parts.append(LostPart(bucket, label, mean, mean / total if total > 0 else 0.0, behind[bucket]))
    return sorted(parts, key=lambda p: -p.lost_s)
