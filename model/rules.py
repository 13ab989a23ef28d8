"""The rules operators use today, as a baseline: DCGM policy conditions and NVSentinel's InfiniBand
thresholds (../shared/FAILURE_MODES.md), evaluated on the same feature rows as the model.

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
    ("nvlink_crc_flit_worst_rate", 0.0, "DCGM: NVLink errors"),
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


class RulesBaseline:
    """The rules baseline (RULES): a row scores 1 when any rule's feature is above its threshold."""

    def __init__(self, feature_names: Sequence[str]) -> None:
        index = {name: i for i, name in enumerate(feature_names)}
        missing = [name for name, _, _ in RULES if name not in index]
        if missing:
            raise KeyError(f"features the rules need are not computed: {missing}")
        self.columns = np.array([index[name] for name, _, _ in RULES])
        self.thresholds = np.array([threshold for _, threshold, _ in RULES])

    def score(self, features: np.ndarray) -> np.ndarray:
        """(rows,) 1.0 where a rule fired, else 0.0; a missing feature fires nothing."""
        values = features[:, self.columns]
        fired = np.nan_to_num(values, nan=-np.inf) > self.thresholds
        return np.asarray(fired.any(axis=1), dtype=np.float64)
