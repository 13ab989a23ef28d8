"""FAILED events: a failure that happened, as an alert event of its own (proto: EVENT_KIND_FAILED).

The event names what showed it (Failure.evidence and its words), the most likely failure mode that
evidence points to, and the alerts open at that moment that foresaw it (`foreseen_by`): what tells a
failure the model foresaw from one nobody did. Evidence on a GPU was foreseen only by the alerts on
that GPU (its own, or a node-level alert the GPU joined); node-level evidence (a port, the node silent,
a trainer's report) by every alert open on the node. Hardware evidence takes the node out of service
(`drains_node`); a trainer's report does not (a dead rank may be a software bug), nor Xid 94, which
NVIDIA's catalogue answers with an application restart (faultcast.failure_signs.drains_node).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from faultcast.failure_signs import Evidence, FailureSign, drains_node
from faultcast.modes import FailureMode
from faultcast.v1 import alerts_pb2 as apb
from faultcast.xid_catalogue import lookup

EVIDENCE_TO_PB: dict[Evidence, apb.FailureEvidence.ValueType] = {
    Evidence.XID: apb.FAILURE_EVIDENCE_XID,
    Evidence.GPU_LOST: apb.FAILURE_EVIDENCE_GPU_LOST,
    Evidence.NVML_UNREACHABLE: apb.FAILURE_EVIDENCE_NVML_UNREACHABLE,
    Evidence.UNCORRECTABLE_ECC: apb.FAILURE_EVIDENCE_UNCORRECTABLE_ECC,
    Evidence.IB_PORT_DOWN: apb.FAILURE_EVIDENCE_IB_PORT_DOWN,
    Evidence.NODE_SILENT: apb.FAILURE_EVIDENCE_NODE_SILENT,
    Evidence.TRAINER_REPORT: apb.FAILURE_EVIDENCE_TRAINER_REPORT,
}

_EVIDENCE_MODE: dict[Evidence, FailureMode | None] = {
    Evidence.GPU_LOST: FailureMode.DETACHMENT,
    Evidence.NVML_UNREACHABLE: None,
    Evidence.UNCORRECTABLE_ECC: FailureMode.HBM_WEAR,
    Evidence.IB_PORT_DOWN: FailureMode.INFINIBAND,
    Evidence.NODE_SILENT: FailureMode.HOST,
}


@dataclass(frozen=True, slots=True)
class TrainerReport:
    """What a job said through ReportFailure."""

    job_id: str
    what: apb.TrainerFailure.ValueType
    rank: int
    detail: str


def failure_mode(sign: FailureSign, report: TrainerReport | None = None) -> FailureMode | None:
    """The mode the evidence points to (None: it does not say)."""
    if sign.evidence is Evidence.XID:
        xid = lookup(sign.xid)  # the catalogue's reading, as the failure logs make it
        return xid.mode if xid is not None else None
    if report is not None:
        return FailureMode.NCCL_TIMEOUT if report.what == apb.TRAINER_FAILURE_NCCL_WATCHDOG else None
    return _EVIDENCE_MODE.get(sign.evidence)


def failure_event(
    sign: FailureSign,
    open_alerts: Sequence[apb.Alert],
    model: apb.ModelInfo,
    report: TrainerReport | None = None,
) -> apb.Alert:
    """The FAILED event of one sign, before it is stored (the log gives it its id and opened_id).
    `open_alerts`: the newest event of each alert open on the sign's node (those on its GPU foresaw a
    GPU's failure, all of them a node's). A GPU
    that fell off the bus says little of why (power, PCIe, cooling or the board): an alert open on
    that very GPU names the mode it saw coming, and the event takes it."""
    mode = failure_mode(sign, report)
    mode_pb = apb.FailureMode.Value(mode.proto_name) if mode is not None else apb.FAILURE_MODE_UNSPECIFIED
    on_gpu = [a for a in open_alerts if a.gpu == sign.gpu or sign.gpu in a.gpus]
    foresaw = on_gpu if sign.gpu >= 0 else open_alerts
    if sign.gpu >= 0 and (sign.xid == 79 or sign.evidence is Evidence.GPU_LOST):
        named = [a for a in on_gpu if a.mode != apb.FAILURE_MODE_UNSPECIFIED]
        if named:
            mode_pb = max(named, key=lambda a: a.opened_id).mode
    failure = apb.Failure(
        evidence=EVIDENCE_TO_PB[sign.evidence],
        xid=sign.xid,
        detail=sign.detail,
        drains_node=drains_node(sign),
        foreseen_by=sorted({a.opened_id for a in foresaw}),
    )
    if report is not None:
        failure.job_id, failure.trainer_failure, failure.rank = report.job_id, report.what, report.rank
    return apb.Alert(
        node=sign.node,
        gpu=sign.gpu,
        gpu_uuid=sign.uuid,
        mode=mode_pb,
        kind=apb.EVENT_KIND_FAILED,
        state=apb.ALERT_STATE_FAILED,
        time_unix_nano=sign.time_unix_nano,
        model=model,
        gpus=[sign.gpu] if sign.gpu >= 0 else [],
        failure=failure,
    )
