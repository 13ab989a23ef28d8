"""The label log a service would have written for a fleet's failure log: a data directory's failures.csv
(the twin's, the independent family's) read as the service sees failures, to stand in for a fleet's own
labels where there is no fleet yet (the retrain notebook, bench/fleet_loop.py).

What the service labels (service/failure_events.py, docs/fleet-loop.md): a failure whose Xid NVIDIA's
catalogue calls a failure of the GPU (faultcast.failure_signs.FATAL_XIDS: its FAILED event on the Xid
counter, the mode read from the catalogue as the service reads it) and an InfiniBand failure (the port
leaves ACTIVE: a node-level FAILED event). Not labels: application Xids (software), a host failure (a
silent node is no label alone), NCCL timeouts (a trainer's report), silent data corruption and failures
without an Xid (nothing in the samples says they happened).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Mapping
from pathlib import Path

from faultcast.failure_signs import FATAL_XIDS, Evidence, FailureSign
from faultcast.modes import FailureMode
from faultcast.service.failure_events import failure_mode
from faultcast.service.state.labels import FailureLabel, LabelSource


def service_label(row: Mapping[str, str]) -> FailureLabel | None:
    """The label the service would have recorded for one row of a failures.csv; None when it would not
    have seen the failure."""
    gpu = int(row["gpu"]) if row["gpu"] else -1
    time_ns = failure_time_ns(row)
    xid = int(float(row["xid"])) if row.get("xid") else 0
    if xid in FATAL_XIDS and gpu >= 0:
        sign = FailureSign(row["node"], gpu, row.get("uuid", ""), Evidence.XID, f"Xid {xid}", time_ns, xid)
        return FailureLabel(
            row["node"], gpu, failure_mode(sign), time_ns, LabelSource.FAILURE_EVENT, uuid=row.get("uuid", ""),
            xid=xid, evidence=Evidence.XID.value,
        )  # fmt: skip
    if row["mode"] == FailureMode.INFINIBAND.value:
        return FailureLabel(
            row["node"], -1, FailureMode.INFINIBAND, time_ns, LabelSource.FAILURE_EVENT,
            evidence=Evidence.IB_PORT_DOWN.value,
        )  # fmt: skip
    return None


def failure_time_ns(row: Mapping[str, str]) -> int:
    """A failures.csv row's ISO 8601 timestamp as Unix nanoseconds, to the second."""
    moment = dt.datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000


def service_labels(failures_csv: Path) -> list[FailureLabel]:
    """Every label the service would have recorded for the failures in `failures_csv`, in its order."""
    with failures_csv.open(newline="") as handle:
        return [label for row in csv.DictReader(handle) if (label := service_label(row)) is not None]
