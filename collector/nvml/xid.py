"""Xid events: the NVML event set, each GPU's registration, and the per-scrape drain that counts them.

An Xid is the driver's report of a GPU error (79: the GPU fell off the bus). NVML queues them on an
event set; every scrape drains the queue without waiting and counts each Xid on the GPU that raised
it. The counters live on the collector's side, so they survive the loss of the GPU. The drain runs
on its own lane under the call deadline, like a GPU's calls: a hung drain stalls no GPU read, and
the events wait in NVML until it returns.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

from faultcast.catalogue import TRACKED_XIDS
from faultcast.collector.lanes import Deadline, Lane
from faultcast.collector.nvml.lib import Notes, Nvml, NvmlCodes, logger
from faultcast.collector.nvml.metrics import IDX
from faultcast.collector.nvml.stats import CallStat, stat_in

# A storm of events must not turn one scrape into an endless loop; the rest waits for the next.
_MAX_EVENTS_PER_SCRAPE = 10_000

_XID_SLOT = {code: i for i, code in enumerate(TRACKED_XIDS)}
_XID_OTHER_SLOT = len(TRACKED_XIDS)
# Counter positions in slot order: the tracked codes, then "other".
_XID_VALUE_IDX = (*(IDX[f"xid_{code}_events"] for code in TRACKED_XIDS), IDX["xid_other_events"])
_I_XID_LAST = IDX["xid_last"]


class XidEvent(Protocol):
    """What nvmlEventSetWait returns (pynvml's c_nvmlEventData_t), as far as the drain reads it."""

    device: object
    eventType: int  # noqa: N815  (pynvml's field name)
    eventData: int  # noqa: N815  (pynvml's field name)


def handle_key(handle: object) -> object:
    """A hashable identity for a device handle.

    pynvml hands out a fresh ctypes pointer object per call (an event's `device` is not the
    object nvmlDeviceGetHandleByIndex returned), so real handles are compared by address.
    """
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]  # any ctypes pointer
    except (ctypes.ArgumentError, TypeError):
        return handle  # a test double's opaque handle object


class XidTally:
    """One GPU's Xid counters since the source opened: per tracked code, "other", and the last code."""

    __slots__ = ("counts", "last", "registered")

    def __init__(self) -> None:
        self.counts = [0] * (len(TRACKED_XIDS) + 1)
        self.last = 0
        self.registered = False  # whether the GPU registered for Xid events (else its Xids are NaN)

    def count(self, code: int) -> None:
        """Count one Xid of this code."""
        self.counts[_XID_SLOT.get(code, _XID_OTHER_SLOT)] += 1
        self.last = code

    def fill(self, values: list[float]) -> None:
        """Write the counters and the last code; leave NaN where the GPU could not register."""
        if self.registered:
            for idx, count in zip(_XID_VALUE_IDX, self.counts, strict=True):
                values[idx] = float(count)
            values[_I_XID_LAST] = float(self.last)


class XidEvents:
    """The event set Xids arrive on: made by `open`, drained by `drain` each scrape, freed by `close`.

    Each GPU is added with `register`; an Xid from a device never registered is logged and dropped.
    Failures while opening or registering become notes and leave that GPU's Xids NaN; the source
    works on without them.
    """

    def __init__(self, lib: Nvml, codes: NvmlCodes, deadline: Deadline, notes: Notes) -> None:
        self._lib = lib
        self._codes = codes
        self._deadline = deadline
        self._notes = notes
        self.lane = Lane("events", thread_name="faultcast-nvml-events")
        self.stats: dict[str, CallStat] = {}  # nvmlEventSetWait's latency and timeouts
        self._event_set: object = None  # pynvml's c_nvmlEventSet_t, once made
        self._tallies: dict[object, XidTally] = {}

    def open(self) -> None:
        """Make the event set; without one (a note says why) no Xid is counted."""
        try:
            self._event_set = self._lib.nvmlEventSetCreate()
        except self._codes.error as err:
            self._notes.add("no NVML event set, Xid events will not be counted: %s", err)

    def register(self, index: int, handle: object, tally: XidTally) -> None:
        """Count the Xids of the GPU behind `handle` on `tally` (`tally.registered` says if it can)."""
        self._tallies[handle_key(handle)] = tally
        if self._event_set is None:
            return
        lib, xid_event = self._lib, self._codes.xid_event
        try:
            supported = int(lib.nvmlDeviceGetSupportedEventTypes(handle))
            if not supported & xid_event:
                self._notes.add("GPU %s does not report Xid events", index)
                return
            lib.nvmlDeviceRegisterEvents(handle, xid_event, self._event_set)
        except self._codes.error as err:
            self._notes.add("GPU %s: Xid event registration failed, Xids not counted: %s", index, err)
            return
        tally.registered = True

    def drain(self) -> None:
        """Count every queued event on its lane, bounded like any call; the GPUs are read after it."""
        if self._event_set is None:
            return
        lane = self.lane
        if lane.abandoned:
            if lane.busy.locked():
                return  # still hung: Xid events stay queued in NVML until it returns
            logger.info("nvmlEventSetWait returned after %.3g s; draining events again", lane.returned_after)
        self._deadline.start(lane, self._drain_events)
        if not self._deadline.wait(lane):
            lane.abandoned = True
            lane.stuck_call = "nvmlEventSetWait"
            stat_in(self.stats, "nvmlEventSetWait").timeouts += 1
            logger.warning(
                "nvmlEventSetWait did not return within %s s: Xid events are not counted until it does",
                self._deadline.timeout,
            )

    def _drain_events(self) -> None:
        """Take every queued event without waiting; Xids count on the GPU that raised them."""
        lane, clock = self.lane, self._deadline.clock
        wait, event_set = self._lib.nvmlEventSetWait, self._event_set
        stat = stat_in(self.stats, "nvmlEventSetWait")
        for _ in range(_MAX_EVENTS_PER_SCRAPE):
            start = lane.started = clock()
            try:
                event = wait(event_set, 0)
            except self._codes.error as err:
                lane.returned_after = clock() - start
                stat.add(lane.returned_after)
                if getattr(err, "value", None) != self._codes.timeout:  # NVML's timeout = queue empty
                    logger.warning("nvmlEventSetWait failed, events wait for the next scrape: %s", err)
                return
            lane.returned_after = clock() - start
            stat.add(lane.returned_after)
            self._count(event)
            if lane.abandoned:  # the scrape went on without this drain; the event above still counts
                return

    def _count(self, event: XidEvent) -> None:
        if not int(event.eventType) & self._codes.xid_event:
            return
        tally = self._tallies.get(handle_key(event.device))
        if tally is None:
            logger.warning("Xid %s from a device this source did not open", event.eventData)
            return
        tally.count(int(event.eventData))

    def close(self) -> None:
        """Free the event set (NVML itself is shut down by the caller)."""
        if self._event_set is None:
            return
        try:
            self._lib.nvmlEventSetFree(self._event_set)
        except self._codes.error as err:
            logger.debug("nvmlEventSetFree failed: %s", err)
        self._event_set = None
