"""dcgm-exporter's vocabularies: the names, Prometheus types, units and labels under which the
collector exports the catalogue's GPU metrics, and under which the importer reads them back.

Two vocabularies, both read from NVIDIA's own sources (fetched 2026-12-04):

- `CLASSIC` (the default): the names of dcgm-exporter's `etc/default-counters.csv` and
  `etc/dcp-metrics-included.csv` (release 4.5.3-4.8.2, and main at d5e5f51), each typed as those
  files declare it, commented-out rows included (they are the examples users enable): the energy,
  PCIe replay, ECC, retired-page, NVLink error and remapped-row fields are counters there, and so
  is DCGM_FI_DEV_RETIRED_PENDING, although it is a 0/1 status. Labels `Hostname` and
  `DCGM_FI_DRIVER_VERSION`.
- `CANONICAL`: DCGM 4.6's canonical field names (dcgm_fields.h as vendored by NVIDIA/go-dcgm for
  DCGM 4.6.0 and 4.6.1), which dcgm-exporter exports verbatim when its CSV names them (it names each
  family after the CSV's first column). DCGM 4.6 renamed fields under the same ids and units
  (DCGM_FI_DEV_GPU_TEMP -> DCGM_FI_DEV_GPU_TEMP_CELSIUS, DCGM_FI_DEV_PCIE_REPLAY_COUNTER ->
  DCGM_FI_DEV_PCIE_REPLAY_TOTAL) and added base-unit fields under new ids (DCGM_FI_DEV_SM_CLOCK_HERTZ,
  DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL, DCGM_FI_DEV_FAN_SPEED_RATIO), deprecating the MHz, mJ and
  percent ones; this vocabulary takes the base-unit field wherever one exists. Labels `hostname`
  (dcgm-exporter's main renamed `Hostname` after 4.8.2, #655) and `DCGM_FI_SYSTEM_DRIVER_VERSION`.

Both vocabularies also name `PARITY`: the default fields of dcgm-exporter that are not catalogue
metrics (encoder and decoder utilisation, reserved framebuffer, NVLink bandwidth, the DCP fields),
which the collector exports for parity only: no model input, not on the wire, not imported.

The newer names are sometimes called dcgm-exporter 4.9's (`DCGM_FI_DEV_GPU_TEMP_CELSIUS`). The fetched
dcgm-exporter has no 4.9 release (newest: 4.5.3-4.8.2, pinned to go-dcgm of DCGM 4.5.3) and its
default CSV still uses the classic names, so this is what DCGM 4.6 names the fields, not a
confirmed 4.9 default CSV.

One name is ambiguous: in DCGM 4.6.x DCGM_FI_DEV_GPU_UTIL_RATIO is field 203 renamed, an integer
percent; NVIDIA's DCGM 4.7 field reference (as quoted in public notes, not in a fetched snapshot)
gives field 203 its old name back and makes DCGM_FI_DEV_GPU_UTIL_RATIO a new 0-1 ratio. The
exporter writes the ratio its name promises; the importer reads a series of that name as percent
when any of its values exceeds 1 (`RATIO_OR_PERCENT`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

from faultcast.catalogue import Kind, Scope, metrics_for


class Vocabulary(enum.Enum):
    """Which names the exporter uses for dcgm-exporter's metrics."""

    CLASSIC = "classic"
    CANONICAL = "canonical"


@dataclass(frozen=True, slots=True)
class DcgmName:
    """One catalogue metric under one vocabulary."""

    metric: str  # the catalogue's name
    name: str  # the exported family, exactly (its samples carry this name: no `_total` appended)
    counter: bool  # the Prometheus type dcgm-exporter declares for it
    unit: str  # of the exported values
    scale: float = 1.0  # exported value = catalogue value x scale


@dataclass(frozen=True, slots=True)
class LabelNames:
    """The names of the node and driver-version labels in one vocabulary."""

    hostname: str
    driver_version: str


LABELS: dict[Vocabulary, LabelNames] = {
    Vocabulary.CLASSIC: LabelNames("Hostname", "DCGM_FI_DRIVER_VERSION"),
    Vocabulary.CANONICAL: LabelNames("hostname", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
}
"""The node and driver-version label names of each vocabulary."""

# Typed counter in dcgm-exporter's default-counters.csv / dcp-metrics-included.csv (the rest of
# what the catalogue exports under a DCGM name is a gauge there, or absent from them and a gauge).
_CLASSIC_COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    }
)

# Catalogue name -> (DCGM 4.6 canonical name, unit, scale from the catalogue's unit). Fields DCGM 4.6
# did not rename (memory copy utilization, framebuffer, ECC totals, PCIe link) keep their names.
_CANONICAL: dict[str, tuple[str, str, float]] = {
    "gpu_temp": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "celsius", 1.0),
    "memory_temp": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "celsius", 1.0),
    "power_usage": ("DCGM_FI_DEV_BOARD_POWER_WATTS", "watts", 1.0),
    "power_limit": ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", "watts", 1.0),
    "total_energy": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "joules", 1e-3),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "hertz", 1e6),
    "mem_clock": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "hertz", 1e6),
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL_RATIO", "ratio", 1e-2),
    "mem_copy_util": ("DCGM_FI_DEV_MEM_COPY_UTIL", "percent", 1.0),
    "fb_used": ("DCGM_FI_DEV_FB_USED", "mebibytes", 1.0),
    "fb_free": ("DCGM_FI_DEV_FB_FREE", "mebibytes", 1.0),
    "fan_speed": ("DCGM_FI_DEV_FAN_SPEED_RATIO", "ratio", 1e-2),
    "pstate": ("DCGM_FI_DEV_GPU_PSTATE", "state", 1.0),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "bitmask", 1.0),
    "ecc_sbe_volatile": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "errors", 1.0),
    "ecc_dbe_volatile": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "errors", 1.0),
    "ecc_sbe_aggregate": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "errors", 1.0),
    "ecc_dbe_aggregate": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "errors", 1.0),
    "retired_pages_sbe": ("DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL", "pages", 1.0),
    "retired_pages_dbe": ("DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL", "pages", 1.0),
    "retired_pages_pending": ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", "bool", 1.0),
    "remapped_rows_correctable": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "rows", 1.0),
    "remapped_rows_uncorrectable": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "rows", 1.0),
    "row_remap_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", "bool", 1.0),
    "row_remap_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILED", "bool", 1.0),
    "pcie_replay": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "replays", 1.0),
    "pcie_link_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN", "generation", 1.0),
    "pcie_link_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "lanes", 1.0),
    "pcie_link_gen_max": ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "generation", 1.0),
    "pcie_link_width_max": ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "lanes", 1.0),
    "nvlink_crc_flit_errors": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", "errors", 1.0),
    "nvlink_crc_data_errors": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL", "errors", 1.0),
    "nvlink_replay_errors": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", "errors", 1.0),
    "nvlink_recovery_errors": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", "errors", 1.0),
    "xid_last": ("DCGM_FI_DEV_XID_ERROR", "xid", 1.0),
}


@dataclass(frozen=True, slots=True)
class ParityField:
    """A field of dcgm-exporter's default counters the collector exports for parity, outside the catalogue.

    Not a model input, not on the wire, not in the telemetry schema: the NVML source reads it into
    `GpuReading.parity` (in `PARITY` order, NaN where NVML gives nothing) and the exporter writes it,
    under the same name, type and labels dcgm-exporter would. A reading without parity values (the
    simulated sources, a reading from the wire) exports none of them.
    """

    key: str  # faultcast's own name for it (never a catalogue name)
    classic: str  # dcgm-exporter's name in default-counters.csv
    canonical: str  # DCGM 4.6's canonical name for the same field id
    counter: bool  # the Prometheus type the CSV row declares
    unit: str  # of the exported value (the same in both vocabularies)
    read: str  # how the collector reads it
    help: str


# fmt: off
PARITY: tuple[ParityField, ...] = (
    ParityField("enc_util", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_ENC_UTIL", False, "percent",
                "nvmlDeviceGetEncoderUtilization[0]", "Encoder utilization."),
    ParityField("dec_util", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_DEC_UTIL", False, "percent",
                "nvmlDeviceGetDecoderUtilization[0]", "Decoder utilization."),
    ParityField("fb_reserved", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_RESERVED", False, "mebibytes",
                "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).reserved // 2**20",
                "Framebuffer memory reserved by the driver."),
    # DCGM field 449: DCGM reads NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX + _TX (KiB, scope UINT_MAX:
    # every link) and publishes the difference since its previous read, per second, divided by 1000
    # (DcgmCacheManager::ReadAndCacheNvLinkBandwidth), an integer "MB/s". A rate, although the CSV
    # types it counter: that type is kept, as dcgm-exporter serves it.
    ParityField("nvlink_bandwidth_total", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", True, "megabytes_per_second",
                "delta of NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX + _RX (KiB, all links) / seconds / 1000",
                "NVLink data throughput, all links, both directions, since the previous scrape."),
    # The DCP fields, as DCGM reads them on GPUs with GPM (Hopper and newer): nvmlGpmMetricsGet
    # between this scrape's sample and the previous one (DcgmGpmManager), percentages / 100.
    ParityField("prof_gr_engine_active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
                False, "ratio", "nvmlGpmMetricsGet(NVML_GPM_METRIC_GRAPHICS_UTIL) / 100",
                "Ratio of time the graphics engine is active."),
    ParityField("prof_pipe_tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
                False, "ratio", "nvmlGpmMetricsGet(NVML_GPM_METRIC_ANY_TENSOR_UTIL) / 100",
                "Ratio of cycles any tensor pipe is active."),
    ParityField("prof_dram_active", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO",
                False, "ratio", "nvmlGpmMetricsGet(NVML_GPM_METRIC_DRAM_BW_UTIL) / 100",
                "Ratio of cycles the device memory interface is active sending or receiving data."),
    ParityField("prof_pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES",
                False, "bytes_per_second", "nvmlGpmMetricsGet(NVML_GPM_METRIC_PCIE_TX_PER_SEC) * 2**20",
                "PCIe transmit throughput, protocol headers and payload."),
    ParityField("prof_pcie_rx_bytes", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
                False, "bytes_per_second", "nvmlGpmMetricsGet(NVML_GPM_METRIC_PCIE_RX_PER_SEC) * 2**20",
                "PCIe receive throughput, protocol headers and payload."),
)
"""dcgm-exporter default fields exported for parity only (see ParityField); `GpuReading.parity` order."""
# fmt: on

PARITY_INDEX: dict[str, int] = {field.key: i for i, field in enumerate(PARITY)}
"""Position of each parity field in `GpuReading.parity`, by key."""


def parity_name(field: ParityField, vocabulary: Vocabulary) -> str:
    """The family a parity field is exported as in `vocabulary`."""
    return field.classic if vocabulary is Vocabulary.CLASSIC else field.canonical


# Names under which DCGM has published a ratio and a percent (see the module docstring).
RATIO_OR_PERCENT = frozenset({"DCGM_FI_DEV_GPU_UTIL_RATIO"})


@cache
def names(vocabulary: Vocabulary) -> dict[str, DcgmName]:
    """Catalogue name -> its dcgm-exporter name, for every GPU metric that has one."""
    out: dict[str, DcgmName] = {}
    for metric in metrics_for(Scope.GPU):
        if metric.dcgm is None:
            continue
        counter = metric.dcgm in _CLASSIC_COUNTERS  # a renamed field keeps its CSV row's type
        if vocabulary is Vocabulary.CLASSIC:
            out[metric.name] = DcgmName(metric.name, metric.dcgm, counter, metric.unit)
        else:
            name, unit, scale = _CANONICAL[metric.name]
            out[metric.name] = DcgmName(metric.name, name, counter, unit, scale)
    return out


@cache
def readable_names() -> dict[str, DcgmName]:
    """Every series name the importer maps to a catalogue metric, in either vocabulary."""
    return {n.name: n for vocabulary in Vocabulary for n in names(vocabulary).values()}


def _check() -> None:
    counters = {n.metric for n in names(Vocabulary.CLASSIC).values() if n.counter}
    catalogue = {m.name for m in metrics_for(Scope.GPU) if m.dcgm is not None and m.kind is Kind.COUNTER}
    # Every catalogue counter is a counter for dcgm-exporter too (the reverse is not true: the
    # retired-pages pending flag); a catalogue change that breaks this must look at the CSVs again.
    if not catalogue <= counters:
        raise ValueError(f"catalogue counters typed gauge for dcgm-exporter: {sorted(catalogue - counters)}")
    taken: dict[str, str] = {}
    for vocabulary in Vocabulary:
        for n in names(vocabulary).values():
            if taken.setdefault(n.name, n.metric) != n.metric:
                raise ValueError(f"{n.name} names both {taken[n.name]} and {n.metric}")
        # A parity field is never also a catalogue metric: that one would be exported twice.
        for field in PARITY:
            name = parity_name(field, vocabulary)
            if taken.setdefault(name, field.key) != field.key:
                raise ValueError(f"{name} names both {taken[name]} and the parity field {field.key}")
    catalogue_names = {m.name for m in metrics_for(Scope.GPU)}
    if catalogue_names & PARITY_INDEX.keys():
        raise ValueError(
            f"parity fields named like catalogue metrics: {sorted(catalogue_names & PARITY_INDEX.keys())}"
        )


_check()
