"""The metric catalogue: every metric faultcast collects, named once.

The exporter, the protobuf packing, the simulator and the model's features all derive from
this module. A metric belongs to one scope (what entity it describes); within a scope the
order of the catalogue is the order of the packed value arrays on the wire. Any change (adding,
removing or reordering) changes `SCHEMA_HASH`, and collectors and services only talk when their
hashes agree: bump CATALOGUE_VERSION with it and upgrade both sides.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from functools import cache

CATALOGUE_VERSION = "2"
"""Bumped by hand with every catalogue change; written into the wire schema, manifests and model artifacts
(an artifact of another version is refused). The wire itself compares SCHEMA_HASH."""


class Scope(enum.Enum):
    """What one packed value array describes."""

    GPU = "gpu"  # one GPU, read through NVML
    INTERFACE = "interface"  # one network interface (Ethernet, IPoIB), from /proc/net/dev
    IB_PORT = "ib_port"  # one InfiniBand/RoCE port, from /sys/class/infiniband
    PEER = "peer"  # round trip to one peer node, from the collector's probes
    HOST = "host"  # the node as a whole (TCP counters)
    COLLECTOR = "collector"  # the collector's own health


class Kind(enum.Enum):
    """The Prometheus type of a metric; a counter's per-step increase is what features use."""

    GAUGE = "gauge"
    COUNTER = "counter"  # monotonic until a reset (driver reload, reboot)


class Source(enum.Enum):
    """Where the collector reads a metric: documentation (`faultcast metrics` prints it); no code branches on it."""

    NVML = "nvml"
    PROCFS = "procfs"
    SYSFS = "sysfs"
    PROBE = "probe"
    DERIVED = "derived"  # computed by the collector from other readings
    SELF = "self"  # the collector's own bookkeeping


# Xid codes tracked one by one (docs/failure-modes.md, "Xid codes that matter"); anything else is "other".
TRACKED_XIDS: tuple[int, ...] = (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric. `name` is faultcast's own snake_case name, unique across the catalogue."""

    name: str
    scope: Scope
    kind: Kind
    unit: str
    source: Source
    read: str  # how it is read: the NVML call, the file, or the derivation
    help: str
    dcgm: str | None = None  # dcgm-exporter's name, when one exists
    # Several catalogue metrics may share one Prometheus family, told apart by a label
    # (one family of Xid counters with an `xid` label).
    family: str | None = None
    family_label: tuple[str, str] | None = None

    @property
    def prometheus_name(self) -> str:
        """The exported family name: dcgm-exporter's where one exists, else faultcast_*."""
        if self.dcgm is not None:
            return self.dcgm
        if self.family is not None:
            return self.family
        base = f"faultcast_{self.name}"
        if self.kind is Kind.COUNTER and not base.endswith("_total"):
            base += "_total"
        return base


def _gpu(
    name: str,
    kind: Kind,
    unit: str,
    read: str,
    help: str,
    dcgm: str | None = None,
    *,
    source: Source = Source.NVML,
) -> Metric:
    return Metric(name, Scope.GPU, kind, unit, source, read, help, dcgm)


G, C = Kind.GAUGE, Kind.COUNTER

# The catalogue reads as a table; keep the formatter from spreading it one argument per line.
# fmt: off

_GPU_METRICS: tuple[Metric, ...] = (
    _gpu("gpu_temp", G, "celsius", "nvmlDeviceGetTemperature(GPU)", "GPU core temperature.",
         "DCGM_FI_DEV_GPU_TEMP"),
    _gpu("memory_temp", G, "celsius", "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
         "HBM temperature.", "DCGM_FI_DEV_MEMORY_TEMP"),
    _gpu("power_usage", G, "watts", "nvmlDeviceGetPowerUsage / 1000", "Board power draw.",
         "DCGM_FI_DEV_POWER_USAGE"),
    _gpu("power_limit", G, "watts", "nvmlDeviceGetEnforcedPowerLimit / 1000", "Enforced power limit.",
         "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    _gpu("total_energy", C, "millijoules", "nvmlDeviceGetTotalEnergyConsumption",
         "Energy consumed since the driver was loaded.", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    _gpu("sm_clock", G, "megahertz", "nvmlDeviceGetClockInfo(SM)", "SM clock.", "DCGM_FI_DEV_SM_CLOCK"),
    _gpu("mem_clock", G, "megahertz", "nvmlDeviceGetClockInfo(MEM)", "Memory clock.", "DCGM_FI_DEV_MEM_CLOCK"),
    _gpu("gpu_util", G, "percent", "nvmlDeviceGetUtilizationRates.gpu", "GPU utilization.",
         "DCGM_FI_DEV_GPU_UTIL"),
    _gpu("mem_copy_util", G, "percent", "nvmlDeviceGetUtilizationRates.memory", "Memory utilization.",
         "DCGM_FI_DEV_MEM_COPY_UTIL"),
    _gpu("fb_used", G, "mebibytes", "nvmlDeviceGetMemoryInfo.used / 2**20", "Framebuffer memory used.",
         "DCGM_FI_DEV_FB_USED"),
    _gpu("fb_free", G, "mebibytes", "nvmlDeviceGetMemoryInfo.free / 2**20", "Framebuffer memory free.",
         "DCGM_FI_DEV_FB_FREE"),
    _gpu("fan_speed", G, "percent", "nvmlDeviceGetFanSpeed", "Fan speed (NOT_SUPPORTED on liquid-cooled parts).",
         "DCGM_FI_DEV_FAN_SPEED"),
    _gpu("pstate", G, "state", "nvmlDeviceGetPerformanceState", "Performance state, 0 (max) to 15 (min).",
         "DCGM_FI_DEV_PSTATE"),
    _gpu("clock_event_reasons", G, "bitmask", "nvmlDeviceGetCurrentClocksEventReasons",
         "Why clocks are held down (throttle reasons bitmask).", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    _gpu("throttle_sw_power_cap", G, "bool", "clock_event_reasons & 0x04", "SW power cap slowdown active.",
         source=Source.DERIVED),
    _gpu("throttle_hw_slowdown", G, "bool", "clock_event_reasons & 0x08", "HW slowdown active.",
         source=Source.DERIVED),
    _gpu("throttle_sw_thermal", G, "bool", "clock_event_reasons & 0x20", "SW thermal slowdown active.",
         source=Source.DERIVED),
    _gpu("throttle_hw_thermal", G, "bool", "clock_event_reasons & 0x40", "HW thermal slowdown active.",
         source=Source.DERIVED),
    _gpu("throttle_hw_power_brake", G, "bool", "clock_event_reasons & 0x80", "HW power brake slowdown active.",
         source=Source.DERIVED),
    _gpu("ecc_sbe_volatile", C, "errors", "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)",
         "Single-bit ECC errors since the driver was loaded.", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _gpu("ecc_dbe_volatile", C, "errors", "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)",
         "Double-bit ECC errors since the driver was loaded.", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _gpu("ecc_sbe_aggregate", C, "errors", "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)",
         "Single-bit ECC errors over the GPU's life.", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _gpu("ecc_dbe_aggregate", C, "errors", "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)",
         "Double-bit ECC errors over the GPU's life.", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    _gpu("retired_pages_sbe", C, "pages", "len(nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT))",
         "Pages retired for repeated single-bit errors.", "DCGM_FI_DEV_RETIRED_SBE"),
    _gpu("retired_pages_dbe", C, "pages", "len(nvmlDeviceGetRetiredPages(DOUBLE_BIT))",
         "Pages retired for double-bit errors.", "DCGM_FI_DEV_RETIRED_DBE"),
    _gpu("retired_pages_pending", G, "bool", "nvmlDeviceGetRetiredPagesPendingStatus",
         "A page retirement waits for the next driver reload.", "DCGM_FI_DEV_RETIRED_PENDING"),
    _gpu("remapped_rows_correctable", C, "rows", "nvmlDeviceGetRemappedRows[0]",
         "Rows remapped for correctable errors.", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    _gpu("remapped_rows_uncorrectable", C, "rows", "nvmlDeviceGetRemappedRows[1]",
         "Rows remapped for uncorrectable errors.", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    _gpu("row_remap_pending", G, "bool", "nvmlDeviceGetRemappedRows[2]",
         "A row remap waits for the next GPU reset.", "DCGM_FI_DEV_ROW_REMAP_PENDING"),
    _gpu("row_remap_failure", G, "bool", "nvmlDeviceGetRemappedRows[3]",
         "A row remap failed: the GPU needs service.", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    _gpu("pcie_replay", C, "replays", "nvmlDeviceGetPcieReplayCounter", "PCIe link replays.",
         "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    _gpu("pcie_link_gen", G, "generation", "nvmlDeviceGetCurrPcieLinkGeneration", "Current PCIe generation.",
         "DCGM_FI_DEV_PCIE_LINK_GEN"),
    _gpu("pcie_link_width", G, "lanes", "nvmlDeviceGetCurrPcieLinkWidth", "Current PCIe link width.",
         "DCGM_FI_DEV_PCIE_LINK_WIDTH"),
    _gpu("pcie_link_gen_max", G, "generation", "nvmlDeviceGetMaxPcieLinkGeneration", "Maximum PCIe generation.",
         "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"),
    _gpu("pcie_link_width_max", G, "lanes", "nvmlDeviceGetMaxPcieLinkWidth", "Maximum PCIe link width.",
         "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"),
    _gpu("pcie_tx_bytes_per_second", G, "bytes_per_second", "nvmlDeviceGetPcieThroughput(TX) * 1024",
         "PCIe transmit throughput (NVML samples it over 20 ms)."),
    _gpu("pcie_rx_bytes_per_second", G, "bytes_per_second", "nvmlDeviceGetPcieThroughput(RX) * 1024",
         "PCIe receive throughput (NVML samples it over 20 ms)."),
    _gpu("nvlink_crc_flit_errors", C, "errors", "sum over links of nvmlDeviceGetNvLinkErrorCounter(CRC_FLIT)",
         "NVLink flow-control CRC errors, all links.", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    _gpu("nvlink_crc_data_errors", C, "errors", "sum over links of nvmlDeviceGetNvLinkErrorCounter(CRC_DATA)",
         "NVLink data CRC errors, all links.", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    _gpu("nvlink_replay_errors", C, "errors", "sum over links of nvmlDeviceGetNvLinkErrorCounter(REPLAY)",
         "NVLink replays, all links.", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    _gpu("nvlink_recovery_errors", C, "errors", "sum over links of nvmlDeviceGetNvLinkErrorCounter(RECOVERY)",
         "NVLink recoveries, all links.", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    _gpu("nvlink_crc_flit_errors_worst_link", G, "errors", "max over links of CRC_FLIT",
         "NVLink flow-control CRC errors on the worst link."),
    _gpu("nvlink_crc_data_errors_worst_link", G, "errors", "max over links of CRC_DATA",
         "NVLink data CRC errors on the worst link."),
    _gpu("nvlink_replay_errors_worst_link", G, "errors", "max over links of REPLAY",
         "NVLink replays on the worst link."),
    _gpu("nvlink_recovery_errors_worst_link", G, "errors", "max over links of RECOVERY",
         "NVLink recoveries on the worst link."),
    _gpu("nvlink_links_active", G, "links", "count of nvmlDeviceGetNvLinkState == 1",
         "NVLink links up."),
    _gpu("xid_last", G, "xid", "eventData of the newest nvmlEventTypeXidCriticalError",
         "The most recent Xid code seen (0 before any).", "DCGM_FI_DEV_XID_ERRORS"),
    *(
        Metric(
            f"xid_{code}_events", Scope.GPU, C, "events", Source.NVML,
            f"nvmlEventSetWait: XidCriticalError with eventData == {code}",
            f"Xid {code} events seen by this collector.",
            family="faultcast_xid_events_total", family_label=("xid", str(code)),
        )
        for code in TRACKED_XIDS
    ),
    Metric(
        "xid_other_events", Scope.GPU, C, "events", Source.NVML,
        "nvmlEventSetWait: XidCriticalError with an untracked code", "Other Xid events seen by this collector.",
        family="faultcast_xid_events_total", family_label=("xid", "other"),
    ),
    # The collector's view of each GPU: the structural precursors of a detachment.
    _gpu("nvml_call_seconds", G, "seconds", "sum of NVML call latencies for this GPU in the scrape",
         "Time spent in NVML calls for this GPU in the last scrape.", source=Source.SELF),
    _gpu("nvml_slowest_call_seconds", G, "seconds", "max NVML call latency for this GPU in the scrape",
         "Slowest NVML call for this GPU in the last scrape.", source=Source.SELF),
    _gpu("nvml_failed_calls", C, "calls",
         "NVML calls that returned an error other than NOT_SUPPORTED or timed out, "
         "plus one per scrape skipped while a call hangs", "Failed NVML calls for this GPU.", source=Source.SELF),
    _gpu("nvml_timed_out_calls", C, "calls", "NVML calls not returned within the per-call timeout",
         "NVML calls for this GPU that hung past the timeout (reported as missing).", source=Source.SELF),
    _gpu("nvml_unsupported_fields", G, "fields", "NVML calls that returned NOT_SUPPORTED in the scrape",
         "Fields this GPU does not support (reported as missing).", source=Source.SELF),
    _gpu("gpu_lost", G, "bool", "NVML_ERROR_GPU_IS_LOST or the handle vanished",
         "1 when the GPU has fallen off the bus.", source=Source.SELF),
)


def _net(
    name: str, scope: Scope, kind: Kind, unit: str, source: Source, read: str, help: str
) -> Metric:
    prefix = {Scope.INTERFACE: "net_", Scope.IB_PORT: "ib_", Scope.PEER: "peer_", Scope.HOST: ""}[scope]
    return Metric(f"{prefix}{name}", scope, kind, unit, source, read, help)


_IF, _IB, _PEER, _HOST = Scope.INTERFACE, Scope.IB_PORT, Scope.PEER, Scope.HOST
_PROC_NET_DEV = "/proc/net/dev"

_NETWORK_METRICS: tuple[Metric, ...] = (
    *(
        _net(f"{direction}_{what}", _IF, C, what, Source.PROCFS, f"{_PROC_NET_DEV} {direction} {what}",
             f"Interface {'received' if direction == 'rx' else 'transmitted'} {what}.")
        for direction in ("rx", "tx")
        for what in ("bytes", "packets", "errors", "dropped")
    ),
    _net("tcp_retrans_segs", _HOST, C, "segments", Source.PROCFS, "/proc/net/snmp Tcp RetransSegs",
         "TCP segments retransmitted."),
    _net("tcp_out_segs", _HOST, C, "segments", Source.PROCFS, "/proc/net/snmp Tcp OutSegs",
         "TCP segments sent."),
    _net("tcp_in_errs", _HOST, C, "segments", Source.PROCFS, "/proc/net/snmp Tcp InErrs",
         "TCP segments received in error."),
    *(
        _net(counter, _IB, C, "errors", Source.SYSFS, f"ports/N/counters/{counter}", help)
        for counter, help in (
            ("symbol_error", "Minor link errors detected on one or more physical lanes."),
            ("link_downed", "Times the link error recovery process failed and the link went down."),
            ("link_error_recovery", "Times the link error recovery process completed."),
            ("port_rcv_errors", "Packets received with errors."),
            ("port_xmit_discards", "Outbound packets discarded because the port was down or congested."),
            ("local_link_integrity_errors", "Times local physical errors exceeded the threshold."),
            ("excessive_buffer_overrun_errors", "Times consecutive flow-control update periods overran."),
        )
    ),
    _net("port_rcv_data", _IB, C, "octets", Source.SYSFS, "ports/N/counters/port_rcv_data * 4",
         "Data octets received."),
    _net("port_xmit_data", _IB, C, "octets", Source.SYSFS, "ports/N/counters/port_xmit_data * 4",
         "Data octets transmitted."),
    *(
        _net(counter, _IB, C, "events", Source.SYSFS, f"ports/N/hw_counters/{counter} (when present)", help)
        for counter, help in (
            ("rnr_nak_retry_err", "RNR NAK retries exhausted (RoCE/IB hardware counter)."),
            ("local_ack_timeout_err", "Local ACK timeouts (RoCE/IB hardware counter)."),
            ("out_of_sequence", "Out-of-sequence packets received (RoCE/IB hardware counter)."),
            ("packet_seq_err", "Packet sequence errors (RoCE/IB hardware counter)."),
        )
    ),
    _net("port_state", _IB, G, "state", Source.SYSFS, "ports/N/state (4 = ACTIVE)", "Logical port state."),
    _net("port_phys_state", _IB, G, "state", Source.SYSFS, "ports/N/phys_state (5 = LinkUp)",
         "Physical port state."),
    _net("port_rate_gbps", _IB, G, "gigabits_per_second", Source.SYSFS, "ports/N/rate", "Port link rate."),
    _net("rtt_p50_seconds", _PEER, G, "seconds", Source.PROBE, "TCP connect round trip, window median",
         "Median round trip to the peer."),
    _net("rtt_p99_seconds", _PEER, G, "seconds", Source.PROBE, "TCP connect round trip, window 99th percentile",
         "99th percentile round trip to the peer."),
    _net("loss_ratio", _PEER, G, "ratio", Source.PROBE, "failed probes / probes in the window",
         "Fraction of probes to the peer that failed."),
    _net("probes", _PEER, C, "probes", Source.PROBE, "probes sent", "Probes sent to the peer."),
)

_COLLECTOR_METRICS: tuple[Metric, ...] = tuple(
    Metric(name, Scope.COLLECTOR, kind, unit, Source.SELF, read, help)
    for name, kind, unit, read, help in (
        ("scrape_duration_seconds", G, "seconds", "wall time of the last scrape", "How long the last scrape took."),
        ("gpus_present", G, "gpus", "GPUs in the reading", "GPUs the collector reads."),
        ("gpus_lost", G, "gpus", "GPUs reported lost", "GPUs that have fallen off the bus."),
        ("source_errors", C, "errors", "sources that raised during a scrape", "Scrapes in which a source failed."),
        ("spool_depth", G, "samples", "samples in the spool not yet acknowledged", "Samples waiting to ship."),
        ("spool_dropped", C, "samples", "oldest samples dropped past the spool bound", "Samples lost to the bound."),
        ("spool_dropped_no_space", C, "samples", "samples dropped for lack of space, oldest first",
         "Samples lost to a full disk or the spool's byte bound."),
        ("spool_errors", C, "errors", "spool writes failed for another reason than space (I/O error, read-only disk)",
         "Samples not spooled because the spool failed."),
        ("samples_acked", C, "samples", "samples acknowledged by the service", "Samples the service confirmed."),
    )
)

# Help text for families shared by several catalogue metrics.
FAMILY_HELP: dict[str, str] = {"faultcast_xid_events_total": "Xid events seen by this collector, by Xid code."}

METRICS: tuple[Metric, ...] = _GPU_METRICS + _NETWORK_METRICS + _COLLECTOR_METRICS
"""Every metric once; within a scope, in wire order (use metrics_for(scope) for one scope)."""

# fmt: on


@cache
def metrics_for(scope: Scope) -> tuple[Metric, ...]:
    """The metrics of one scope, in wire order."""
    return tuple(m for m in METRICS if m.scope is scope)


@cache
def index_of(scope: Scope) -> dict[str, int]:
    """Position of each metric name in its scope's packed array."""
    return {m.name: i for i, m in enumerate(metrics_for(scope))}


def by_name(name: str) -> Metric:
    """The catalogue entry called `name`, any scope; KeyError when there is none."""
    for metric in METRICS:
        if metric.name == name:
            return metric
    raise KeyError(f"no metric named {name!r} in the catalogue")


def _schema_hash() -> int:
    """A 64-bit fingerprint of every scope's metric order; both ends of the wire compare it."""
    text = "\n".join(f"{m.scope.value}:{m.name}:{m.kind.value}" for m in METRICS)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


SCHEMA_HASH: int = _schema_hash()
"""Fingerprint of the catalogue's wire layout; a collector and a service talk only when theirs agree."""


def _check_unique() -> None:
    names = [m.name for m in METRICS]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"metric names must be unique, repeated: {sorted(duplicates)}")


_check_unique()
