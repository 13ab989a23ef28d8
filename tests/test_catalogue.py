from __future__ import annotations

import math

import pytest

from faultcast.catalogue import (
    METRICS,
    SCHEMA_HASH,
    TRACKED_XIDS,
    Kind,
    Scope,
    by_name,
    index_of,
    metrics_for,
)
from faultcast.readings import pack, unpack

# The per-GPU metrics the collector issue names, by catalogue name.
REQUIRED_GPU = {
    "gpu_temp", "memory_temp", "power_usage", "power_limit", "total_energy", "sm_clock", "mem_clock",
    "gpu_util", "mem_copy_util", "fb_used", "fb_free", "fan_speed", "pstate", "clock_event_reasons",
    "throttle_hw_slowdown", "throttle_hw_thermal", "throttle_hw_power_brake", "throttle_sw_thermal",
    "throttle_sw_power_cap", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "remapped_rows_correctable",
    "remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failure", "pcie_replay", "pcie_link_gen",
    "pcie_link_width", "pcie_link_gen_max", "pcie_link_width_max", "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second", "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
    "nvlink_recovery_errors", "nvlink_crc_flit_errors_worst_link", "xid_last", "nvml_call_seconds",
    "nvml_failed_calls", "gpu_lost",
}  # fmt: skip


def test_the_issue_s_gpu_metrics_are_all_in_the_catalogue() -> None:
    names = {m.name for m in metrics_for(Scope.GPU)}
    assert names >= REQUIRED_GPU
    assert {f"xid_{code}_events" for code in TRACKED_XIDS} <= names


def test_names_and_exported_series_are_unique() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    series = [(m.prometheus_name, m.family_label) for m in METRICS]
    assert len(series) == len(set(series))


def test_faultcast_counters_end_in_total_and_dcgm_names_are_kept() -> None:
    for metric in METRICS:
        if metric.dcgm is not None:
            assert metric.prometheus_name == metric.dcgm
        elif metric.kind is Kind.COUNTER:
            assert metric.prometheus_name.endswith("_total"), metric.name
        else:
            assert metric.prometheus_name.startswith("faultcast_")


def test_pack_aligns_with_the_catalogue_and_marks_missing_as_nan() -> None:
    values = pack(Scope.GPU, {"gpu_temp": 51, "power_usage": 312.5})
    assert len(values) == len(metrics_for(Scope.GPU))
    assert values[index_of(Scope.GPU)["gpu_temp"]] == 51.0
    assert values[index_of(Scope.GPU)["power_usage"]] == 312.5
    assert math.isnan(values[index_of(Scope.GPU)["fan_speed"]])
    back = unpack(Scope.GPU, values)
    assert back["power_usage"] == 312.5
    assert math.isnan(back["sm_clock"])


def test_pack_refuses_names_outside_the_scope() -> None:
    with pytest.raises(KeyError, match="ib_symbol_error"):
        pack(Scope.GPU, {"ib_symbol_error": 1.0})
    with pytest.raises(ValueError, match="catalogue has"):
        unpack(Scope.HOST, (1.0,))
    with pytest.raises(KeyError, match="no metric named"):
        by_name("gpu_temperature")


def test_schema_hash_is_a_64_bit_fingerprint() -> None:
    assert 0 < SCHEMA_HASH < 2**64
