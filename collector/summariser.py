"""One sample per epoch-aligned window of scrapes instead of every scrape (faultcast.step_summary).

A collector scraping every second ships, with a 60 s step, one sample a minute: the window's last
scrape (its values, counters at the window's end, its devices, host and health), with each GPU
carrying the `StepSummary` of its gauges over the window's scrapes and `window_s` set to the step.
Windows are epoch-aligned in the snapshots' event time (`time_unix_nano // step`), the grid the
service scores on, so a simulated source's virtual clock decides them, not the wall clock.

A window closes when a scrape lands in another window (its sample is returned by `add`) or when the
collector stops (`flush`). Per GPU (by index): a scrape whose reading already carries a summary (a
source that knows its step, such as the twin) counts as that summary's scrapes; a lost GPU's
scrapes are left out (it has no values), so a GPU lost mid-window ships lost, with the summary of
the scrapes where it still had values; a GPU whose UUID changes (a swap, a reset that renumbers)
starts its summary again at the change.
"""

from __future__ import annotations

import dataclasses

from faultcast.readings import GpuReading, NodeSnapshot
from faultcast.step_summary import StepSummary, combine

_COMPACT_AT = 4096
"""Parts kept per GPU before they are combined into one, to bound memory on long steps. Combining
in two stages weights a partial gauge's mean by the parts' scrapes, not by the scrapes that read it,
so a gauge missing in some of more than this many scrapes gets a slightly different mean."""


class StepSummariser:
    """Turns a node's scrapes into one sample per `step_s` window of event time."""

    def __init__(self, step_s: float) -> None:
        step_ns = round(step_s * 1e9)
        if step_ns < 1:
            raise ValueError(f"a summary step must be positive, got {step_s} s")
        self.step_s = step_s
        self.step_ns = step_ns
        self.scrapes = 0  # scrapes taken in
        self.samples = 0  # samples returned (closed windows)
        self._window: int | None = None
        self._last: NodeSnapshot | None = None
        self._parts: dict[int, tuple[str, list[StepSummary]]] = {}  # GPU index -> (uuid, parts)

    def add(self, snapshot: NodeSnapshot) -> NodeSnapshot | None:
        """Take one scrape; returns the previous window's sample when this scrape lands in another window."""
        window = snapshot.time_unix_nano // self.step_ns
        closed = self.flush() if self._window is not None and window != self._window else None
        self._window = window
        self._last = snapshot
        self.scrapes += 1
        for gpu in snapshot.gpus:
            if gpu.lost:
                continue
            part = gpu.summary if gpu.summary is not None else StepSummary.of(gpu.values)
            uuid, parts = self._parts.get(gpu.index, (gpu.uuid, []))
            if uuid != gpu.uuid:  # another GPU in this slot: its summary starts here
                parts = []
            parts.append(part)
            if len(parts) >= _COMPACT_AT:
                parts = [combine(parts)]
            self._parts[gpu.index] = (gpu.uuid, parts)
        return closed

    def flush(self, *, partial: bool = False) -> NodeSnapshot | None:
        """The open window's sample (None when no scrape is waiting); the next scrape opens a new window.
        `partial`: the window goes on after it (a failure seen mid-window ships what came so far): its
        `window_s` is 0, so that it does not close the step; the window's last sample does, and the
        service combines the two summaries as it would the whole window's."""
        last = self._last
        if last is None:
            return None
        gpus = tuple(self._summarised(g) for g in last.gpus)
        self._window, self._last, self._parts = None, None, {}
        self.samples += 1
        return dataclasses.replace(last, gpus=gpus, window_s=0.0 if partial else self.step_s, sequence=0)

    def _summarised(self, gpu: GpuReading) -> GpuReading:
        uuid, parts = self._parts.get(gpu.index, ("", []))
        if not parts or (uuid != gpu.uuid and not gpu.lost):
            return dataclasses.replace(gpu, summary=None)
        return dataclasses.replace(gpu, summary=combine(parts))
