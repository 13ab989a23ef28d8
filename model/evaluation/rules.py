"""The rules operators use today, as a baseline: DCGM policy conditions and NVSentinel's InfiniBand
thresholds (docs/failure-modes.md, "Rules operators use today"), evaluated on the same feature rows as
the model.

A rule either fires (score 1) or not (0); the alert policy then treats the score like a risk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (feature, threshold, what it stands for). A rule fires when the feature exceeds the threshold.
RULES: tuple[tuple[str, float, str], ...] = (
    ("dbe_rate", 0.0, "DCGM: any double-bit ECC error"),
    ("row_remap_pending_now", 0.5, "DCGM: a row remap or page retirement pending"),
    ("row_remap_failure_now", 0.5, "DCGM: a row remap failed"),
    ("xid_memory_rate", 0.0, "DCGM: a critical memory Xid (48, 63, 64, 92, 94, 95)"),
    ("xid_nvlink_rate", 0.0, "DCGM: Xid 74"),
    ("xid_bus_rate", 0.0, "DCGM: Xid 79"),
    ("xid_gsp_rate", 0.0, "DCGM: Xid 119/120"),
    ("throttle_hw_thermal_now", 0.5, "DCGM: thermal limit (HW thermal slowdown)"),
    ("throttle_sw_thermal_now", 0.5, "DCGM: thermal limit (SW thermal slowdown)"),
    ("throttle_hw_power_brake_now", 0.5, "DCGM: power limit (HW power brake)"),
    ("sbe_rate_60m", 100.0 / 3600.0, "SBE rate above 100 per hour"),
    ("nvlink_crc_flit_rate", 0.0, "DCGM: NVLink errors"),
    ("nvlink_recovery_rate", 0.0, "DCGM: NVLink recovery"),
    ("pcie_replay_rate_5m", 10.0 / 300.0, "DCGM: PCIe replays (more than 10 in 5 minutes)"),
    ("pcie_width_deficit_now", 0.5, "PCIe link below its maximum width"),
    ("node_ib_link_downed_rate", 0.0, "NVSentinel: link_downed increased"),
    ("node_ib_symbol_error_rate_60m", 120.0 / 3600.0, "NVSentinel: symbol_error above 120 per hour"),
    ("node_ib_symbol_error_rate", 10.0, "NVSentinel: symbol_error above 10/s"),
    ("node_ib_link_error_recovery_rate_5m", 5.0 / 60.0, "NVSentinel: link_error_recovery above 5/min"),
    ("node_ib_port_rcv_errors_rate", 10.0, "NVSentinel: port_rcv_errors above 10/s"),
    ("node_ib_xmit_discards_rate", 100.0, "NVSentinel: port_xmit_discards above 100/s"),
    ("node_ib_local_ack_timeout_rate", 1.0, "NVSentinel: local_ack_timeout_err above 1/s"),
)


# Scaling a rule multiplies its threshold, and zero times anything is zero: a rule that fires on any
# count (threshold 0, every one a rate per second) scales from one event an hour instead.
ZERO_RULE_FLOOR = 1.0 / 3600.0


class RulesBaseline:
    """The rules baseline (RULES): a row scores 1 when any rule's feature is above its threshold.

    `scale` k > 1 makes every rule stricter: its threshold becomes max(threshold, ZERO_RULE_FLOOR) x k
    (what matching the rules to another method's false-alarm rate searches over); 1 is the rules as
    shipped, thresholds of 0 included."""

    def __init__(self, feature_names: Sequence[str], scale: float = 1.0) -> None:
        if not scale >= 1.0:
            raise ValueError(f"the rules' scale must be at least 1 (as shipped), got {scale}")
        index = {name: i for i, name in enumerate(feature_names)}
        missing = [name for name, _, _ in RULES if name not in index]
        if missing:
            raise KeyError(f"features the rules need are not computed: {missing}")
        self.columns = np.array([index[name] for name, _, _ in RULES])
        shipped = np.array([threshold for _, threshold, _ in RULES])
        self.bases = np.maximum(shipped, ZERO_RULE_FLOOR)  # the thresholds a scale multiplies
        self.scale = scale
        self.thresholds = shipped if scale == 1.0 else self.bases * scale  # what each rule fires above

    def score(self, features: np.ndarray) -> np.ndarray:
        """(rows,) 1.0 where a rule fired, else 0.0; a missing feature fires nothing."""
        if self.scale != 1.0:  # by the margin, so that a scale and the margin never disagree
            return np.asarray(self.margin(features) > self.scale, dtype=np.float64)
        values = features[:, self.columns]
        fired = np.nan_to_num(values, nan=-np.inf) > self.thresholds
        return np.asarray(fired.any(axis=1), dtype=np.float64)

    def margin(self, features: np.ndarray) -> np.ndarray:
        """(rows,) the largest scale at which some rule still fires (0 when none is above 0): a row
        scores 1 under `RulesBaseline(names, scale=k)`, k > 1, exactly where its margin exceeds k, so
        one column of margins stands for every scale."""
        values = np.nan_to_num(features[:, self.columns], nan=-np.inf)
        return np.asarray((values / self.bases).max(axis=1, initial=0.0), dtype=np.float64)
