"""The feature groups of the visibility report (faultcast.model.evaluation.visibility), by the names of the
inputs they read: kept apart, with nothing heavy imported, because the service's metrics name every
group as a label value and the command line must parse without loading the model stack."""

from __future__ import annotations

import re

from faultcast.step_summary import SCRAPES_COLUMN

# (group, pattern searched in an input's name), first match wins.
_INPUT_GROUPS: tuple[tuple[str, str], ...] = (
    ("step summaries", rf"_step_(min|max|mean)$|^{SCRAPES_COLUMN}$"),
    ("infiniband", r"^ib_"),
    ("tcp", r"^tcp_"),
    ("peer probes", r"^peer_"),
    ("xid", r"^xid_"),
    ("nvml health", r"^nvml_"),
    ("row remap", r"remap"),
    ("memory ecc", r"^ecc_"),
    ("pcie", r"^pcie_"),
    ("nvlink", r"^nvlink_"),
    ("throttle", r"^throttle_"),
    ("thermal", r"temp"),
    ("power", r"^power_"),
    ("clocks", r"clock"),
    ("utilisation", r"util"),
)
_COMPILED = tuple((group, re.compile(pattern)) for group, pattern in _INPUT_GROUPS)
GROUPS: tuple[str, ...] = tuple(group for group, _ in _INPUT_GROUPS)
"""Every group an input can fall in (the label values of faultcast_model_feature_group_visible)."""


def input_group(name: str) -> str:
    """The group of an input column ("other" when no pattern matches)."""
    for group, pattern in _COMPILED:
        if pattern.search(name):
            return group
    return "other"
