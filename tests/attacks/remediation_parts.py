"""What the remediation attack tests share: a clock the test moves, and a snapshot-and-migrate
alert in the store."""

from __future__ import annotations

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
