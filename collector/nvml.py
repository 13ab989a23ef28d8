"""The NVML source: one GPU reading per device, every GPU metric of the catalogue.

The NVML module is injected (`NvmlSource(FakeNvml())` in tests, `pynvml` by default), so the
whole source runs without a GPU. A scrape never raises for one bad call or one bad GPU:
NOT_SUPPORTED becomes NaN, other errors become NaN plus a failed-call count, and
NVML_ERROR_GPU_IS_LOST marks that GPU lost for the scrape. A lost GPU is tried again on every
later scrape (its first call fails fast), so a GPU that comes back is seen.

A call that hangs (a wedged driver, a GPU falling off the bus) must not stall the scrape, and a C
call cannot be interrupted. So each GPU is read on its own worker thread (a lane), the event
drain on another, and the scrape waits for each lane only until the call in flight has run
`timeout` seconds. Then it stops waiting: the values read so far are kept, the hung call and
the rest of that GPU's plan are missing (NaN), the timeout is counted, one warning is logged,
and the GPU is skipped on later scrapes until the hung call returns. A lane holds at most one
stuck thread, so stuck threads never pile up. One hand-off per GPU per scrape, not per call:
a per-call hand-off costs 15-30 us of CPU, 14-28 ms per 937-call scrape (docs/benchmarks.md).

The hot path is a flat list of (function, arguments, stats) steps built once per GPU at open
time; each step costs one call, one clock pair and a few attribute updates.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from faultcast.catalogue import TRACKED_XIDS, Scope, index_of, metrics_for
from faultcast.readings import GpuReading, Reading

logger = logging.getLogger(__name__)

NAN = math.nan
_MIB = float(2**20)
# A storm of events must not turn one scrape into an endless loop; the rest waits for the next.
_MAX_EVENTS_PER_SCRAPE = 10_000
# NVML answers in micro- to milliseconds; a call still out after this long is treated as hung.
DEFAULT_TIMEOUT_S = 2.0

_IDX = index_of(Scope.GPU)
_N_VALUES = len(metrics_for(Scope.GPU))
_XID_SLOT = {code: i for i, code in enumerate(TRACKED_XIDS)}
_XID_OTHER_SLOT = len(TRACKED_XIDS)
# Counter positions in slot order: the tracked codes, then "other".
_XID_VALUE_IDX = (*(_IDX[f"xid_{code}_events"] for code in TRACKED_XIDS), _IDX["xid_other_events"])

# Field-value union member per NVML_VALUE_TYPE_* (0..6), as pynvml's c_nvmlValue_t names them.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlUnavailable(RuntimeError):  # noqa: N818  (the CLI's name; "unavailable" reads as the error)
    """NVML cannot be used on this machine: no library, no driver, or no GPU."""


@dataclass(frozen=True, slots=True)
class CallStats:
    """Latency of one NVML function across every scrape since the source opened."""

    count: int
    total_seconds: float
    max_seconds: float
    timeouts: int = 0  # calls the scrape stopped waiting for (counted in `count` once they return)

    @property
    def mean_seconds(self) -> float:
        return self.total_seconds / self.count if self.count else NAN


class _Stat:
    """Mutable accumulator behind CallStats; slots keep the per-call update cheap."""

    __slots__ = ("count", "max", "name", "timeouts", "total")

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.timeouts = 0  # written by the scrape thread only; the rest by the lane's worker


def _stat_in(stats: dict[str, _Stat], name: str) -> _Stat:
    stat = stats.get(name)
    if stat is None:
        stat = stats[name] = _Stat(name)
    return stat


_Job = Callable[[], object]


class _Lane:
    """A worker thread for one GPU's calls (or the event drain), so the scrape can stop waiting.

    `busy` is held from `submit` until the job is over. The worker stamps `started` before each
    call; the scrape thread waits for `busy` until the call in flight passes the timeout, then
    sets `abandoned` and moves on. The worker stays in the call (C cannot be interrupted), stops
    at its next check of `abandoned`, and the lane takes no new job until `busy` is free: at most
    one stuck thread per lane. Without a timeout the job runs on the calling thread, through the
    same code. A bare lock, not an Event: its acquire and release are single C calls, which
    makes the hand-off several times cheaper (docs/benchmarks.md).
    """

    __slots__ = (
        "abandoned",
        "busy",
        "jobs",
        "name",
        "raw",
        "result",
        "returned_after",
        "started",
        "stuck_call",
        "submitted",
        "thread",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.busy = threading.Lock()  # released by the worker, whichever thread took it
        self.thread: threading.Thread | None = None  # started on the first job
        self.result: object = None
        self.submitted = 0.0  # when the job was handed over (the source's clock)
        self.started = 0.0  # when the call in flight began
        self.abandoned = False
        self.raw: list[Any] | None = None  # the job's results so far, for a partial reading
        self.stuck_call = ""
        self.returned_after = NAN  # how long the abandoned call took, once it returned

    @property
    def stuck(self) -> bool:
        return self.abandoned and self.busy.locked()

    def wait_idle(self, timeout: float | None) -> bool:
        """Whether the job is over within `timeout` seconds (0: right now; None: no limit)."""
        limit = -1.0 if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)
        if self.busy.acquire(timeout=limit):
            self.busy.release()
            return True
        return False

    def submit(self, job: _Job, now: float, *, threaded: bool) -> None:
        self.result = self.raw = None
        self.abandoned = False
        self.returned_after = NAN
        self.submitted = self.started = now
        if not self.busy.acquire(blocking=False):
            raise RuntimeError(f"NVML lane {self.name} got a job while busy")
        if not threaded:
            self._run(job)
            return
        if self.thread is None:
            self.thread = threading.Thread(
                target=self._serve, name=f"faultcast-nvml-{self.name}", daemon=True
            )
            self.thread.start()
        self.jobs.put(job)

    def _serve(self) -> None:
        jobs = self.jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            self._run(job)
            job = None  # hold no reference to the source between scrapes (it is finalised by GC)

    def _run(self, job: _Job) -> None:
        try:
            self.result = job()
        except Exception:  # jobs catch their own; this keeps the worker alive whatever happens
            logger.exception("NVML worker %s failed unexpectedly", self.name)
        finally:
            self.busy.release()

    def stop(self) -> None:
        """Let the worker end once its job (a stuck call included) is over."""
        if self.thread is not None:
            self.jobs.put(None)
            self.thread = None


def _stop_lanes(lanes: Iterable[_Lane]) -> None:
    for lane in lanes:
        lane.stop()


# One NVML call of a scrape: the bound function, its arguments, where its latency goes.
_Step = tuple[Callable[..., Any], tuple[Any, ...], _Stat]


class _Gpu:
    """Per-GPU state: identity, the precomputed call plan, and the cumulative counters."""

    __slots__ = (
        "driver_version",
        "failed_calls",
        "handle",
        "index",
        "lane",
        "links",
        "name",
        "pci_bus_id",
        "skipped",
        "stats",
        "steps",
        "timed_out",
        "uuid",
        "xid_counts",
        "xid_last",
        "xid_registered",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None  # None until opened; re-opened on later scrapes if that failed
        self.uuid = ""
        self.name = ""
        self.pci_bus_id = ""  # labels only: empty when NVML cannot tell
        self.driver_version = ""
        self.links: tuple[int, ...] = ()
        self.steps: tuple[_Step, ...] = ()
        self.lane = _Lane(f"gpu{index}")
        # Per GPU, so that lanes running side by side never update one accumulator.
        self.stats: dict[str, _Stat] = {}
        # Written by the lane's worker: failed_calls. By the scrape thread: timed_out, skipped
        # (one writer each, so no update is lost while an abandoned worker is still running).
        self.failed_calls = 0
        self.timed_out = 0
        self.skipped = 0
        self.xid_counts = [0] * (len(TRACKED_XIDS) + 1)
        self.xid_last = 0
        self.xid_registered = False


# Positions of the fixed steps in every GPU's plan; the NVLink steps follow at _NVLINK_BASE.
(
    _S_TEMP,
    _S_MEM_TEMP,
    _S_POWER,
    _S_POWER_LIMIT,
    _S_ENERGY,
    _S_SM_CLOCK,
    _S_MEM_CLOCK,
    _S_UTIL,
    _S_MEMORY,
    _S_FAN,
    _S_PSTATE,
    _S_REASONS,
    _S_ECC_SBE_VOL,
    _S_ECC_DBE_VOL,
    _S_ECC_SBE_AGG,
    _S_ECC_DBE_AGG,
    _S_RETIRED_SBE,
    _S_RETIRED_DBE,
    _S_RETIRED_PENDING,
    _S_REMAPPED,
    _S_PCIE_REPLAY,
    _S_PCIE_GEN,
    _S_PCIE_WIDTH,
    _S_PCIE_GEN_MAX,
    _S_PCIE_WIDTH_MAX,
    _S_PCIE_TX,
    _S_PCIE_RX,
    _NVLINK_BASE,
) = range(28)

# (step, value index, scale) for calls whose result is one number.
_SCALARS: tuple[tuple[int, int, float], ...] = tuple(
    (step, _IDX[name], scale)
    for step, name, scale in (
        (_S_TEMP, "gpu_temp", 1.0),
        (_S_MEM_TEMP, "memory_temp", 1.0),
        (_S_POWER, "power_usage", 1e-3),  # mW -> W
        (_S_POWER_LIMIT, "power_limit", 1e-3),
        (_S_ENERGY, "total_energy", 1.0),  # already mJ
        (_S_SM_CLOCK, "sm_clock", 1.0),
        (_S_MEM_CLOCK, "mem_clock", 1.0),
        (_S_FAN, "fan_speed", 1.0),
        (_S_PSTATE, "pstate", 1.0),
        (_S_REASONS, "clock_event_reasons", 1.0),
        (_S_ECC_SBE_VOL, "ecc_sbe_volatile", 1.0),
        (_S_ECC_DBE_VOL, "ecc_dbe_volatile", 1.0),
        (_S_ECC_SBE_AGG, "ecc_sbe_aggregate", 1.0),
        (_S_ECC_DBE_AGG, "ecc_dbe_aggregate", 1.0),
        (_S_RETIRED_PENDING, "retired_pages_pending", 1.0),
        (_S_PCIE_REPLAY, "pcie_replay", 1.0),
        (_S_PCIE_GEN, "pcie_link_gen", 1.0),
        (_S_PCIE_WIDTH, "pcie_link_width", 1.0),
        (_S_PCIE_GEN_MAX, "pcie_link_gen_max", 1.0),
        (_S_PCIE_WIDTH_MAX, "pcie_link_width_max", 1.0),
        (_S_PCIE_TX, "pcie_tx_bytes_per_second", 1024.0),  # KB/s -> B/s
        (_S_PCIE_RX, "pcie_rx_bytes_per_second", 1024.0),
    )
)

# Throttle flags decoded from the clock event reasons bitmask (the catalogue's `read` bits).
_THROTTLE_BITS: tuple[tuple[int, int], ...] = (
    (_IDX["throttle_sw_power_cap"], 0x04),
    (_IDX["throttle_hw_slowdown"], 0x08),
    (_IDX["throttle_sw_thermal"], 0x20),
    (_IDX["throttle_hw_thermal"], 0x40),
    (_IDX["throttle_hw_power_brake"], 0x80),
)

_REMAPPED_IDX = (
    _IDX["remapped_rows_correctable"],
    _IDX["remapped_rows_uncorrectable"],
    _IDX["row_remap_pending"],
    _IDX["row_remap_failure"],
)

# NVLink counters in plan order, with (sum index, worst-link index).
_NVLINK_COUNTER_NAMES = ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA")
_NVLINK_IDX: tuple[tuple[int, int], ...] = (
    (_IDX["nvlink_replay_errors"], _IDX["nvlink_replay_errors_worst_link"]),
    (_IDX["nvlink_recovery_errors"], _IDX["nvlink_recovery_errors_worst_link"]),
    (_IDX["nvlink_crc_flit_errors"], _IDX["nvlink_crc_flit_errors_worst_link"]),
    (_IDX["nvlink_crc_data_errors"], _IDX["nvlink_crc_data_errors_worst_link"]),
)

_I_GPU_UTIL = _IDX["gpu_util"]
_I_MEM_UTIL = _IDX["mem_copy_util"]
_I_FB_USED = _IDX["fb_used"]
_I_FB_FREE = _IDX["fb_free"]
_I_RETIRED_SBE = _IDX["retired_pages_sbe"]
_I_RETIRED_DBE = _IDX["retired_pages_dbe"]
_I_LINKS_ACTIVE = _IDX["nvlink_links_active"]
_I_XID_LAST = _IDX["xid_last"]
_I_CALL_SECONDS = _IDX["nvml_call_seconds"]
_I_SLOWEST = _IDX["nvml_slowest_call_seconds"]
_I_FAILED = _IDX["nvml_failed_calls"]
_I_TIMED_OUT = _IDX["nvml_timed_out_calls"]
_I_UNSUPPORTED = _IDX["nvml_unsupported_fields"]
_I_LOST = _IDX["gpu_lost"]


def _load(nvml: ModuleType | Any) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml  # imported lazily: the package imports fine on machines without a driver
    except ImportError as err:
        raise NvmlUnavailable(
            "cannot use NVML: the nvidia-ml-py package (module pynvml) is not installed"
        ) from err
    return pynvml


def _explain(nvml: Any, err: Any) -> str:
    """A sentence an operator can act on, for an NVMLError raised while starting NVML."""
    code = getattr(err, "value", None)
    reasons = {
        nvml.NVML_ERROR_LIBRARY_NOT_FOUND: "the NVML library (libnvidia-ml.so.1) was not found: "
        "the NVIDIA driver is not installed or not mounted into this container",
        nvml.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        nvml.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
        nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVML library and the kernel driver versions "
        "differ: reload the driver or reboot",
    }
    return reasons.get(code, f"NVML failed to start: {err}")


def nvml_available(nvml: ModuleType | Any = None) -> tuple[bool, str]:
    """Whether NVML loads and sees at least one GPU; the string says why not (or what it saw).

    Starts and shuts NVML down again; used by `--source auto` to choose a source.
    """
    try:
        lib = _load(nvml)
    except NvmlUnavailable as err:
        return False, str(err)
    try:
        lib.nvmlInit()
    except lib.NVMLError as err:
        return False, _explain(lib, err)
    try:
        count = int(lib.nvmlDeviceGetCount())
    except lib.NVMLError as err:
        return False, f"NVML started but could not count GPUs: {err}"
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", err)
    if count == 0:
        return False, "NVML started but found no GPU"
    return True, f"NVML sees {count} GPU(s)"


def _handle_key(handle: Any) -> object:
    """A hashable identity for a device handle.

    pynvml hands out a fresh ctypes pointer object per call (an event's `device` is not the
    object nvmlDeviceGetHandleByIndex returned), so real handles are compared by address.
    """
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle  # a test double's opaque handle object


def _fill_xids(gpu: _Gpu, values: list[float]) -> None:
    """Xid counters and the last code; NaN stays where the GPU could not register for Xid events."""
    if gpu.xid_registered:
        for idx, count in zip(_XID_VALUE_IDX, gpu.xid_counts, strict=True):
            values[idx] = float(count)
        values[_I_XID_LAST] = float(gpu.xid_last)


def _as_text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _set_self_counts(gpu: _Gpu, values: list[float]) -> None:
    """The cumulative failure counters: a timed-out call and a skipped scrape are failures too."""
    values[_I_FAILED] = float(gpu.failed_calls + gpu.timed_out + gpu.skipped)
    values[_I_TIMED_OUT] = float(gpu.timed_out)


def _reading(gpu: _Gpu, values: list[float], *, lost: bool = False) -> GpuReading:
    return GpuReading(
        gpu.index, gpu.uuid, gpu.name, tuple(values), lost=lost,
        pci_bus_id=gpu.pci_bus_id, driver_version=gpu.driver_version,
    )  # fmt: skip


class NvmlSource:
    """Reads every GPU metric of the catalogue through NVML.

    The constructor starts NVML and discovers the GPUs, their NVLink links and the Xid event
    set; it raises NvmlUnavailable when NVML cannot be used. `close()` releases it all.
    Not thread-safe: one collector thread calls `read()`.

    `timeout` bounds each NVML call of a scrape (seconds; None runs every call on the calling
    thread, unbounded, as before timeouts existed). `clock` gives monotonic seconds: it times
    each call and measures the timeout from the call's start.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | Any = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"the NVML call timeout must be positive seconds or None, not {timeout!r}")
        lib = _load(nvml)
        self._nvml: Any = lib
        self._clock = clock
        self._timeout = timeout
        self._threaded = timeout is not None
        self._drain_lane = _Lane("events")
        self._lanes: list[_Lane] = [self._drain_lane]
        # An unclosed source that is garbage collected still ends its idle worker threads.
        self._stop_workers = weakref.finalize(self, _stop_lanes, self._lanes)
        self._error: Any = lib.NVMLError  # the binding's exception root; its .value is the code
        # Permanent absences: the GPU lacks the field, or an older driver lacks the function.
        self._unsupported: frozenset[int] = frozenset(
            {lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND}
        )
        self._gpu_is_lost: int = lib.NVML_ERROR_GPU_IS_LOST
        self._nvml_timeout: int = lib.NVML_ERROR_TIMEOUT
        self._xid_event: int = lib.nvmlEventTypeXidCriticalError
        self._stats: dict[str, _Stat] = {}
        self._warned: set[tuple[int, str, int]] = set()
        self._notes: list[str] = []
        self._event_set: Any = None
        self._by_handle: dict[object, _Gpu] = {}
        self._closed = False
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            raise NvmlUnavailable(f"cannot use NVML: {_explain(lib, err)}") from err
        try:
            count = int(lib.nvmlDeviceGetCount())
            if count == 0:
                raise NvmlUnavailable("cannot use NVML: NVML started but found no GPU")
            self._open_event_set()
            self._driver_version = self._read_driver_version()
            self._gpus = tuple(_Gpu(i) for i in range(count))
            self._lanes.extend(gpu.lane for gpu in self._gpus)
            for gpu in self._gpus:
                gpu.driver_version = self._driver_version
                self._open_gpu(gpu)
        except BaseException as err:
            self._shutdown()
            if isinstance(err, lib.NVMLError):
                raise NvmlUnavailable(f"cannot use NVML: GPU discovery failed: {err}") from err
            raise

    # -- public -----------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    @property
    def notes(self) -> tuple[str, ...]:
        """What went wrong while opening (a GPU without Xid events, a GPU that did not open)."""
        return tuple(self._notes)

    @property
    def call_stats(self) -> dict[str, CallStats]:
        """Latency (and timeouts) per NVML function over every scrape so far, by function name."""
        merged: dict[str, CallStats] = {}
        for stats in (self._stats, *(gpu.stats for gpu in self._gpus)):
            for stat in tuple(stats.values()):  # one C-level copy: a hung GPU's worker may add a name
                if not (stat.count or stat.timeouts):
                    continue
                seen = merged.get(stat.name)
                if seen is None:
                    merged[stat.name] = CallStats(stat.count, stat.total, stat.max, stat.timeouts)
                else:
                    merged[stat.name] = CallStats(
                        seen.count + stat.count,
                        seen.total_seconds + stat.total,
                        max(seen.max_seconds, stat.max),
                        seen.timeouts + stat.timeouts,
                    )
        return dict(sorted(merged.items()))

    def call_stats_json(self) -> dict[str, dict[str, float]]:
        """`call_stats` as plain numbers (count, total, max and mean seconds) for JSON output."""
        return {
            name: {
                "count": stats.count,
                "total_seconds": stats.total_seconds,
                "max_seconds": stats.max_seconds,
                "mean_seconds": stats.mean_seconds,
                "timeouts": stats.timeouts,
            }
            for name, stats in self.call_stats.items()
        }

    def read(self) -> Reading:
        if self._closed:
            raise RuntimeError("NvmlSource.read() after close()")
        self._drain()
        clock, threaded = self._clock, self._threaded
        readings: list[GpuReading | None] = [None] * len(self._gpus)
        running: list[_Gpu] = []
        # Hand every GPU to its lane first, so the GPUs are read side by side...
        for gpu in self._gpus:
            lane = gpu.lane
            if lane.abandoned:
                if lane.busy.locked():
                    readings[gpu.index] = self._skipped_reading(gpu, lane)
                    continue
                logger.info(
                    "GPU %s: %s returned after %.3g s; reading the GPU again",
                    gpu.index,
                    lane.stuck_call,
                    lane.returned_after,
                )
            lane.submit(functools.partial(self._gpu_job, gpu, lane), clock(), threaded=threaded)
            running.append(gpu)
        # ...then collect them, each only until its call in flight overruns. Last lane first: it
        # usually finishes last, so this thread wakes once instead of once per GPU (each lane's
        # deadline is its own, so the order changes no outcome).
        for gpu in reversed(running):
            lane = gpu.lane
            result = lane.result if self._wait(lane) else self._abandon(gpu, lane)
            readings[gpu.index] = result if isinstance(result, GpuReading) else self._blank_reading(gpu)
        return Reading(gpus=tuple(r for r in readings if r is not None))

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for hung NVML calls to return; whether none is left.

        A scrape never waits for them; this is for an orderly exit and for tests.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self._lanes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not lane.wait_idle(left):
                return False
        return True

    def close(self) -> None:
        """Release NVML; does not wait for a hung call (see `join`)."""
        if self._closed:
            return
        self._closed = True
        self._stop_workers()
        stuck = [lane.name for lane in self._lanes if lane.stuck]
        if stuck:
            # nvmlShutdown would queue behind the hung call in the driver; the exit frees NVML anyway.
            logger.warning(
                "closing with NVML calls still hung (%s): NVML is left initialised", ", ".join(stuck)
            )
            return
        self._shutdown()

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening ----------------------------------------------------------------------------

    def _stat(self, name: str) -> _Stat:
        return _stat_in(self._stats, name)

    def _open_event_set(self) -> None:
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
        except self._nvml.NVMLError as err:
            self._note("no NVML event set, Xid events will not be counted: %s", err)

    def _read_driver_version(self) -> str:
        """The driver version, a label on every GPU series (dcgm-exporter's DCGM_FI_DRIVER_VERSION)."""
        try:
            return _as_text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError as err:
            self._note("no driver version from NVML, the label is left out: %s", err)
            return ""

    def _read_pci_bus_id(self, gpu: _Gpu, handle: Any) -> str:
        """The GPU's PCI bus id (dcgm-exporter's pci_bus_id label); a label, so a failure costs nothing else."""
        try:
            return _as_text(self._nvml.nvmlDeviceGetPciInfo(handle).busId)
        except self._nvml.NVMLError as err:
            logger.debug("GPU %s: no PCI bus id: %s", gpu.index, err)
            return ""

    def _open_gpu(self, gpu: _Gpu, *, quiet: bool = False) -> None:
        """Identity, NVLink links, Xid registration and the call plan of one GPU.

        A GPU that fails here (lost, no permission) is left with handle None, reported lost and
        tried again on the next scrape; the other GPUs carry on.
        """
        lib = self._nvml
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
            gpu.uuid = _as_text(lib.nvmlDeviceGetUUID(handle))
            gpu.name = _as_text(lib.nvmlDeviceGetName(handle))
            gpu.links = self._discover_links(handle)
            gpu.pci_bus_id = self._read_pci_bus_id(gpu, handle)
        except lib.NVMLError as err:
            if quiet:
                logger.debug("GPU %s still does not open: %s", gpu.index, err)
            else:
                self._note("GPU %s did not open, reported lost until it does: %s", gpu.index, err)
            return
        self._register_xid(gpu, handle)
        gpu.steps = self._plan(handle, gpu.links, gpu.stats)
        gpu.handle = handle
        self._by_handle[_handle_key(handle)] = gpu

    def _reopen(self, gpu: _Gpu) -> bool:
        self._open_gpu(gpu, quiet=True)
        if gpu.handle is None:
            gpu.failed_calls += 1  # one failed open attempt per scrape
            return False
        logger.warning("GPU %s opened on a later scrape (%s)", gpu.index, gpu.uuid)
        return True

    def _discover_links(self, handle: Any) -> tuple[int, ...]:
        lib = self._nvml
        absent = (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT)
        links = []
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                lib.nvmlDeviceGetNvLinkState(handle, link)
            except lib.NVMLError as err:
                if err.value in absent:
                    continue
                if err.value == self._gpu_is_lost:
                    raise
            links.append(link)  # up, down or unreadable now: it exists, so it is read every scrape
        return tuple(links)

    def _register_xid(self, gpu: _Gpu, handle: Any) -> None:
        lib = self._nvml
        if self._event_set is None:
            return
        try:
            supported = int(lib.nvmlDeviceGetSupportedEventTypes(handle))
            if not supported & self._xid_event:
                self._note("GPU %s does not report Xid events", gpu.index)
                return
            lib.nvmlDeviceRegisterEvents(handle, self._xid_event, self._event_set)
        except lib.NVMLError as err:
            self._note("GPU %s: Xid event registration failed, Xids not counted: %s", gpu.index, err)
            return
        gpu.xid_registered = True

    def _plan(self, handle: Any, links: tuple[int, ...], stats: dict[str, _Stat]) -> tuple[_Step, ...]:
        """The calls of one scrape of one GPU, in the order of the _S_* positions."""
        lib = self._nvml
        corrected, uncorrected = lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = lib.NVML_VOLATILE_ECC, lib.NVML_AGGREGATE_ECC

        def step(name: str, *args: Any) -> _Step:
            return (getattr(lib, name), (handle, *args), _stat_in(stats, name))

        steps = [
            step("nvmlDeviceGetTemperature", lib.NVML_TEMPERATURE_GPU),
            (
                self._field_reader(handle, lib.NVML_FI_DEV_MEMORY_TEMP),
                (),
                _stat_in(stats, "nvmlDeviceGetFieldValues"),
            ),
            step("nvmlDeviceGetPowerUsage"),
            step("nvmlDeviceGetEnforcedPowerLimit"),
            step("nvmlDeviceGetTotalEnergyConsumption"),
            step("nvmlDeviceGetClockInfo", lib.NVML_CLOCK_SM),
            step("nvmlDeviceGetClockInfo", lib.NVML_CLOCK_MEM),
            step("nvmlDeviceGetUtilizationRates"),
            step("nvmlDeviceGetMemoryInfo"),
            step("nvmlDeviceGetFanSpeed"),
            step("nvmlDeviceGetPerformanceState"),
            step("nvmlDeviceGetCurrentClocksEventReasons"),
            step("nvmlDeviceGetTotalEccErrors", corrected, volatile),
            step("nvmlDeviceGetTotalEccErrors", uncorrected, volatile),
            step("nvmlDeviceGetTotalEccErrors", corrected, aggregate),
            step("nvmlDeviceGetTotalEccErrors", uncorrected, aggregate),
            step("nvmlDeviceGetRetiredPages", lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            step("nvmlDeviceGetRetiredPages", lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
            step("nvmlDeviceGetRetiredPagesPendingStatus"),
            step("nvmlDeviceGetRemappedRows"),
            step("nvmlDeviceGetPcieReplayCounter"),
            step("nvmlDeviceGetCurrPcieLinkGeneration"),
            step("nvmlDeviceGetCurrPcieLinkWidth"),
            step("nvmlDeviceGetMaxPcieLinkGeneration"),
            step("nvmlDeviceGetMaxPcieLinkWidth"),
            step("nvmlDeviceGetPcieThroughput", lib.NVML_PCIE_UTIL_TX_BYTES),
            step("nvmlDeviceGetPcieThroughput", lib.NVML_PCIE_UTIL_RX_BYTES),
        ]
        assert len(steps) == _NVLINK_BASE
        # NVLink: the state of every link, then each error counter over every link.
        steps.extend(step("nvmlDeviceGetNvLinkState", link) for link in links)
        for counter in _NVLINK_COUNTER_NAMES:
            code = getattr(lib, f"NVML_NVLINK_ERROR_DL_{counter}")
            steps.extend(step("nvmlDeviceGetNvLinkErrorCounter", link, code) for link in links)
        return tuple(steps)

    def _field_reader(self, handle: Any, field_id: int) -> Callable[[], float]:
        """One field through nvmlDeviceGetFieldValues, raising its per-field nvmlReturn like a call."""
        get, ids = self._nvml.nvmlDeviceGetFieldValues, [field_id]
        error, success = self._error, self._nvml.NVML_SUCCESS

        def read_field() -> float:
            field = get(handle, ids)[0]
            if field.nvmlReturn != success:
                raise error(field.nvmlReturn)
            return float(getattr(field.value, _VALUE_MEMBERS[field.valueType]))

        return read_field

    def _note(self, message: str, *args: object) -> None:
        logger.warning(message, *args)
        self._notes.append(message % args)

    # -- reading ----------------------------------------------------------------------------

    def _wait(self, lane: _Lane) -> bool:
        """Whether the lane's job finished before its call in flight ran `timeout` seconds."""
        clock, timeout = self._clock, self._timeout
        if timeout is None:
            return True  # the job ran on this thread
        while True:
            # The worker restamps `started` per call, so the deadline moves on with the calls.
            remaining = lane.started + timeout - clock()
            if lane.wait_idle(remaining):
                return True
            if remaining <= 0.0:
                return False

    def _drain(self) -> None:
        """The event drain on its lane, bounded like any call; the GPUs are read after it."""
        if self._event_set is None:
            return
        lane = self._drain_lane
        if lane.abandoned:
            if lane.busy.locked():
                return  # still hung: Xid events stay queued in NVML until it returns
            logger.info("nvmlEventSetWait returned after %.3g s; draining events again", lane.returned_after)
        lane.submit(functools.partial(self._drain_events, lane), self._clock(), threaded=self._threaded)
        if not self._wait(lane):
            lane.abandoned = True
            lane.stuck_call = "nvmlEventSetWait"
            self._stat("nvmlEventSetWait").timeouts += 1
            logger.warning(
                "nvmlEventSetWait did not return within %s s: Xid events are not counted until it does",
                self._timeout,
            )

    def _drain_events(self, lane: _Lane) -> None:
        """Take every queued event without waiting; Xids count on the GPU that raised them."""
        wait, event_set, clock = self._nvml.nvmlEventSetWait, self._event_set, self._clock
        stat = self._stat("nvmlEventSetWait")
        for _ in range(_MAX_EVENTS_PER_SCRAPE):
            start = lane.started = clock()
            try:
                event = wait(event_set, 0)
            except self._error as err:
                lane.returned_after = clock() - start
                self._time(stat, lane.returned_after)
                if getattr(err, "value", None) != self._nvml_timeout:  # NVML's timeout = queue empty
                    logger.warning("nvmlEventSetWait failed, events wait for the next scrape: %s", err)
                return
            lane.returned_after = clock() - start
            self._time(stat, lane.returned_after)
            self._count_event(event)
            if lane.abandoned:  # the scrape went on without this drain; the event above still counts
                return

    def _count_event(self, event: Any) -> None:
        if not int(event.eventType) & self._xid_event:
            return
        gpu = self._by_handle.get(_handle_key(event.device))
        if gpu is None:
            logger.warning("Xid %s from a device this source did not open", event.eventData)
            return
        code = int(event.eventData)
        gpu.xid_counts[_XID_SLOT.get(code, _XID_OTHER_SLOT)] += 1
        gpu.xid_last = code

    @staticmethod
    def _time(stat: _Stat, seconds: float) -> None:
        stat.count += 1
        stat.total += seconds
        if seconds > stat.max:
            stat.max = seconds

    def _gpu_job(self, gpu: _Gpu, lane: _Lane) -> GpuReading | None:
        """One GPU's part of a scrape, run on its lane; None once the scrape stopped waiting."""
        try:
            if gpu.handle is None and not self._reopen(gpu):
                return self._lost_reading(gpu, 0.0, 0.0, 0)
            return self._read_gpu(gpu, lane)
        except Exception:  # a binding surprise on one GPU must not sink the scrape
            logger.exception("reading GPU %s failed unexpectedly", gpu.index)
            gpu.failed_calls += 1
            return self._blank_reading(gpu)

    def _read_gpu(self, gpu: _Gpu, lane: _Lane) -> GpuReading | None:
        clock, error = self._clock, self._error
        raw: list[Any] = []
        lane.raw = raw  # what the scrape keeps if it stops waiting
        append = raw.append
        spent = slowest = 0.0
        unsupported = 0
        for fn, args, stat in gpu.steps:
            failure = None
            start = lane.started = clock()
            try:
                value = fn(*args)
            except error as err:
                value, failure = None, err
            seconds = clock() - start
            stat.count += 1
            stat.total += seconds
            if seconds > stat.max:
                stat.max = seconds
            if lane.abandoned:
                # The scrape reported this call missing and went on; the GPU's next scrape
                # starts afresh, so nothing more is called on it now.
                lane.returned_after = seconds
                return None
            spent += seconds
            if seconds > slowest:
                slowest = seconds
            if failure is not None:
                if failure.value in self._unsupported:
                    unsupported += 1
                else:
                    gpu.failed_calls += 1
                    if failure.value == self._gpu_is_lost:
                        # Nothing more will answer this scrape; later scrapes try again.
                        return self._lost_reading(gpu, spent, slowest, unsupported)
                    self._warn_once(gpu, stat.name, failure)
            append(value)

        values = self._decode(gpu, raw)
        values[_I_CALL_SECONDS] = spent
        values[_I_SLOWEST] = slowest
        _set_self_counts(gpu, values)
        values[_I_UNSUPPORTED] = float(unsupported)
        values[_I_LOST] = 0.0
        return _reading(gpu, values)

    def _abandon(self, gpu: _Gpu, lane: _Lane) -> GpuReading:
        """Stop waiting for a GPU whose call overran: keep what it read, count it, warn once."""
        lane.abandoned = True  # first, so the worker calls nothing more on this GPU
        now = self._clock()
        raw = lane.raw
        answered = None if raw is None else raw[:]  # one C-level copy while the worker may append
        if answered is None:  # a GPU being opened again, or a worker that never got to run
            lane.stuck_call = "opening the GPU" if gpu.handle is None else "the start of its scrape"
        elif len(answered) < len(gpu.steps):
            stat = gpu.steps[len(answered)][2]
            stat.timeouts += 1
            lane.stuck_call = stat.name
        else:
            lane.stuck_call = "the end of its scrape"  # every call answered, just at the deadline
        gpu.timed_out += 1
        logger.warning(
            "GPU %s: %s did not return within %s s: reported missing, and the GPU is skipped "
            "until the call returns",
            gpu.index,
            lane.stuck_call,
            self._timeout,
        )
        if answered:
            # Values read before the hang stand; the hung call and the rest are missing.
            values = self._decode(gpu, answered + [None] * (len(gpu.steps) - len(answered)))
        else:
            values = [NAN] * _N_VALUES
            _fill_xids(gpu, values)
        values[_I_CALL_SECONDS] = now - lane.submitted
        values[_I_SLOWEST] = now - lane.started
        _set_self_counts(gpu, values)
        values[_I_UNSUPPORTED] = NAN  # not known for the calls that were not made
        values[_I_LOST] = 0.0
        return _reading(gpu, values)

    def _skipped_reading(self, gpu: _Gpu, lane: _Lane) -> GpuReading:
        """A GPU whose hung call has not returned: nothing is called, the skip counts as a failure.

        The slowest call is the hung one, still in flight: its age so far.
        """
        gpu.skipped += 1
        logger.debug("GPU %s: %s still hung, GPU skipped", gpu.index, lane.stuck_call)
        values = [NAN] * _N_VALUES
        _fill_xids(gpu, values)
        values[_I_CALL_SECONDS] = 0.0
        values[_I_SLOWEST] = self._clock() - lane.started
        _set_self_counts(gpu, values)
        values[_I_LOST] = 0.0
        return _reading(gpu, values)

    def _warn_once(self, gpu: _Gpu, name: str, err: Any) -> None:
        key = (gpu.index, name, getattr(err, "value", -1))
        if key in self._warned:
            logger.debug("GPU %s: %s failed: %s", gpu.index, name, err)
        else:
            self._warned.add(key)
            logger.warning("GPU %s: %s failed (reported as NaN, logged once): %s", gpu.index, name, err)

    @staticmethod
    def _decode(gpu: _Gpu, raw: list[Any]) -> list[float]:
        """Turn the raw results of one GPU's plan (None where a call failed) into packed values."""
        values = [NAN] * _N_VALUES
        for step, idx, scale in _SCALARS:
            result = raw[step]
            if result is not None:
                values[idx] = result * scale
        reasons = raw[_S_REASONS]
        if reasons is not None:
            for idx, bit in _THROTTLE_BITS:
                values[idx] = 1.0 if reasons & bit else 0.0
        util = raw[_S_UTIL]
        if util is not None:
            values[_I_GPU_UTIL] = float(util.gpu)
            values[_I_MEM_UTIL] = float(util.memory)
        memory = raw[_S_MEMORY]
        if memory is not None:
            values[_I_FB_USED] = memory.used / _MIB
            values[_I_FB_FREE] = memory.free / _MIB
        for step, idx in ((_S_RETIRED_SBE, _I_RETIRED_SBE), (_S_RETIRED_DBE, _I_RETIRED_DBE)):
            if raw[step] is not None:
                values[idx] = float(len(raw[step]))
        remapped = raw[_S_REMAPPED]
        if remapped is not None:
            for idx, count in zip(_REMAPPED_IDX, remapped, strict=True):
                values[idx] = float(count)

        n = len(gpu.links)
        if n:
            states = [s for s in raw[_NVLINK_BASE : _NVLINK_BASE + n] if s is not None]
            if states:
                values[_I_LINKS_ACTIVE] = float(sum(1 for s in states if s == 1))
            start = _NVLINK_BASE + n
            for sum_idx, worst_idx in _NVLINK_IDX:
                counts = raw[start : start + n]
                start += n
                read = [c for c in counts if c is not None]
                if read:
                    values[worst_idx] = float(max(read))
                    # A sum missing a link would look like a counter reset downstream.
                    if len(read) == n:
                        values[sum_idx] = float(sum(read))

        _fill_xids(gpu, values)
        return values

    @staticmethod
    def _lost_reading(gpu: _Gpu, spent: float, slowest: float, unsupported: int) -> GpuReading:
        """Everything NaN except the self-health metrics and the Xid bookkeeping.

        The Xid counters come from the collector's event set, not from the lost device, and an
        Xid 79 (fallen off the bus) is exactly what must survive the loss.
        """
        values = [NAN] * _N_VALUES
        _fill_xids(gpu, values)
        values[_I_CALL_SECONDS] = spent
        values[_I_SLOWEST] = slowest
        _set_self_counts(gpu, values)
        values[_I_UNSUPPORTED] = float(unsupported)
        values[_I_LOST] = 1.0
        return _reading(gpu, values, lost=True)

    @staticmethod
    def _blank_reading(gpu: _Gpu) -> GpuReading:
        values = [NAN] * _N_VALUES
        _set_self_counts(gpu, values)
        values[_I_LOST] = 0.0
        return _reading(gpu, values)

    # -- closing ----------------------------------------------------------------------------

    def _shutdown(self) -> None:
        lib = self._nvml
        if self._event_set is not None:
            try:
                lib.nvmlEventSetFree(self._event_set)
            except lib.NVMLError as err:
                logger.debug("nvmlEventSetFree failed: %s", err)
            self._event_set = None
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", err)
