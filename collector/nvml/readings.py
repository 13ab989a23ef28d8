"""Sample assembly: one GPU's decoded values and the collector's bookkeeping, as a GpuReading.

Every reading carries the cumulative failure counters; what else it carries depends on how the
scrape of that GPU went: read in full, lost, abandoned at the deadline, skipped while a call is
still hung, or failed unexpectedly (blank).
"""

from __future__ import annotations

import math

from faultcast.collector.nvml.device import GpuState
from faultcast.collector.nvml.metrics import IDX, N_ALL, N_VALUES
from faultcast.readings import GpuReading

NAN = math.nan

_I_CALL_SECONDS = IDX["nvml_call_seconds"]
_I_SLOWEST = IDX["nvml_slowest_call_seconds"]
_I_FAILED = IDX["nvml_failed_calls"]
_I_TIMED_OUT = IDX["nvml_timed_out_calls"]
_I_UNSUPPORTED = IDX["nvml_unsupported_fields"]
_I_LOST = IDX["gpu_lost"]


def gpu_reading(
    gpu: GpuState,
    values: list[float] | None,
    *,
    call_seconds: float,
    slowest: float,
    unsupported: float,
    lost: bool = False,
) -> GpuReading:
    """The reading of `gpu`: `values` (None: all NaN) plus Xids, timings and failure counts.

    `values` holds the catalogue's values, then the parity fields' (Plan.decode). `call_seconds` is
    the NVML time spent on the GPU's catalogue calls this scrape, `slowest` its slowest call,
    `unsupported` how many calls answered NOT_SUPPORTED (NaN when not known). A lost GPU keeps its
    Xid counters: they come from the collector's event set, not from the lost device, and an Xid
    79 (fallen off the bus) is exactly what must survive the loss.
    """
    if values is None:
        values = [NAN] * N_ALL
    gpu.xids.fill(values)
    values[_I_CALL_SECONDS] = call_seconds
    values[_I_SLOWEST] = slowest
    _set_self_counts(gpu, values)
    values[_I_UNSUPPORTED] = unsupported
    values[_I_LOST] = 1.0 if lost else 0.0
    return _reading(gpu, values, lost=lost)


def blank_reading(gpu: GpuState) -> GpuReading:
    """A GPU whose read failed unexpectedly: only the failure counters (and gpu_lost 0)."""
    values = [NAN] * N_ALL
    _set_self_counts(gpu, values)
    values[_I_LOST] = 0.0
    return _reading(gpu, values)


def _set_self_counts(gpu: GpuState, values: list[float]) -> None:
    """The cumulative failure counters: a timed-out call and a skipped scrape are failures too."""
    values[_I_FAILED] = float(gpu.failed_calls + gpu.timed_out + gpu.skipped)
    values[_I_TIMED_OUT] = float(gpu.timed_out)


def _reading(gpu: GpuState, values: list[float], *, lost: bool = False) -> GpuReading:
    return GpuReading(
        gpu.index,
        gpu.uuid,
        gpu.name,
        tuple(values[:N_VALUES]),
        lost=lost,
        pci_bus_id=gpu.pci_bus_id,
        driver_version=gpu.driver_version,
        parity=tuple(values[N_VALUES:]),
    )
