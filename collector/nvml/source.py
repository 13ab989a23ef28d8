"""The NVML source: one GPU reading per device, every GPU metric of the catalogue.

The NVML module is injected (`NvmlSource(FakeNvml())` in tests, `pynvml` by default), so the
whole source runs without a GPU. A scrape never raises for one bad call or one bad GPU:
NOT_SUPPORTED becomes NaN, other errors become NaN plus a failed-call count, and
NVML_ERROR_GPU_IS_LOST marks that GPU lost for the scrape. A lost GPU is tried again on every
later scrape (its first call fails fast), so a GPU that comes back is seen.

A call that hangs (a wedged driver, a GPU falling off the bus) must not stall the scrape, and a C
call cannot be interrupted. So each GPU is read on its own worker lane, the event drain on
another, and the scrape waits for each lane only until the call in flight has run `timeout`
seconds (faultcast.collector.lanes). Then it stops waiting: the values read so far are kept, the
hung call and the rest of that GPU's plan are missing (NaN), the timeout is counted, one warning
is logged, and the GPU is skipped on later scrapes until the hung call returns.

`NvmlSource` only composes the parts, each in a module of its own:

- `nvml_lib`: loading the binding, its error codes, `nvml_available`, `NvmlUnavailable`;
- `nvml_device`: discovery and identity of each GPU (`GpuState`, `Discovery`);
- `nvml_metrics`: the metric groups (temperature and power, clocks, utilisation, fan, throttling,
  ECC and remapping, PCIe, NVLink): their calls and how the answers decode;
- `nvml_parity`: the dcgm-exporter default fields read for parity only, not catalogue metrics
  (encoder and decoder utilisation, NVLink throughput, the DCP fields through GPM);
- `nvml_plan`: one GPU's calls bound to its handle once, as the flat step list a scrape walks;
- `nvml_xid`: the Xid event set and its per-scrape drain;
- `nvml_scrape`: running the plans on the lanes and classifying each call's outcome;
- `nvml_readings`: assembling each GPU's reading;
- `nvml_stats`: per-function call latency (`CallStats`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from faultcast.collector.lanes import Deadline, Lane, stop_lanes
from faultcast.collector.nvml.device import Discovery, GpuState
from faultcast.collector.nvml.lib import (
    Notes,
    Nvml,
    NvmlCodes,
    NvmlUnavailable,
    explain,
    load,
    logger,
    nvml_available,
)
from faultcast.collector.nvml.plan import Planner
from faultcast.collector.nvml.scrape import GpuScraper
from faultcast.collector.nvml.stats import CallStats, merge
from faultcast.collector.nvml.xid import XidEvents
from faultcast.readings import Reading

__all__ = ["DEFAULT_TIMEOUT_S", "NvmlSource", "NvmlUnavailable", "nvml_available"]

# NVML answers in micro- to milliseconds; a call still out after this long is treated as hung.
DEFAULT_TIMEOUT_S = 2.0


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
        nvml: Nvml | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        deadline = Deadline(timeout, clock)  # raises ValueError for a bad timeout, before NVML loads
        lib = load(nvml)
        codes = NvmlCodes.of(lib)
        self._nvml = lib
        self._notes = Notes()
        self._xids = XidEvents(lib, codes, deadline, self._notes)
        self._discovery = Discovery(
            lib, codes, planner=Planner(lib, codes), xids=self._xids, notes=self._notes
        )
        self._scraper = GpuScraper(codes, deadline, self._discovery)
        self._gpus: tuple[GpuState, ...] = ()
        self._lanes: list[Lane] = [self._xids.lane]
        # An unclosed source that is garbage collected still ends its idle worker threads.
        self._stop_workers = weakref.finalize(self, stop_lanes, self._lanes)
        self._closed = False
        self._start()

    def _start(self) -> None:
        """Start NVML and open every GPU; on failure shut NVML down again and raise NvmlUnavailable."""
        lib = self._nvml
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            raise NvmlUnavailable(f"cannot use NVML: {explain(lib, err)}") from err
        try:
            count = int(lib.nvmlDeviceGetCount())
            if count == 0:
                raise NvmlUnavailable("cannot use NVML: NVML started but found no GPU")
            self._xids.open()
            driver_version = self._discovery.driver_version()
            self._gpus = tuple(GpuState(i, driver_version=driver_version) for i in range(count))
            self._lanes.extend(gpu.lane for gpu in self._gpus)
            for gpu in self._gpus:
                self._discovery.open(gpu)
        except BaseException as err:
            self._shutdown()
            if isinstance(err, lib.NVMLError):
                raise NvmlUnavailable(f"cannot use NVML: GPU discovery failed: {err}") from err
            raise

    @property
    def notes(self) -> tuple[str, ...]:
        """What went wrong while opening (a GPU without Xid events, a GPU that did not open)."""
        return self._notes.texts

    @property
    def call_stats(self) -> dict[str, CallStats]:
        """Latency (and timeouts) per NVML function over every scrape so far, by function name."""
        return merge((self._xids.stats, *(gpu.stats for gpu in self._gpus)))

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
        """One reading per GPU (see the module docstring for what a failure leaves); raises after close."""
        if self._closed:
            raise RuntimeError("NvmlSource.read() after close()")
        self._xids.drain()
        return Reading(gpus=self._scraper.read_all(self._gpus))

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

    def _shutdown(self) -> None:
        self._xids.close()
        for gpu in self._gpus:
            gpu.plan.close()  # GPM samples, before NVML goes
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", err)
