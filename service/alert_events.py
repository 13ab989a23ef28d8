"""What an alert event says: the contract's names for failure modes and clear reasons (an action is
already its contract number, faultcast.actions), and the OPENED, UPDATED and CLEARED messages the
alert book stores.

An OPENED or UPDATED event carries the whole alert (mode, risk, time to failure as a range, top
contributions, action, model), built by model/alert_content.py as `faultcast score` builds its rows,
from what the scorer's heads said of the row (the step's `heads`): no head runs twice for an alert.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from faultcast.actions import Action
from faultcast.model.alert_content import ActionPolicy, AlertContent, describe, ttf_edges
from faultcast.model.artifact import FaultModel
from faultcast.model.incidents import CloseReason, Incident
from faultcast.modes import FailureMode
from faultcast.service.model_info import model_info
from faultcast.service.scoring import ScoredStep, model_version
from faultcast.v1 import alerts_pb2 as apb

# The contract's name for each failure mode comes from the mode itself (faultcast.modes).
MODE_TO_PB: dict[str, apb.FailureMode.ValueType] = {
    m.value: apb.FailureMode.Value(m.proto_name) for m in FailureMode
}
PB_TO_MODE = {v: k for k, v in MODE_TO_PB.items()}
CLEAR_TO_PB: dict[CloseReason, apb.ClearReason.ValueType] = {
    CloseReason.RISK_FELL: apb.CLEAR_REASON_RISK_FELL,
    CloseReason.GPU_DARK: apb.CLEAR_REASON_GPU_DARK,
    CloseReason.NODE_SILENT: apb.CLEAR_REASON_NODE_SILENT,
}


def mode_of(alert: apb.Alert) -> str:
    """The alert's failure mode as faultcast names it ("unknown" for one the contract lacks)."""
    return PB_TO_MODE.get(alert.mode, "unknown")


def band(ttf_s: float, bands_s: Sequence[float]) -> int:
    """The band of a median time to failure: 0 under the first bound (5 min), 1 under the next, ...;
    len(bands_s) beyond the last or unknown. An open alert is updated when it enters a nearer one."""
    return int(np.searchsorted(bands_s, ttf_s, side="right")) if np.isfinite(ttf_s) else len(bands_s)


class EventWriter:
    """Builds one model's alert events; a new model gets a new writer."""

    def __init__(self, model: FaultModel, actions: ActionPolicy, top_features: int) -> None:
        self.model, self.actions, self.top_features = model, actions, top_features
        self.version = model_version(model)
        self.info = model_info(model)
        self.g = model.feature_config.gpus_per_node
        self.ttf_edges: list[float] = ttf_edges(model.horizon_s).tolist()
        # Alerts open at the protect tier's threshold when there is one; the move tier's threshold
        # decides when one rises to MOVE, and below it no alert asks for a migration.
        self.move_at = model.threshold if model.protect_threshold is not None else 0.0

    def band(self, ttf_s: float) -> int:
        return band(ttf_s, self.ttf_edges[1:])

    def content(self, s: ScoredStep, gpu: int) -> AlertContent:
        """What an alert says of the GPU's row: from the heads the scorer read for it when it did
        (every row near an alert), else read here (a step scored elsewhere)."""
        row = s.features[gpu][None, :]
        (content,) = describe(
            self.model,
            row,
            risk=np.asarray([s.risk[gpu]]),
            heads=s.heads.get(gpu),
            top=self.top_features,
            actions=self.actions,
            move_at=self.move_at,
        )
        return content

    def tier(self, risk: float) -> apb.AlertTier.ValueType:
        """The tier a score puts an alert at: MOVE once it reaches the move tier's threshold."""
        return apb.ALERT_TIER_MOVE if risk >= self.model.threshold else apb.ALERT_TIER_PROTECT

    def event(
        self, s: ScoredStep, incident: Incident, mode: str, content: AlertContent, kind: int
    ) -> apb.Alert:
        """An OPENED or UPDATED event of the incident saying `content`, as of step `s`."""
        alert = apb.Alert(
            node=s.node,
            gpu=incident.gpu,
            gpu_uuid="" if incident.node_level else s.uuids[incident.gpu],
            mode=MODE_TO_PB.get(mode, apb.FAILURE_MODE_UNSPECIFIED),
            risk=content.risk,
            top_features=[
                apb.FeatureContribution(feature=n, value=v, contribution=c)
                for n, v, c in content.top_features
            ],
            action=apb.RecommendedAction.ValueType(content.action.value),
            state=apb.ALERT_STATE_OPEN,
            kind=kind,  # type: ignore[arg-type]
            time_unix_nano=int(s.time_s * 1e9),
            model_version=self.version,
            model=self.info,
            gpus=sorted(slot % self.g for slot in incident.slots),
            tier=self.tier(content.risk),
        )
        if content.ttf_s is not None:
            p10, p50, p90 = content.ttf_s
            alert.time_to_failure_seconds = p50
            alert.time_to_failure.CopyFrom(
                apb.TimeToFailure(
                    reference_time_unix_nano=alert.time_unix_nano,
                    p10_seconds=p10,
                    p50_seconds=p50,
                    p90_seconds=p90,
                    risk_within=[
                        apb.RiskWithin(seconds=t, risk=r)
                        for t, r in zip(self.ttf_edges[1:], content.risk_within, strict=True)
                    ],
                )
            )
        return alert

    def opened(self, s: ScoredStep, incident: Incident) -> tuple[apb.Alert, int]:
        """The OPENED event, with the content of the highest-risk GPU that opened the incident, and
        the band of that GPU's median time to failure."""
        gpus = [slot % self.g for slot in incident.slots_at_open]
        best = max(gpus, key=lambda gpu: float(s.risk[gpu]))
        alert = self.event(s, incident, incident.mode, self.content(s, best), apb.EVENT_KIND_OPENED)
        return alert, self.band(float(s.ttf_s[best]))

    def updated(
        self, s: ScoredStep, incident: Incident, gpu: int, mode: str, action: Action, latest: apb.Alert
    ) -> apb.Alert:
        """The UPDATED event of the alert whose newest event is `latest`: the GPU's content, with the
        confirmed `mode` and the `action` it asks for (never weaker than before)."""
        content = self.content(s, gpu)
        content = AlertContent(
            mode,
            content.mode_probability,
            content.risk,
            content.risk_within,
            content.ttf_s,
            content.top_features,
            action,
        )
        update = self.event(s, incident, mode, content, apb.EVENT_KIND_UPDATED)
        update.tier = max(update.tier, latest.tier or apb.ALERT_TIER_MOVE)  # no tier: older than tiers
        update.opened_id = latest.opened_id
        if latest.gpu_uuid and not update.gpu_uuid:
            update.gpu_uuid = latest.gpu_uuid
        return update

    def cleared(
        self, incident: Incident, latest: apb.Alert, node: str, time_s: float, s: ScoredStep | None, text: str
    ) -> apb.Alert:
        """The CLEARED event of a tracked alert whose newest event is `latest` (on `node`), at the
        risk its GPUs have in step `s` (0 without one: the node fell silent)."""
        gpus = sorted(latest.gpus)
        risk = 0.0
        if s is not None:
            present = [g for g in gpus if 0 <= g < self.g and s.present[g]]
            risk = max((float(s.risk[g]) for g in present), default=0.0)
        reason = incident.reason or CloseReason.RISK_FELL
        return apb.Alert(
            node=latest.node or node,
            gpu=incident.gpu,
            gpu_uuid=latest.gpu_uuid,
            mode=latest.mode,
            risk=risk,
            action=latest.action,
            state=apb.ALERT_STATE_CLEARED,
            kind=apb.EVENT_KIND_CLEARED,
            time_unix_nano=int(time_s * 1e9),
            model_version=self.version,
            model=self.info,
            opened_id=latest.opened_id,
            cleared_reason=text or reason.value,
            clear_reason=CLEAR_TO_PB[reason],
            gpus=gpus,
            tier=latest.tier,
        )

    def restored_cleared(
        self, alert: apb.Alert, time_s: float, text: str, reason: apb.ClearReason.ValueType
    ) -> apb.Alert:
        """The CLEARED event of an alert restored at start and never scored since (so not tracked)."""
        return apb.Alert(
            node=alert.node,
            gpu=alert.gpu,
            gpu_uuid=alert.gpu_uuid,
            mode=alert.mode,
            action=alert.action,
            state=apb.ALERT_STATE_CLEARED,
            kind=apb.EVENT_KIND_CLEARED,
            time_unix_nano=int(time_s * 1e9),
            model_version=self.version,
            model=self.info,
            opened_id=alert.opened_id,
            cleared_reason=text,
            clear_reason=reason,
            gpus=alert.gpus,
            tier=alert.tier,
        )
