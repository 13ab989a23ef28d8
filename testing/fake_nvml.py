"""FakeNvml: a stand-in for the `pynvml` module, shipped so tests and benches need no GPU.

It offers the functions NvmlSource calls, with the same names and arguments, and raises the
real `pynvml.NVMLError(code)` (which becomes the matching NVMLError_* subclass), so the
source's error handling runs exactly as over a driver. Constants, ctypes structures and error
classes come from the real `pynvml` module; any NVML function the fake does not implement
raises AttributeError rather than reaching for a driver.

    fake = FakeNvml(gpus=8)
    fake.set_error(2, "nvmlDeviceGetFanSpeed", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.inject_xid(3, 79)
    hang = fake.hang(5, "nvmlDeviceGetPowerUsage")  # blocks until hang.release()
    source = NvmlSource(fake)

GPM (the DCP fields) is supported unless the fake is made with `gpm=False` or told
`set_gpm_supported(gpu, False)` (a pre-Hopper GPU: nvmlGpmQueryDeviceSupport says no, and
nvmlGpmSampleGet answers NOT_SUPPORTED). nvmlGpmMetricsGet answers, for each metric requested, the
value set with `set_value(gpu, "nvmlGpmMetricsGet", value, metric_id)` (NOT_SUPPORTED for one not
set), once both samples were taken on the same GPU, the second after the first. Field values carry
a timestamp from `field_time_us()` (wall-clock microseconds unless a test replaces it).

Values are healthy H100 SXM figures and stay put until changed with `set_value`, `bump`,
`advance`, `set_error`, `lose_gpu`, `inject_xid` or `hang`. Each call is a couple of dict
look-ups, so the bench can subtract the fake's own cost from a scrape. Calls on different GPUs
may come from different threads (NvmlSource reads each GPU on its own), so calls are counted
per GPU and `calls` adds them up.
"""

from __future__ import annotations

import ctypes
import inspect
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

_DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
_DEFAULT_DRIVER = "550.127.08"
_MIB = 2**20
_H100_TOTAL_MIB = 81_559
_H100_RESERVED_MIB = 519  # what nvmlDeviceGetMemoryInfo_v2 reports reserved on an H100 80GB

_NVLINK_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}


class FakeHandle:
    """An opaque device handle; the fake finds its GPU through `index`."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


@dataclass(frozen=True, slots=True)
class FakeEventData:
    """What nvmlEventSetWait returns, shaped like `pynvml.c_nvmlEventData_t`."""

    device: FakeHandle
    eventType: int  # noqa: N815  (pynvml's field name)
    eventData: int  # noqa: N815  (pynvml's field name)
    gpuInstanceId: int = 0  # noqa: N815  (pynvml's field name)
    computeInstanceId: int = 0  # noqa: N815  (pynvml's field name)


@dataclass(eq=False, slots=True)
class FakeEventSet:
    """An event set: which GPUs registered which event types, and the queued events."""

    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event type mask
    queue: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False


class FakeHang:
    """A call that blocks until the test releases it, as a wedged driver call would.

    `entered` counts the calls that reached the hang (after release they pass straight through),
    `blocked` the calls inside it now. No timeout: a test releases it (a fixture's teardown).
    """

    def __init__(self) -> None:
        self._released = threading.Event()
        self._lock = threading.Lock()
        self.entered = 0
        self.blocked = 0

    @property
    def released(self) -> bool:
        """Whether `release` was called."""
        return self._released.is_set()

    def release(self) -> None:
        """Let every blocked call (and every later one) go on."""
        self._released.set()

    def block(self) -> None:
        """Called by the faked function: wait here until released."""
        with self._lock:
            self.entered += 1
            self.blocked += 1
        try:
            self._released.wait()
        finally:
            with self._lock:
                self.blocked -= 1


@dataclass(eq=False, slots=True)
class FakeGpmSample:
    """What the fake knows of one GPM sample: which GPU took it last, and in what order (0: never)."""

    gpu: int = -1
    taken: int = 0


class _FakeGpu:
    __slots__ = (
        "calls",
        "errors",
        "gpm",
        "handle",
        "hangs",
        "index",
        "lost",
        "name",
        "supported_events",
        "uuid",
        "values",
    )

    def __init__(self, index: int, name: str, links: int, gpm: bool = True) -> None:
        self.index = index
        self.handle = FakeHandle(index)
        self.uuid = f"GPU-fa4e0000-0000-4000-8000-{index:012x}"
        self.name = name
        self.lost = False
        self.gpm = gpm
        self.supported_events: int = pynvml.nvmlEventTypeAll
        # Only the thread reading this GPU counts here: no update is lost between threads.
        self.calls: Counter[str] = Counter()
        # (function, args) -> error code; args None means every call of the function.
        self.errors: dict[tuple[str, tuple[object, ...] | None], int] = {}
        self.hangs: dict[tuple[str, tuple[object, ...] | None], FakeHang] = {}
        # Any: the answers are ints, lists and pynvml's (untyped) ctypes structures, and `advance`
        # does arithmetic on them.
        self.values: dict[tuple[str, tuple[object, ...]], Any] = _healthy_h100(index, links)


def _pci_info(index: int) -> object:
    """PCI identity as the binding returns it (bytes in a ctypes structure); buses 0x18, 0x28, ..."""
    bus = 0x18 + 0x10 * index
    return pynvml.nvmlPciInfo_t(
        busIdLegacy=f"0000:{bus:02X}:00.0".encode(),
        domain=0,
        bus=bus,
        device=0,
        pciDeviceId=0x233010DE,
        pciSubSystemId=0x16C110DE,
        busId=f"00000000:{bus:02X}:00.0".encode(),
    )


def _healthy_h100(index: int, links: int) -> dict[tuple[str, tuple[object, ...]], Any]:
    """Values of a busy, healthy H100 SXM; small per-GPU offsets tell the GPUs apart."""
    n = pynvml
    used_mib = 60_000 + index
    values: dict[tuple[str, tuple[object, ...]], Any] = {
        ("nvmlDeviceGetTemperature", (n.NVML_TEMPERATURE_GPU,)): 45 + index % 4,
        ("nvmlDeviceGetFieldValues", (n.NVML_FI_DEV_MEMORY_TEMP,)): 52 + index % 4,
        ("nvmlDeviceGetPowerUsage", ()): 350_000 + 1_000 * index,  # mW
        ("nvmlDeviceGetEnforcedPowerLimit", ()): 700_000,  # mW
        ("nvmlDeviceGetTotalEnergyConsumption", ()): 9_876_543_210 + index,  # mJ since driver load
        ("nvmlDeviceGetClockInfo", (n.NVML_CLOCK_SM,)): 1980,
        ("nvmlDeviceGetClockInfo", (n.NVML_CLOCK_MEM,)): 2619,
        ("nvmlDeviceGetUtilizationRates", ()): n.c_nvmlUtilization_t(gpu=97, memory=41),
        ("nvmlDeviceGetMemoryInfo", ()): n.c_nvmlMemory_t(
            total=_H100_TOTAL_MIB * _MIB, free=(_H100_TOTAL_MIB - used_mib) * _MIB, used=used_mib * _MIB
        ),
        ("nvmlDeviceGetMemoryInfo", (n.nvmlMemory_v2,)): n.c_nvmlMemory_v2_t(
            version=n.nvmlMemory_v2,
            total=_H100_TOTAL_MIB * _MIB,
            reserved=_H100_RESERVED_MIB * _MIB,
            free=(_H100_TOTAL_MIB - _H100_RESERVED_MIB - used_mib) * _MIB,
            used=used_mib * _MIB,
        ),
        ("nvmlDeviceGetFanSpeed", ()): 30,
        ("nvmlDeviceGetPerformanceState", ()): 0,
        ("nvmlDeviceGetCurrentClocksEventReasons", ()): n.nvmlClocksEventReasonNone,
        ("nvmlDeviceGetRetiredPagesPendingStatus", ()): n.NVML_FEATURE_DISABLED,
        ("nvmlDeviceGetRemappedRows", ()): (0, 0, 0, 0),
        ("nvmlDeviceGetPcieReplayCounter", ()): 0,
        ("nvmlDeviceGetCurrPcieLinkGeneration", ()): 5,
        ("nvmlDeviceGetCurrPcieLinkWidth", ()): 16,
        ("nvmlDeviceGetMaxPcieLinkGeneration", ()): 5,
        ("nvmlDeviceGetMaxPcieLinkWidth", ()): 16,
        ("nvmlDeviceGetPcieThroughput", (n.NVML_PCIE_UTIL_TX_BYTES,)): 12_000,  # KB/s
        ("nvmlDeviceGetPcieThroughput", (n.NVML_PCIE_UTIL_RX_BYTES,)): 15_000,
        ("nvmlDeviceGetPciInfo", ()): _pci_info(index),
        # [utilisation %, sampling period in us]: a training GPU's idle video engines.
        ("nvmlDeviceGetEncoderUtilization", ()): [0, 167_000],
        ("nvmlDeviceGetDecoderUtilization", ()): [0, 167_000],
        # GPM metrics in NVML's units: percent, and MiB/s for PCIe.
        ("nvmlGpmMetricsGet", (n.NVML_GPM_METRIC_GRAPHICS_UTIL,)): 97.5,
        ("nvmlGpmMetricsGet", (n.NVML_GPM_METRIC_ANY_TENSOR_UTIL,)): 41.25,
        ("nvmlGpmMetricsGet", (n.NVML_GPM_METRIC_DRAM_BW_UTIL,)): 38.5,
        ("nvmlGpmMetricsGet", (n.NVML_GPM_METRIC_PCIE_TX_PER_SEC,)): 11.75,
        ("nvmlGpmMetricsGet", (n.NVML_GPM_METRIC_PCIE_RX_PER_SEC,)): 14.5,
    }
    if links:
        # NVLink data counters of every link (KiB since the driver loaded), as field values.
        values["nvmlDeviceGetFieldValues", (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,)] = 7_000_000_000 + index
        values["nvmlDeviceGetFieldValues", (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,)] = 6_000_000_000 + index
    for error_type in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        for counter_type in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC):
            values["nvmlDeviceGetTotalEccErrors", (error_type, counter_type)] = 0
    for cause in (
        n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    ):
        values["nvmlDeviceGetRetiredPages", (cause,)] = []
    for link in range(links):
        values["nvmlDeviceGetNvLinkState", (link,)] = n.NVML_FEATURE_ENABLED
        for counter in _NVLINK_COUNTERS.values():
            values["nvmlDeviceGetNvLinkErrorCounter", (link, counter)] = 0
    return values


# Functions taking a device handle first, served from the per-GPU value table.
_DEVICE_FUNCTIONS = frozenset(
    {name for name, _ in _healthy_h100(0, 1)}
    | {
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
    }
    | {"nvmlDeviceGetHandleByIndex", "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet"}
)
_GLOBAL_FUNCTIONS = frozenset(
    {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlEventSetCreate",
        "nvmlEventSetWait",
        "nvmlEventSetFree",
        "nvmlSystemGetDriverVersion",
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
    }
)

K = TypeVar("K")


def _set_or_clear(table: dict[K, int], key: K, code: int | None) -> None:
    if code is None:
        table.pop(key, None)
    else:
        table[key] = code


# NVMLError(code) instantiates the matching NVMLError_* subclass, exactly as the binding raises.
_RAISE = pynvml.NVMLError


class FakeNvml:
    """A configurable fake of the `pynvml` module (see the module docstring)."""

    def __init__(
        self,
        gpus: int = 8,
        *,
        model_name: str = _DEFAULT_MODEL,
        nvlink_links: int = 18,
        driver_version: str = _DEFAULT_DRIVER,
        gpm: bool = True,
    ) -> None:
        self._gpus = [_FakeGpu(i, model_name, nvlink_links, gpm) for i in range(gpus)]
        self.driver_version = driver_version
        # GPM samples allocated and not freed, by the address their handle points at.
        self.gpm_samples: dict[int, FakeGpmSample] = {}
        self._gpm_buffers: dict[int, ctypes.c_int] = {}
        self._gpm_taken = 0
        self._gpm_lock = threading.Lock()
        self.field_time_us: Callable[[], int] = lambda: time.time_ns() // 1000
        self._global_errors: dict[str, int] = {}
        self._global_hangs: dict[str, FakeHang] = {}
        self._init_count = 0
        self.event_sets: list[FakeEventSet] = []
        self._global_calls: Counter[str] = Counter()

    # -- configuration ----------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """Constants, structures and error classes of the real binding; never its functions."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    @property
    def initialized(self) -> bool:
        """Whether NVML is started (more nvmlInit calls than nvmlShutdown)."""
        return self._init_count > 0

    @property
    def calls(self) -> Counter[str]:
        """Calls made so far by function name, all GPUs together (a fresh Counter each time)."""
        total = Counter(dict(self._global_calls))
        for gpu in self._gpus:
            total.update(dict(gpu.calls))  # dict() copies in one step while a worker may add a name
        return total

    def gpu_calls(self, gpu: int) -> int:
        """How many calls were made on one GPU so far."""
        return sum(dict(self._gpus[gpu].calls).values())

    def handle(self, gpu: int) -> FakeHandle:
        """The handle nvmlDeviceGetHandleByIndex(gpu) returns."""
        return self._gpus[gpu].handle

    def set_value(self, gpu: int, function: str, value: object, *args: object) -> None:
        """What `function(handle, *args)` returns on `gpu`, e.g. ("nvmlDeviceGetClockInfo", 1500, NVML_CLOCK_SM).

        For nvmlDeviceGetFieldValues, args is the field id and value the number it reads.
        """
        key = (function, args)
        if key not in self._gpus[gpu].values and function not in (
            "nvmlDeviceGetFieldValues",
            "nvmlGpmMetricsGet",
        ):
            raise KeyError(f"the fake has no {function}{args}; check the name and arguments")
        self._gpus[gpu].values[key] = value

    def get_value(self, gpu: int, function: str, *args: object) -> Any:
        """What `function(handle, *args)` returns on `gpu` now (Any: see `_FakeGpu.values`)."""
        return self._gpus[gpu].values[function, args]

    def bump(self, gpu: int, function: str, delta: int, *args: object) -> None:
        """Add to a numeric value, e.g. bump(0, "nvmlDeviceGetPcieReplayCounter", 5)."""
        self.set_value(gpu, function, self.get_value(gpu, function, *args) + delta, *args)

    def set_error(self, gpu: int | None, function: str, code: int | None, *args: object) -> None:
        """Make `function` raise NVMLError(code) on `gpu` (None: a global function such as nvmlInit).

        With args, only the call with those arguments fails (for nvmlDeviceGetFieldValues, the
        field's own nvmlReturn is set instead and the call succeeds). code None clears it.
        """
        if function not in _DEVICE_FUNCTIONS | _GLOBAL_FUNCTIONS:
            raise KeyError(f"the fake does not implement {function}")
        if gpu is None:
            _set_or_clear(self._global_errors, function, code)
        else:
            _set_or_clear(self._gpus[gpu].errors, (function, args or None), code)

    def hang(self, gpu: int | None, function: str, *args: object) -> FakeHang:
        """Make `function` on `gpu` block until the returned hang is released.

        gpu None: a global function such as nvmlEventSetWait. With args, only the call with those
        arguments hangs (nvmlDeviceGetFieldValues hangs as a whole). The call is counted, then
        blocks; once released it goes on as configured (value, error or loss).
        """
        if function not in _DEVICE_FUNCTIONS | _GLOBAL_FUNCTIONS:
            raise KeyError(f"the fake does not implement {function}")
        hang = FakeHang()
        if gpu is None:
            self._global_hangs[function] = hang
        else:
            self._gpus[gpu].hangs[function, args or None] = hang
        return hang

    def lose_gpu(self, gpu: int) -> None:
        """From now on every call on `gpu` raises NVML_ERROR_GPU_IS_LOST."""
        self._gpus[gpu].lost = True

    def restore_gpu(self, gpu: int) -> None:
        """Undo `lose_gpu`: calls on `gpu` answer again."""
        self._gpus[gpu].lost = False

    def set_gpm_supported(self, gpu: int, supported: bool) -> None:
        """Whether `gpu` offers GPM (Hopper and newer do; a GPU that does not answers NOT_SUPPORTED)."""
        self._gpus[gpu].gpm = supported

    def set_supported_events(self, gpu: int, mask: int) -> None:
        """The event types `gpu` supports (registering others raises NOT_SUPPORTED)."""
        self._gpus[gpu].supported_events = mask

    def inject_xid(self, gpu: int, code: int) -> None:
        """Queue an Xid event on every event set where `gpu` registered for Xids (else it is lost)."""
        event = FakeEventData(self._gpus[gpu].handle, pynvml.nvmlEventTypeXidCriticalError, code)
        for event_set in self.event_sets:
            if event_set.registered.get(gpu, 0) & pynvml.nvmlEventTypeXidCriticalError:
                event_set.queue.append(event)

    def advance(
        self,
        gpu: int,
        *,
        ecc_sbe: int = 0,
        ecc_dbe: int = 0,
        retired_sbe: int = 0,
        retired_dbe: int = 0,
        remapped_correctable: int = 0,
        remapped_uncorrectable: int = 0,
        pcie_replay: int = 0,
        energy_mj: int = 0,
        link: int = 0,
        nvlink_replay: int = 0,
        nvlink_recovery: int = 0,
        nvlink_crc_flit: int = 0,
        nvlink_crc_data: int = 0,
        nvlink_tx_kib: int = 0,
        nvlink_rx_kib: int = 0,
    ) -> None:
        """Move the error counters of `gpu` forward (ECC counts go into volatile and aggregate), and
        its NVLink data counters (every link together)."""
        n = pynvml
        for error_type, delta in (
            (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, ecc_sbe),
            (n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, ecc_dbe),
        ):
            for counter_type in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC):
                self.bump(gpu, "nvmlDeviceGetTotalEccErrors", delta, error_type, counter_type)
        for cause, delta in (
            (n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, retired_sbe),
            (n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, retired_dbe),
        ):
            pages = self.get_value(gpu, "nvmlDeviceGetRetiredPages", cause)
            new = [0x1_0000_0000 + 0x1000 * (len(pages) + i) for i in range(delta)]
            self.set_value(gpu, "nvmlDeviceGetRetiredPages", [*pages, *new], cause)
        corr, unc, pending, failure = self.get_value(gpu, "nvmlDeviceGetRemappedRows")
        rows = (corr + remapped_correctable, unc + remapped_uncorrectable, pending, failure)
        self.set_value(gpu, "nvmlDeviceGetRemappedRows", rows)
        self.bump(gpu, "nvmlDeviceGetPcieReplayCounter", pcie_replay)
        self.bump(gpu, "nvmlDeviceGetTotalEnergyConsumption", energy_mj)
        for name, delta in (
            ("replay", nvlink_replay),
            ("recovery", nvlink_recovery),
            ("crc_flit", nvlink_crc_flit),
            ("crc_data", nvlink_crc_data),
        ):
            self.bump(gpu, "nvmlDeviceGetNvLinkErrorCounter", delta, link, _NVLINK_COUNTERS[name])
        for field_id, delta in (
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvlink_tx_kib),
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, nvlink_rx_kib),
        ):
            if delta:
                self.bump(gpu, "nvmlDeviceGetFieldValues", delta, field_id)

    # -- the faked binding ------------------------------------------------------------------

    def _global(self, function: str) -> None:
        self._global_calls[function] += 1
        hang = self._global_hangs.get(function)
        if hang is not None:
            hang.block()
        code = self._global_errors.get(function)
        if code is not None:
            raise _RAISE(code)

    def _device(self, function: str, handle: object, args: tuple[object, ...]) -> _FakeGpu:
        """Count the call and raise what a driver would; the GPU when the call may go on."""
        if not isinstance(handle, FakeHandle) or handle.index >= len(self._gpus):
            self._global_calls[function] += 1
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[handle.index]
        gpu.calls[function] += 1
        if self._init_count <= 0:
            raise _RAISE(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise _RAISE(pynvml.NVML_ERROR_GPU_IS_LOST)
        if gpu.hangs:
            hang = gpu.hangs.get((function, None)) or gpu.hangs.get((function, args))
            if hang is not None:
                hang.block()
        if gpu.errors:
            code = gpu.errors.get((function, None))
            if code is None:
                code = gpu.errors.get((function, args))
            if code is not None:
                raise _RAISE(code)
        return gpu

    def _value(self, function: str, handle: object, *args: object) -> Any:
        gpu = self._device(function, handle, args)
        try:
            return gpu.values[function, args]
        except KeyError:
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def nvmlInit(self) -> None:  # noqa: N802  (pynvml's function names, here and below)
        """Start NVML (counted: every nvmlInit needs its nvmlShutdown)."""
        self._global("nvmlInit")
        self._init_count += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        """Stop NVML once; NVML_ERROR_UNINITIALIZED when it was not started."""
        self._global("nvmlShutdown")
        if self._init_count <= 0:
            raise _RAISE(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """How many GPUs the fake was made with."""
        self._global("nvmlDeviceGetCount")
        if self._init_count <= 0:
            raise _RAISE(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        """The GPU's FakeHandle; NVML_ERROR_INVALID_ARGUMENT for an index out of range."""
        if not 0 <= index < len(self._gpus):
            self._global_calls["nvmlDeviceGetHandleByIndex"] += 1
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device("nvmlDeviceGetHandleByIndex", self._gpus[index].handle, ()).handle

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        """The GPU's UUID (GPU-fa4e...-<index>)."""
        return self._device("nvmlDeviceGetUUID", handle, ()).uuid

    def nvmlDeviceGetName(self, handle: object) -> str:  # noqa: N802
        """The model name the fake was made with."""
        return self._device("nvmlDeviceGetName", handle, ()).name

    def nvmlSystemGetDriverVersion(self) -> bytes:  # noqa: N802
        """`driver_version` as bytes, as the binding hands back the C string."""
        self._global("nvmlSystemGetDriverVersion")
        if self._init_count <= 0:
            raise _RAISE(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.driver_version.encode()  # the binding hands back the C string's bytes

    def nvmlDeviceGetPciInfo(self, handle: object) -> object:  # noqa: N802
        """The GPU's nvmlPciInfo_t (bus 0x18 + 0x10 x index unless set)."""
        return self._value("nvmlDeviceGetPciInfo", handle)

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        """A new FakeEventSet, kept in `event_sets` until freed."""
        self._global("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:  # noqa: N802, N803
        """Mark the set freed and forget it."""
        self._global("nvmlEventSetFree")
        eventSet.freed = True
        if eventSet in self.event_sets:
            self.event_sets.remove(eventSet)

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:  # noqa: N802
        """The event mask set by `set_supported_events` (all types by default)."""
        return self._device("nvmlDeviceGetSupportedEventTypes", handle, ()).supported_events

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: FakeEventSet) -> None:  # noqa: N802, N803
        """Register the GPU for `eventTypes` on the set; NOT_SUPPORTED for a type it lacks."""
        gpu = self._device("nvmlDeviceRegisterEvents", handle, ())
        if eventTypes & ~gpu.supported_events:
            raise _RAISE(pynvml.NVML_ERROR_NOT_SUPPORTED)
        eventSet.registered[gpu.index] = eventSet.registered.get(gpu.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:  # noqa: N802, N803
        """The next queued event; never blocks, whatever the timeout (an empty queue times out)."""
        self._global("nvmlEventSetWait")
        if eventSet.queue:
            return eventSet.queue.popleft()
        raise _RAISE(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlDeviceGetFieldValues(self, handle: object, fieldIds: list[int | tuple[int, int]]) -> object:  # noqa: N802, N803
        """An array of real `c_nvmlFieldValue_t`, each with its own nvmlReturn, as the binding gives."""
        function = "nvmlDeviceGetFieldValues"
        gpu = self._device(function, handle, ())
        out = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = self.field_time_us()
        for slot, field_id in zip(out, fieldIds, strict=True):
            if isinstance(field_id, tuple):
                slot.fieldId, slot.scopeId = field_id
                field_id = field_id[0]
            else:
                slot.fieldId = field_id
            code = gpu.errors.get((function, (field_id,)))
            value = gpu.values.get((function, (field_id,)))
            if code is not None or value is None:
                # An unknown field reads as NOT_SUPPORTED, as for a field this GPU lacks.
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if code is None else code
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.timestamp = now_us
            if isinstance(value, float):
                slot.valueType, slot.value.dVal = pynvml.NVML_VALUE_TYPE_DOUBLE, value
            elif value < 0:
                slot.valueType, slot.value.sllVal = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, value
            elif value > 0xFFFFFFFF:
                slot.valueType, slot.value.ullVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value
            else:
                slot.valueType, slot.value.uiVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value
        return out

    # GPM: samples are real `c_nvmlGpmSample_t` pointers (to a buffer the fake owns), so they go
    # into pynvml's c_nvmlGpmMetricsGet_t as the driver's would.

    def _gpm_sample(self, sample: object) -> FakeGpmSample:
        address = ctypes.cast(sample, ctypes.c_void_p).value  # type: ignore[arg-type]
        found = self.gpm_samples.get(address or 0)
        if found is None:
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlGpmQueryDeviceSupport(self, device: object) -> object:  # noqa: N802
        """A c_nvmlGpmSupport_t saying whether the GPU offers GPM (`set_gpm_supported`)."""
        gpu = self._device("nvmlGpmQueryDeviceSupport", device, ())
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm)
        )

    def nvmlGpmSampleAlloc(self) -> object:  # noqa: N802
        """A new sample handle, kept in `gpm_samples` until freed."""
        self._global("nvmlGpmSampleAlloc")
        buffer = ctypes.c_int(0)
        sample = ctypes.cast(ctypes.pointer(buffer), pynvml.c_nvmlGpmSample_t)
        address = ctypes.addressof(buffer)
        with self._gpm_lock:
            self._gpm_buffers[address] = buffer
            self.gpm_samples[address] = FakeGpmSample()
        return sample

    def nvmlGpmSampleFree(self, gpmSample: object) -> None:  # noqa: N802, N803
        """Forget the sample; INVALID_ARGUMENT for one not allocated (or freed twice)."""
        self._global("nvmlGpmSampleFree")
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value or 0  # type: ignore[arg-type]
        with self._gpm_lock:
            if self.gpm_samples.pop(address, None) is None:
                raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            del self._gpm_buffers[address]

    def nvmlGpmSampleGet(self, device: object, gpmSample: object) -> object:  # noqa: N802, N803
        """Take a sample on the GPU; NOT_SUPPORTED on a GPU without GPM."""
        gpu = self._device("nvmlGpmSampleGet", device, ())
        if not gpu.gpm:
            raise _RAISE(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample = self._gpm_sample(gpmSample)
        with self._gpm_lock:
            self._gpm_taken += 1
            sample.gpu, sample.taken = gpu.index, self._gpm_taken
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:  # noqa: N802, N803
        """Each requested metric's value set for the samples' GPU (per-metric NOT_SUPPORTED if none).

        INVALID_ARGUMENT unless both samples were taken on one GPU, sample2 after sample1. Errors,
        hangs and loss set for "nvmlGpmMetricsGet" on that GPU apply.
        """
        first, second = self._gpm_sample(metricsGet.sample1), self._gpm_sample(metricsGet.sample2)
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION or second.gpu < 0:
            self._global_calls["nvmlGpmMetricsGet"] += 1
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._device("nvmlGpmMetricsGet", self._gpus[second.gpu].handle, ())
        if first.gpu != second.gpu or not 0 < first.taken < second.taken:
            raise _RAISE(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for slot in metricsGet.metrics[: metricsGet.numMetrics]:
            value = gpu.values.get(("nvmlGpmMetricsGet", (slot.metricId,)))
            if value is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                slot.nvmlReturn, slot.value = pynvml.NVML_SUCCESS, float(value)
        return metricsGet

    # Plain getters: one value per (function, args), as in the table of _healthy_h100.

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetTemperature: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetTemperature", handle, sensor)

    def nvmlDeviceGetPowerUsage(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetPowerUsage: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetPowerUsage", handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetEnforcedPowerLimit: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetEnforcedPowerLimit", handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetTotalEnergyConsumption: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetTotalEnergyConsumption", handle)

    def nvmlDeviceGetClockInfo(self, handle: object, clock_type: int) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetClockInfo: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetClockInfo", handle, clock_type)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetUtilizationRates: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetUtilizationRates", handle)

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetMemoryInfo: the value set for this GPU and arguments (or its error);
        with a version (nvmlMemory_v2), the c_nvmlMemory_v2_t set under that argument."""
        if version:
            return self._value("nvmlDeviceGetMemoryInfo", handle, version)
        return self._value("nvmlDeviceGetMemoryInfo", handle)

    def nvmlDeviceGetFanSpeed(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetFanSpeed: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetFanSpeed", handle)

    def nvmlDeviceGetPerformanceState(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetPerformanceState: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetPerformanceState", handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetCurrentClocksEventReasons: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> object:  # noqa: N802, N803
        """pynvml's nvmlDeviceGetTotalEccErrors: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetTotalEccErrors", handle, errorType, counterType)

    def nvmlDeviceGetRetiredPages(self, device: object, sourceFilter: int) -> list[int]:  # noqa: N802, N803
        """pynvml's nvmlDeviceGetRetiredPages: the value set for this GPU and arguments (or its error)."""
        return list(self._value("nvmlDeviceGetRetiredPages", device, sourceFilter))  # a fresh list, as pynvml

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetRetiredPagesPendingStatus: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetRetiredPagesPendingStatus", device)

    def nvmlDeviceGetRemappedRows(self, device: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetRemappedRows: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetRemappedRows", device)

    def nvmlDeviceGetPcieReplayCounter(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetPcieReplayCounter: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetPcieReplayCounter", handle)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetCurrPcieLinkGeneration: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetCurrPcieLinkGeneration", handle)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetCurrPcieLinkWidth: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetCurrPcieLinkWidth", handle)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetMaxPcieLinkGeneration: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetMaxPcieLinkGeneration", handle)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetMaxPcieLinkWidth: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetMaxPcieLinkWidth", handle)

    def nvmlDeviceGetPcieThroughput(self, device: object, counter: int) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetPcieThroughput: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetPcieThroughput", device, counter)

    def nvmlDeviceGetEncoderUtilization(self, handle: object) -> list[int]:  # noqa: N802
        """pynvml's nvmlDeviceGetEncoderUtilization: [utilisation %, sampling period us] (or its error)."""
        return list(self._value("nvmlDeviceGetEncoderUtilization", handle))

    def nvmlDeviceGetDecoderUtilization(self, handle: object) -> list[int]:  # noqa: N802
        """pynvml's nvmlDeviceGetDecoderUtilization: [utilisation %, sampling period us] (or its error)."""
        return list(self._value("nvmlDeviceGetDecoderUtilization", handle))

    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetNvLinkState: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetNvLinkState", device, link)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: object, link: int, counter: int) -> object:  # noqa: N802
        """pynvml's nvmlDeviceGetNvLinkErrorCounter: the value set for this GPU and arguments (or its error)."""
        return self._value("nvmlDeviceGetNvLinkErrorCounter", device, link, counter)
