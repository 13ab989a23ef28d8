"""The grace timer drains no node whose alert cleared because the risk fell back: the
README promises it, and the probe saw it drain one. A node whose alert cleared because its
GPUs went dark still goes: that may be the failure itself."""

from __future__ import annotations

from pathlib import Path

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.remediation.remediator import Remediator
from faultcast.service.state.store import StateStore
from faultcast.v1 import alerts_pb2 as apb
from tests.attacks.remediation_parts import Clock, migrate_alert


def _cleared(opened: apb.Alert, reason: apb.ClearReason.ValueType) -> apb.Alert:
    return apb.Alert(
        node=opened.node,
        gpu=opened.gpu,
        state=apb.ALERT_STATE_CLEARED,
        kind=apb.EVENT_KIND_CLEARED,
        opened_id=opened.id,
        action=opened.action,
        clear_reason=reason,
    )


def test_no_drain_when_the_risk_fell_back_before_the_grace_period_ended(tmp_path: Path) -> None:
    store, clock = StateStore.in_dir(tmp_path), Clock()
    store.jobs.register("j1", ["a", "b"])
    actuator = NoopActuator()
    remediator = Remediator(store, actuator, ServiceMetrics(), grace_s=60.0, clock=clock)
    calm, dark = migrate_alert(store, "a"), migrate_alert(store, "b")
    remediator.on_alerts([calm, dark])
    cleared = store.alerts.append(
        [_cleared(calm, apb.CLEAR_REASON_RISK_FELL), _cleared(dark, apb.CLEAR_REASON_GPU_DARK)]
    )
    remediator.on_alerts(cleared)
    clock.now += 61
    remediator.run_once()
    assert [r.node for r in actuator.seen] == ["b"]
    store.close()
