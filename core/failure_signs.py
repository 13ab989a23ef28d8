"""Evidence in a node's samples that a failure has just happened (not a prediction: the event itself).

One rule, used in two places: the collector compares each scrape with the one before and ships its
open window at once when a scrape shows a sign (collector/agent.py), and the service compares each
sample with the node's previous one and turns the signs into FAILED events (service/failure_watch.py).

A sign is a change between two readings of the same GPU (same index, same UUID: a swapped GPU starts
its counters again) or the same InfiniBand port:

- a critical Xid counter rose (FATAL_XIDS, from the Xid catalogue the failure logs read too);
  application Xids (13, 31, 43) and the warnings of wear (63, 92) never are signs: they follow user
  code or announce a failure still to come;
- NVML reports the GPU lost (off the bus) where it did not before;
- the volatile double-bit ECC count rose, or a row remap failed (an uncorrectable memory error);
- an InfiniBand/RoCE port that was ACTIVE (state 4) is not.

- an NVML call on the GPU has not returned for UNREACHABLE_AFTER_S (10 s) where it had not before:
  the driver no longer answers for the GPU. The collector reads such a GPU's other values as
  missing after its call timeout (2 s) and skips it while the call hangs, reporting the hung call's
  age so far as `nvml_slowest_call_seconds`; one call past the timeout is no sign (it is what a slow
  call gives too), a call that has hung for ten seconds is.

A counter that fell (a driver reload resets volatile counters) and a value missing on either side
are no sign: nothing is inferred from what was not read.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from faultcast.catalogue import TRACKED_XIDS, Scope
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot
from faultcast.xid_catalogue import Xid, XidKind, lookup

FATAL_XIDS: dict[int, Xid] = {
    code: xid for code in TRACKED_XIDS if (xid := lookup(code)) is not None and xid.kind is XidKind.FAILURE
}
"""The Xids the collector counts one by one that NVIDIA's catalogue calls a failure of the GPU
(faultcast.xid_catalogue, what the failure logs read too): 48, 64, 74, 79, 94, 95, 119, 120."""

PORT_ACTIVE = 4.0  # /sys/class/infiniband/*/ports/N/state: 4 = ACTIVE
UNREACHABLE_AFTER_S = 10.0
"""An NVML call hung this long means the driver no longer answers for the GPU (healthy calls take
milliseconds; the collector's call timeout is 2 s, five times less)."""


class Evidence(enum.Enum):
    """What a sign shows; the service adds the two it sees itself (a node gone silent, a trainer's report)."""

    XID = "xid"
    GPU_LOST = "gpu_lost"
    NVML_UNREACHABLE = "nvml_unreachable"
    UNCORRECTABLE_ECC = "uncorrectable_ecc"
    IB_PORT_DOWN = "ib_port_down"
    NODE_SILENT = "node_silent"
    TRAINER_REPORT = "trainer_report"


@dataclass(frozen=True, slots=True)
class FailureSign:
    """One piece of evidence: on a GPU (gpu >= 0) or on the node (gpu -1, a port or the node itself)."""

    node: str
    gpu: int
    uuid: str
    evidence: Evidence
    detail: str
    time_unix_nano: int
    xid: int = 0


def drains_node(sign: FailureSign) -> bool:
    """Whether the evidence takes the node out of service: hardware evidence does; a trainer's report
    does not (a dead rank may be a software bug), nor an Xid whose catalogue action is only to restart
    the application (Xid 94, a contained ECC error: the GPU keeps working)."""
    if sign.evidence is Evidence.TRAINER_REPORT:
        return False
    if sign.evidence is Evidence.XID:
        xid = lookup(sign.xid)
        return xid is None or xid.drains_node
    return True


def _rose(before: float, now: float) -> bool:
    return math.isfinite(before) and math.isfinite(now) and now > before


def gpu_signs(node: str, time_unix_nano: int, before: GpuReading, now: GpuReading) -> list[FailureSign]:
    """The signs between two readings of one GPU (none when the slot holds another GPU now)."""
    if before.uuid != now.uuid:
        return []

    def sign(evidence: Evidence, detail: str, xid: int = 0) -> FailureSign:
        return FailureSign(node, now.index, now.uuid, evidence, detail, time_unix_nano, xid)

    out = [
        sign(Evidence.XID, f"Xid {code} ({xid.mnemonic})", code)
        for code, xid in FATAL_XIDS.items()
        if _rose(before.get(f"xid_{code}_events"), now.get(f"xid_{code}_events"))
    ]
    if now.lost and not before.lost:
        out.append(sign(Evidence.GPU_LOST, "NVML reports the GPU lost (off the bus)"))
    hung_before, hung = before.get("nvml_slowest_call_seconds"), now.get("nvml_slowest_call_seconds")
    if not now.lost and math.isfinite(hung_before) and hung_before < UNREACHABLE_AFTER_S <= hung:
        out.append(
            sign(Evidence.NVML_UNREACHABLE, f"an NVML call on the GPU has not returned for {hung:.0f} s")
        )
    if _rose(before.get("ecc_dbe_volatile"), now.get("ecc_dbe_volatile")):
        rise = now.get("ecc_dbe_volatile") - before.get("ecc_dbe_volatile")
        out.append(sign(Evidence.UNCORRECTABLE_ECC, f"{rise:.0f} new double-bit ECC error(s)"))
    elif before.get("row_remap_failure") == 0.0 and now.get("row_remap_failure") > 0.0:
        out.append(sign(Evidence.UNCORRECTABLE_ECC, "a row remap failed"))
    return out


def port_signs(
    node: str, time_unix_nano: int, before: DeviceReading, now: DeviceReading
) -> list[FailureSign]:
    """A port that was ACTIVE and is not (a value missing on either side says nothing)."""
    was, state = before.get("ib_port_state"), now.get("ib_port_state")
    if was == PORT_ACTIVE and math.isfinite(state) and state != PORT_ACTIVE:
        detail = f"InfiniBand port {now.device} left ACTIVE (state {state:.0f})"
        return [FailureSign(node, -1, "", Evidence.IB_PORT_DOWN, detail, time_unix_nano)]
    return []


def failure_signs(before: NodeSnapshot | None, now: NodeSnapshot) -> list[FailureSign]:
    """Every sign between a node's previous reading and its newest (none without a previous one)."""
    if before is None:
        return []
    out: list[FailureSign] = []
    gpus = {g.index: g for g in before.gpus}
    for gpu in now.gpus:
        previous = gpus.get(gpu.index)
        if previous is not None:
            out += gpu_signs(now.node, now.time_unix_nano, previous, gpu)
    ports = {d.device: d for d in before.devices if d.scope is Scope.IB_PORT}
    for device in now.devices:
        previous_port = ports.get(device.device) if device.scope is Scope.IB_PORT else None
        if previous_port is not None:
            out += port_signs(now.node, now.time_unix_nano, previous_port, device)
    return out
