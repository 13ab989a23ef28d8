"""One GPU's scrape plan: the metric groups' calls bound to its handle, and the decoding of the answers.

A plan is made once per GPU when it opens, so a scrape walks a flat tuple of (function, arguments,
latency accumulator) steps: one call, one clock pair and a few attribute updates per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from faultcast.collector.nvml_lib import Nvml, NvmlCodes
from faultcast.collector.nvml_metrics import (
    N_VALUES,
    STANDARD_GROUPS,
    FieldCall,
    MetricGroup,
    NvLink,
    PlannedCall,
    Raw,
)
from faultcast.collector.nvml_stats import CallStat, stat_in

# Field-value union member per NVML_VALUE_TYPE_* (0..6), as pynvml's c_nvmlValue_t names them.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# One NVML call of a scrape: the bound function, its arguments, where its latency goes.
Step = tuple[Callable[..., object], tuple[object, ...], CallStat]


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps of one GPU's scrape, and where each metric group's answers start among them."""

    steps: tuple[Step, ...] = ()
    parts: tuple[tuple[MetricGroup, int], ...] = ()

    def decode(self, raw: Raw) -> list[float]:
        """The catalogue values of one scrape's answers (None where a call failed); NaN where none.

        Xid counters and the collector's own health values are not filled in here.
        """
        values = [math.nan] * N_VALUES
        for group, at in self.parts:
            group.decode(raw, at, values)
        return values


NO_PLAN = Plan()  # a GPU that has not opened


class Planner:
    """Binds the metric groups' calls to one GPU's device handle."""

    def __init__(self, lib: Nvml, codes: NvmlCodes) -> None:
        self._lib = lib
        self._codes = codes

    def plan(self, handle: object, links: tuple[int, ...], stats: dict[str, CallStat]) -> Plan:
        """The plan for the GPU behind `handle`; latencies go into `stats`, by function name."""
        steps: list[Step] = []
        parts: list[tuple[MetricGroup, int]] = []
        for group in (*STANDARD_GROUPS, NvLink(links)):
            parts.append((group, len(steps)))
            steps.extend(self._step(handle, call, stats) for call in group.calls(self._lib))
        return Plan(tuple(steps), tuple(parts))

    def _step(self, handle: object, call: PlannedCall, stats: dict[str, CallStat]) -> Step:
        if isinstance(call, FieldCall):
            reader = self._field_reader(handle, call.field_id)
            return (reader, (), stat_in(stats, "nvmlDeviceGetFieldValues"))
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
