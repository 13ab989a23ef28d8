"""The GPUs' part of a scrape: each GPU's plan run on its lane, under the call deadline.

Every GPU is handed to its lane first, so the GPUs are read side by side, then each is waited
for only until its call in flight overruns the deadline. Each call's outcome is classified:
NOT_SUPPORTED (or a function an older driver lacks) becomes NaN and is counted as unsupported;
NVML_ERROR_GPU_IS_LOST ends the GPU's scrape and marks it lost; any other error becomes NaN, a
failed-call count and one warning per (function, code). A GPU whose call overran is abandoned
(what it read before the hang stands) and skipped on later scrapes until the call returns.

The plan's parity steps (after its `counted` catalogue steps) read dcgm-exporter fields that are no
model input: their time and their NOT_SUPPORTED or other errors stay out of the GPU's health fields
(nvml_call_seconds, nvml_slowest_call_seconds, nvml_unsupported_fields, nvml_failed_calls), which
the model reads; an error is logged once all the same. A lost GPU is lost, and a hang is a hang,
whichever call meets it.
"""

from __future__ import annotations

import functools

from faultcast.collector.lanes import Deadline, Lane
from faultcast.collector.nvml.device import Discovery, GpuState
from faultcast.collector.nvml.lib import NvmlCodes, logger
from faultcast.collector.nvml.readings import blank_reading, gpu_reading
from faultcast.readings import GpuReading

NAN = float("nan")


class GpuScraper:
    """Reads every GPU once per `read_all`; never raises for one bad call or one bad GPU."""

    def __init__(self, codes: NvmlCodes, deadline: Deadline, discovery: Discovery) -> None:
        self._codes = codes
        self._deadline = deadline
        self._discovery = discovery

    def read_all(self, gpus: tuple[GpuState, ...]) -> tuple[GpuReading, ...]:
        """One reading per GPU, in index order."""
        readings: list[GpuReading | None] = [None] * len(gpus)
        running: list[GpuState] = []
        # Hand every GPU to its lane first, so the GPUs are read side by side...
        for gpu in gpus:
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
            self._deadline.start(lane, functools.partial(self._job, gpu, lane))
            running.append(gpu)
        # ...then collect them, each only until its call in flight overruns. Last lane first: it
        # usually finishes last, so this thread wakes once instead of once per GPU (each lane's
        # deadline is its own, so the order changes no outcome).
        for gpu in reversed(running):
            lane = gpu.lane
            result = lane.result if self._deadline.wait(lane) else self._abandon(gpu, lane)
            readings[gpu.index] = result if isinstance(result, GpuReading) else blank_reading(gpu)
        return tuple(r for r in readings if r is not None)

    def _job(self, gpu: GpuState, lane: Lane) -> GpuReading | None:
        """One GPU's part of a scrape, run on its lane; None once the scrape stopped waiting."""
        try:
            if gpu.handle is None and not self._discovery.reopen(gpu):
                return gpu_reading(gpu, None, call_seconds=0.0, slowest=0.0, unsupported=0.0, lost=True)
            return self._read(gpu, lane)
        except Exception:  # a binding surprise on one GPU must not sink the scrape
            logger.exception("reading GPU %s failed unexpectedly", gpu.index)
            gpu.failed_calls += 1
            return blank_reading(gpu)

    def _read(self, gpu: GpuState, lane: Lane) -> GpuReading | None:
        """The hot loop: every step of the plan, timed, each outcome classified."""
        clock, error = self._deadline.clock, self._codes.error
        unsupported_codes, gpu_is_lost = self._codes.unsupported, self._codes.gpu_is_lost
        raw: list[object] = []
        lane.partial = raw  # what the scrape keeps if it stops waiting
        append = raw.append
        spent = slowest = 0.0
        unsupported = 0
        counted = gpu.plan.counted
        health: tuple[float, float, int, int] | None = None  # the counts when the parity steps began
        for step, (fn, args, stat) in enumerate(gpu.plan.steps):
            if step == counted:
                # The parity steps: nothing below is counted in the GPU's health fields.
                health = (spent, slowest, unsupported, gpu.failed_calls)
            failure = None
            start = lane.started = clock()
            try:
                value = fn(*args)
            except error as err:
                value, failure = None, err
            seconds = clock() - start
            # CallStat.add, inlined: this runs ~900 times per scrape.
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
                if failure.value in unsupported_codes:
                    unsupported += 1
                else:
                    gpu.failed_calls += 1
                    if failure.value == gpu_is_lost:
                        # Nothing more will answer this scrape; later scrapes try again.
                        return gpu_reading(
                            gpu,
                            None,
                            call_seconds=spent,
                            slowest=slowest,
                            unsupported=float(unsupported),
                            lost=True,
                        )
                    self._warn_once(gpu, stat.name, failure)
            append(value)
        if health is not None:
            spent, slowest, unsupported, gpu.failed_calls = health
        values = gpu.plan.decode(raw)
        return gpu_reading(gpu, values, call_seconds=spent, slowest=slowest, unsupported=float(unsupported))

    def _abandon(self, gpu: GpuState, lane: Lane) -> GpuReading:
        """Stop waiting for a GPU whose call overran: keep what it read, count it, warn once."""
        lane.abandoned = True  # first, so the worker calls nothing more on this GPU
        now = self._deadline.clock()
        partial = lane.partial
        answered = None if partial is None else partial[:]  # one C-level copy while the worker may append
        steps = gpu.plan.steps
        if answered is None:  # a GPU being opened again, or a worker that never got to run
            lane.stuck_call = "opening the GPU" if gpu.handle is None else "the start of its scrape"
        elif len(answered) < len(steps):
            stat = steps[len(answered)][2]
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
            self._deadline.timeout,
        )
        # Values read before the hang stand; the hung call and the rest are missing.
        values = gpu.plan.decode(answered + [None] * (len(steps) - len(answered))) if answered else None
        return gpu_reading(
            gpu,
            values,
            call_seconds=now - lane.submitted,
            slowest=now - lane.started,
            unsupported=NAN,  # not known for the calls that were not made
        )

    def _skipped_reading(self, gpu: GpuState, lane: Lane) -> GpuReading:
        """A GPU whose hung call has not returned: nothing is called, the skip counts as a failure.

        The slowest call is the hung one, still in flight: its age so far.
        """
        gpu.skipped += 1
        logger.debug("GPU %s: %s still hung, GPU skipped", gpu.index, lane.stuck_call)
        slowest = self._deadline.clock() - lane.started
        return gpu_reading(gpu, None, call_seconds=0.0, slowest=slowest, unsupported=NAN)

    @staticmethod
    def _warn_once(gpu: GpuState, name: str, err: object) -> None:
        key = (name, getattr(err, "value", -1))
        if key in gpu.warned:
            logger.debug("GPU %s: %s failed: %s", gpu.index, name, err)
        else:
            gpu.warned.add(key)
            logger.warning("GPU %s: %s failed (reported as NaN, logged once): %s", gpu.index, name, err)
