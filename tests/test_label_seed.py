"""The label log a service would have written for a failure log (service/label_seed.py): what the
retrain notebook and bench/fleet_loop.py stand in for a fleet's own labels."""

from __future__ import annotations

import csv
from pathlib import Path

from faultcast.modes import FailureMode
from faultcast.service.label_seed import service_labels
from faultcast.service.state.labels import LabelSource

ROWS = [
    # timestamp, node, gpu, uuid, mode, xid, precursor_s, description
    ("2026-01-05T00:20:09Z", "node-0013", "0", "GPU-a", "hbm_wear", "48", "0", "hbm: no precursor"),
    ("2026-01-05T04:37:13Z", "node-0009", "", "", "software", "43", "0", "software"),  # application Xid
    ("2026-01-05T05:00:00Z", "node-0002", "", "", "host", "", "0", "host"),  # a silent node alone
    ("2026-01-05T06:00:00Z", "node-0003", "", "", "infiniband", "", "600", "ib"),  # the port leaves ACTIVE
    ("2026-01-05T07:00:00Z", "node-0004", "5", "GPU-b", "pcie", "79", "1200", "pcie"),  # fallen off the bus
    ("2026-01-05T08:00:00Z", "node-0005", "2", "GPU-c", "sdc", "", "0", "silent data corruption"),
    ("2026-01-05T09:00:00Z", "node-0006", "", "", "nccl_timeout", "", "0", "a trainer's report"),
]


def test_only_what_the_service_sees_becomes_a_label_with_its_evidence(tmp_path: Path) -> None:
    log = tmp_path / "failures.csv"
    with log.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timestamp", "node", "gpu", "uuid", "mode", "xid", "precursor_s", "description"])
        writer.writerows(ROWS)
    labels = service_labels(log)
    seen = [(x.node, x.gpu, x.source, x.xid, x.evidence) for x in labels]
    assert seen == [
        ("node-0013", 0, LabelSource.FAILURE_EVENT, 48, "xid"),
        ("node-0003", -1, LabelSource.FAILURE_EVENT, 0, "ib_port_down"),
        ("node-0004", 5, LabelSource.FAILURE_EVENT, 79, "xid"),
    ]
    # The mode is the catalogue's reading of the Xid, as the service's FAILED event has it: Xid 79 is a
    # GPU that fell off the bus, whatever the world's log calls the cause.
    assert [x.mode for x in labels] == [FailureMode.HBM_WEAR, FailureMode.INFINIBAND, FailureMode.DETACHMENT]
    assert labels[0].time_ns == 1_767_572_409 * 10**9
