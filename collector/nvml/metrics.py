"""The groups of GPU metrics NVML is read for: which calls each makes, and how their answers decode.

Each group has one job: `calls(lib)` lists its NVML calls in scrape order, and `decode(raw, at,
values)` turns their answers (None where a call failed), which start at position `at` of `raw`,
into catalogue values. `STANDARD_GROUPS` then an `NvLink` group for the GPU's links make one GPU's
scrape, in this order; a call that hangs keeps the values of the calls before it, so the order is
part of the behaviour (the cheap, telling readings come first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.collector.nvml.lib import Nvml, NvmlCodes
from faultcast.dcgm import PARITY, PARITY_INDEX

IDX = index_of(Scope.GPU)  # catalogue position of every GPU metric, by name
N_VALUES = len(metrics_for(Scope.GPU))
# A scrape's values are the catalogue's, then the parity fields' (faultcast.dcgm.PARITY), in one list.
PARITY_IDX = {key: N_VALUES + i for key, i in PARITY_INDEX.items()}
N_ALL = N_VALUES + len(PARITY)
_MIB = float(2**20)

# The answers of a plan: pynvml's results are ints, lists and ctypes structures, untyped.
Raw = Sequence[Any]


@dataclass(frozen=True, slots=True)
class Call:
    """One NVML call on a GPU: the function's name and its arguments after the device handle."""

    function: str
    args: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FieldCall:
    """One field through nvmlDeviceGetFieldValues; its own nvmlReturn is raised like a call's error."""

    field_id: int


@dataclass(frozen=True, slots=True)
class BoundCall:
    """A step that is more than one plain call (several fields at once, a GPM sample): `make` binds
    it to a device handle once, and the bound reader runs each scrape; its latency is `function`'s."""

    function: str
    make: Callable[[Nvml, NvmlCodes, object], Callable[[], object]]


PlannedCall = Call | FieldCall | BoundCall


class MetricGroup(Protocol):
    """A group of related NVML calls and the catalogue values they give."""

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The group's calls, in scrape order."""
        ...

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Write the values of the answers `raw[at : at + len(calls)]`; leave NaN where one is None."""
        ...

    def close(self) -> None:
        """Release what the group holds in NVML (GPM samples); called once the plan is dropped."""
        ...


class _Group:
    """What most groups share: nothing to release."""

    def close(self) -> None:
        """Nothing held in NVML."""


class _Scalars(_Group):
    """A group whose every call answers one number: catalogue value = answer x scale."""

    # (catalogue position, scale), one per call in `calls` order.
    scales: tuple[tuple[int, float], ...] = ()

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Each answer times its scale into its catalogue value."""
        for idx, scale in self.scales:
            result = raw[at]
            at += 1
            if result is not None:
                values[idx] = result * scale


def _scales(*pairs: tuple[str, float]) -> tuple[tuple[int, float], ...]:
    return tuple((IDX[name], scale) for name, scale in pairs)


class PowerThermal(_Scalars):
    """GPU and memory temperature, power draw and limit, energy since the driver loaded."""

    scales = _scales(
        ("gpu_temp", 1.0),
        ("memory_temp", 1.0),
        ("power_usage", 1e-3),  # mW -> W
        ("power_limit", 1e-3),
        ("total_energy", 1.0),  # already mJ
    )

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """Temperature, the HBM temperature field, power, power limit and energy."""
        return (
            Call("nvmlDeviceGetTemperature", (lib.NVML_TEMPERATURE_GPU,)),
            FieldCall(lib.NVML_FI_DEV_MEMORY_TEMP),
            Call("nvmlDeviceGetPowerUsage"),
            Call("nvmlDeviceGetEnforcedPowerLimit"),
            Call("nvmlDeviceGetTotalEnergyConsumption"),
        )


class Clocks(_Scalars):
    """SM and memory clocks (MHz)."""

    scales = _scales(("sm_clock", 1.0), ("mem_clock", 1.0))

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The SM clock, then the memory clock."""
        return (
            Call("nvmlDeviceGetClockInfo", (lib.NVML_CLOCK_SM,)),
            Call("nvmlDeviceGetClockInfo", (lib.NVML_CLOCK_MEM,)),
        )


_I_GPU_UTIL = IDX["gpu_util"]
_I_MEM_UTIL = IDX["mem_copy_util"]
_I_FB_USED = IDX["fb_used"]
_I_FB_FREE = IDX["fb_free"]


class Utilization(_Group):
    """Compute and memory-copy utilisation (%), framebuffer used and free (MiB)."""

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """Utilisation rates, then memory info."""
        return (Call("nvmlDeviceGetUtilizationRates"), Call("nvmlDeviceGetMemoryInfo"))

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Each structure's fields into their catalogue values."""
        util, memory = raw[at], raw[at + 1]
        if util is not None:
            values[_I_GPU_UTIL] = float(util.gpu)
            values[_I_MEM_UTIL] = float(util.memory)
        if memory is not None:
            values[_I_FB_USED] = memory.used / _MIB
            values[_I_FB_FREE] = memory.free / _MIB


class Fan(_Scalars):
    """Fan speed (% of maximum)."""

    scales = _scales(("fan_speed", 1.0))

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The fan speed."""
        return (Call("nvmlDeviceGetFanSpeed"),)


# Throttle flags decoded from the clock event reasons bitmask (the catalogue's `read` bits).
_THROTTLE_BITS: tuple[tuple[int, int], ...] = (
    (IDX["throttle_sw_power_cap"], 0x04),
    (IDX["throttle_hw_slowdown"], 0x08),
    (IDX["throttle_sw_thermal"], 0x20),
    (IDX["throttle_hw_thermal"], 0x40),
    (IDX["throttle_hw_power_brake"], 0x80),
)


_I_PSTATE = IDX["pstate"]
_I_REASONS = IDX["clock_event_reasons"]


class Throttle(_Group):
    """Performance state and why clocks are held down: the reasons bitmask and one flag per reason."""

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The performance state, then the clock event reasons."""
        return (Call("nvmlDeviceGetPerformanceState"), Call("nvmlDeviceGetCurrentClocksEventReasons"))

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Both numbers as they are, and each throttle flag from its bit of the reasons."""
        pstate, reasons = raw[at], raw[at + 1]
        if pstate is not None:
            values[_I_PSTATE] = pstate * 1.0
        if reasons is not None:
            values[_I_REASONS] = reasons * 1.0
            for idx, bit in _THROTTLE_BITS:
                values[idx] = 1.0 if reasons & bit else 0.0


_REMAPPED_IDX = (
    IDX["remapped_rows_correctable"],
    IDX["remapped_rows_uncorrectable"],
    IDX["row_remap_pending"],
    IDX["row_remap_failure"],
)
# (offset in the group, catalogue position) of the two retired-page lists.
_RETIRED_IDX = ((4, IDX["retired_pages_sbe"]), (5, IDX["retired_pages_dbe"]))
_I_RETIRED_PENDING = IDX["retired_pages_pending"]
# (offset in the group, catalogue position) of the four ECC counts.
_ECC_IDX = tuple(
    enumerate(
        IDX[f"ecc_{kind}_{counter}"] for counter in ("volatile", "aggregate") for kind in ("sbe", "dbe")
    )
)


class MemoryErrors(_Group):
    """HBM health: ECC error counts, retired pages and row remapping."""

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """ECC (corrected/uncorrected x volatile/aggregate), retired pages by cause, pending, remaps."""
        corrected, uncorrected = lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = lib.NVML_VOLATILE_ECC, lib.NVML_AGGREGATE_ECC
        return (
            Call("nvmlDeviceGetTotalEccErrors", (corrected, volatile)),
            Call("nvmlDeviceGetTotalEccErrors", (uncorrected, volatile)),
            Call("nvmlDeviceGetTotalEccErrors", (corrected, aggregate)),
            Call("nvmlDeviceGetTotalEccErrors", (uncorrected, aggregate)),
            Call(
                "nvmlDeviceGetRetiredPages", (lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,)
            ),
            Call("nvmlDeviceGetRetiredPages", (lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,)),
            Call("nvmlDeviceGetRetiredPagesPendingStatus"),
            Call("nvmlDeviceGetRemappedRows"),
        )

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Counts as they are; retired pages as how many pages each list holds; the remap tuple."""
        for offset, idx in _ECC_IDX:
            result = raw[at + offset]
            if result is not None:
                values[idx] = result * 1.0
        for offset, idx in _RETIRED_IDX:
            pages = raw[at + offset]
            if pages is not None:
                values[idx] = float(len(pages))
        pending = raw[at + 6]
        if pending is not None:
            values[_I_RETIRED_PENDING] = pending * 1.0
        remapped = raw[at + 7]
        if remapped is not None:
            for idx, count in zip(_REMAPPED_IDX, remapped, strict=True):
                values[idx] = float(count)


class Pcie(_Scalars):
    """PCIe health and load: replay counter, link generation and width (now and maximum), throughput."""

    scales = _scales(
        ("pcie_replay", 1.0),
        ("pcie_link_gen", 1.0),
        ("pcie_link_width", 1.0),
        ("pcie_link_gen_max", 1.0),
        ("pcie_link_width_max", 1.0),
        ("pcie_tx_bytes_per_second", 1024.0),  # KB/s -> B/s
        ("pcie_rx_bytes_per_second", 1024.0),
    )

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """Replays, link generation and width (current, then maximum), then TX and RX throughput."""
        return (
            Call("nvmlDeviceGetPcieReplayCounter"),
            Call("nvmlDeviceGetCurrPcieLinkGeneration"),
            Call("nvmlDeviceGetCurrPcieLinkWidth"),
            Call("nvmlDeviceGetMaxPcieLinkGeneration"),
            Call("nvmlDeviceGetMaxPcieLinkWidth"),
            Call("nvmlDeviceGetPcieThroughput", (lib.NVML_PCIE_UTIL_TX_BYTES,)),
            Call("nvmlDeviceGetPcieThroughput", (lib.NVML_PCIE_UTIL_RX_BYTES,)),
        )


# NVLink counters in call order, with (sum index, worst-link index).
_NVLINK_COUNTERS: tuple[tuple[str, int, int], ...] = tuple(
    (counter, IDX[f"nvlink_{metric}_errors"], IDX[f"nvlink_{metric}_errors_worst_link"])
    for counter, metric in (
        ("REPLAY", "replay"),
        ("RECOVERY", "recovery"),
        ("CRC_FLIT", "crc_flit"),
        ("CRC_DATA", "crc_data"),
    )
)
_I_LINKS_ACTIVE = IDX["nvlink_links_active"]


class NvLink(_Group):
    """One GPU's NVLink links: how many are up, and each error counter summed and at its worst link."""

    def __init__(self, links: tuple[int, ...]) -> None:
        self.links = links

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The state of every link, then each error counter over every link."""
        calls = [Call("nvmlDeviceGetNvLinkState", (link,)) for link in self.links]
        for counter, _, _ in _NVLINK_COUNTERS:
            code = getattr(lib, f"NVML_NVLINK_ERROR_DL_{counter}")
            calls.extend(Call("nvmlDeviceGetNvLinkErrorCounter", (link, code)) for link in self.links)
        return tuple(calls)

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Links up among those read; per counter the worst link, and the sum only if every link read."""
        n = len(self.links)
        if not n:
            return
        states = [s for s in raw[at : at + n] if s is not None]
        if states:
            values[_I_LINKS_ACTIVE] = float(sum(1 for s in states if s == 1))
        start = at + n
        for _, sum_idx, worst_idx in _NVLINK_COUNTERS:
            counts = raw[start : start + n]
            start += n
            read = [c for c in counts if c is not None]
            if read:
                values[worst_idx] = float(max(read))
                # A sum missing a link would look like a counter reset downstream.
                if len(read) == n:
                    values[sum_idx] = float(sum(read))


# Every GPU's groups before its NVLink group, in scrape order.
STANDARD_GROUPS: tuple[MetricGroup, ...] = (
    PowerThermal(),
    Clocks(),
    Utilization(),
    Fan(),
    Throttle(),
    MemoryErrors(),
    Pcie(),
)
