"""One GPU's scrape plan: the metric groups' calls bound to its handle, and the decoding of the answers.

A plan is made once per GPU when it opens, so a scrape walks a flat tuple of (function, arguments,
latency accumulator) steps: one call, one clock pair and a few attribute updates per step. The
catalogue's steps come first (`counted` of them: what the collector's health fields count), then
the parity fields' (faultcast.collector.nvml.parity).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from faultcast.collector.nvml.lib import Nvml, NvmlCodes, logger
from faultcast.collector.nvml.metrics import (
    N_ALL,
    STANDARD_GROUPS,
    BoundCall,
    FieldCall,
    MetricGroup,
    NvLink,
    PlannedCall,
    Raw,
)
from faultcast.collector.nvml.parity import Codecs, Gpm, NvLinkThroughput, gpm_supported
from faultcast.collector.nvml.stats import CallStat, stat_in

# Field-value union member per NVML_VALUE_TYPE_* (0..6), as pynvml's c_nvmlValue_t names them.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# One NVML call of a scrape: the bound function, its arguments, where its latency goes.
Step = tuple[Callable[..., object], tuple[object, ...], CallStat]


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps of one GPU's scrape, and where each metric group's answers start among them."""

    steps: tuple[Step, ...] = ()
    parts: tuple[tuple[MetricGroup, int], ...] = ()
    counted: int = 0  # the catalogue's steps, first: the rest read parity fields only

    def decode(self, raw: Raw) -> list[float]:
        """The catalogue values, then the parity values (faultcast.dcgm.PARITY), of one scrape's
        answers (None where a call failed); NaN where none.

        Xid counters and the collector's own health values are not filled in here.
        """
        values = [math.nan] * N_ALL
        for group, at in self.parts:
            group.decode(raw, at, values)
        return values

    def close(self) -> None:
        """Release what the groups hold in NVML (GPM samples)."""
        for group, _ in self.parts:
            group.close()


NO_PLAN = Plan()  # a GPU that has not opened


class Planner:
    """Binds the metric groups' calls to one GPU's device handle."""

    def __init__(self, lib: Nvml, codes: NvmlCodes) -> None:
        self._lib = lib
        self._codes = codes

    def plan(
        self, handle: object, links: tuple[int, ...], stats: dict[str, CallStat], index: int = -1
    ) -> Plan:
        """The plan for the GPU behind `handle` (GPU `index`, for logs); latencies go into `stats`, by
        function name. Raises the binding's error when the GPU is lost while its GPM support is asked."""
        steps: list[Step] = []
        parts: list[tuple[MetricGroup, int]] = []
        for group in (*STANDARD_GROUPS, NvLink(links)):
            parts.append((group, len(steps)))
            steps.extend(self._step(handle, call, stats) for call in group.calls(self._lib))
        counted = len(steps)
        try:
            for group in self._parity_groups(handle, links, index):
                parts.append((group, len(steps)))
                steps.extend(self._step(handle, call, stats) for call in group.calls(self._lib))
        except BaseException:
            for group, _ in parts:
                group.close()
            raise
        return Plan(tuple(steps), tuple(parts), counted)

    def _parity_groups(self, handle: object, links: tuple[int, ...], index: int) -> list[MetricGroup]:
        """The parity fields this GPU can give: codecs always; NVLink throughput with links; GPM if supported."""
        lib, codes = self._lib, self._codes
        groups: list[MetricGroup] = [Codecs()]
        if links:
            groups.append(NvLinkThroughput())
        if gpm_supported(lib, codes, handle, index):
            try:
                groups.append(Gpm(lib, handle))
            except codes.error as err:
                if err.value == codes.gpu_is_lost:
                    raise
                logger.debug("GPU %s: no GPM samples (%s): no DCGM_FI_PROF_* fields", index, err)
        return groups

    def _step(self, handle: object, call: PlannedCall, stats: dict[str, CallStat]) -> Step:
        if isinstance(call, FieldCall):
            reader = self._field_reader(handle, call.field_id)
            return (reader, (), stat_in(stats, "nvmlDeviceGetFieldValues"))
        if isinstance(call, BoundCall):
            return (call.make(self._lib, self._codes, handle), (), stat_in(stats, call.function))
        return (getattr(self._lib, call.function), (handle, *call.args), stat_in(stats, call.function))

    def _field_reader(self, handle: object, field_id: int) -> Callable[[], float]:
        """One field through nvmlDeviceGetFieldValues, raising its per-field nvmlReturn like a call."""
        get, ids = self._lib.nvmlDeviceGetFieldValues, [field_id]
        error, success = self._codes.error, self._codes.success

        def read_field() -> float:
            field = get(handle, ids)[0]
            if field.nvmlReturn != success:
                raise error(field.nvmlReturn)
            return float(getattr(field.value, _VALUE_MEMBERS[field.valueType]))

        return read_field
