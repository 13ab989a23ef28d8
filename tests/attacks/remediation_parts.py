"""What the remediation attack tests share: clocks the test moves, a remediator as a process starts
one, and a snapshot-and-migrate alert in the store."""

from __future__ import annotations

from pathlib import Path

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import CircuitBreaker, NoopActuator
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb


class Clock:
    """A clock that stands still until the test moves `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def migrate_alert(
    store: StateStore,
    node: str,
    action: apb.RecommendedAction.ValueType = apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE,
) -> apb.Alert:
    """A stored OPEN alert on `node` recommending `action`, by default snapshot-and-migrate (what a
    grace timer drains)."""
    alert = apb.Alert(
        node=node,
        gpu=1,
        mode=apb.FAILURE_MODE_HBM_WEAR,
        risk=0.9,
        action=action,
        state=apb.ALERT_STATE_OPEN,
    )
    return store.alerts.append([alert])[0]


WALL_S = 1_750_000_000.0


class Clocks:
    """A monotonic clock (`mono`) and a wall clock (`wall`); a restart starts the monotonic clock
    again from a small value, as a reboot does, while the wall clock goes on."""

    def __init__(self) -> None:
        self.now_mono, self.now_wall = 1000.0, WALL_S

    def mono(self) -> float:
        return self.now_mono

    def wall(self) -> float:
        return self.now_wall

    def advance(self, seconds: float) -> None:
        self.now_mono += seconds
        self.now_wall += seconds

    def restart(self, down_s: float) -> None:
        self.now_mono = 7.0
        self.now_wall += down_s


def remediator_on(
    path: Path, clocks: Clocks, grace_s: float, *, breaker: CircuitBreaker | None = None
) -> tuple[Remediator, NoopActuator, StateStore]:
    """A remediator as a new process starts one: its own connection to the database file in `path`."""
    store, actuator = StateStore.in_dir(path), NoopActuator()
    remediator = Remediator(
        store,
        actuator,
        ServiceMetrics(),
        grace_s=grace_s,
        breaker=breaker,
        clock=clocks.mono,
        wall=clocks.wall,
    )
    return remediator, actuator, store
