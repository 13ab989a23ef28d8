"""GPU discovery and identity: one GpuState per NVML index, and the opening that fills it in.

Opening a GPU reads its identity (handle, UUID, model name, PCI bus id), finds its NVLink links,
registers it for Xid events and makes its call plan. A GPU that fails to open (lost, no
permission) keeps `handle` None: it is reported lost and opened again on a later scrape, while
the other GPUs carry on.
"""

from __future__ import annotations

from faultcast.collector.lanes import Lane
from faultcast.collector.nvml.lib import Notes, Nvml, NvmlCodes, as_text, logger
from faultcast.collector.nvml.plan import NO_PLAN, Plan, Planner
from faultcast.collector.nvml.stats import CallStat
from faultcast.collector.nvml.xid import XidEvents, XidTally


class GpuState:
    """Everything the source keeps about one GPU between scrapes: identity, plan, lane and counters.

    Written by the GPU's lane worker: `failed_calls` and `warned`. By the scrape thread:
    `timed_out` and `skipped`. One writer each, so no update is lost while an abandoned worker
    is still running.
    """

    __slots__ = (
        "driver_version",
        "failed_calls",
        "handle",
        "index",
        "lane",
        "links",
        "name",
        "pci_bus_id",
        "plan",
        "skipped",
        "stats",
        "timed_out",
        "uuid",
        "warned",
        "xids",
    )

    def __init__(self, index: int, *, driver_version: str = "") -> None:
        self.index = index
        self.handle: object = None  # pynvml's c_nvmlDevice_t once opened; None until then
        self.uuid = ""
        self.name = ""
        self.pci_bus_id = ""  # labels only: empty when NVML cannot tell
        self.driver_version = driver_version
        self.links: tuple[int, ...] = ()
        self.plan: Plan = NO_PLAN
        self.lane = Lane(f"gpu{index}", thread_name=f"faultcast-nvml-gpu{index}")
        # Per GPU, so that lanes running side by side never update one accumulator.
        self.stats: dict[str, CallStat] = {}
        self.failed_calls = 0
        self.timed_out = 0
        self.skipped = 0
        self.warned: set[tuple[str, int]] = set()  # (function, error code) already logged as a warning
        self.xids = XidTally()


class Discovery:
    """Opens GPUs: identity, NVLink links, Xid registration (through `xids`), and the call plan."""

    def __init__(
        self, lib: Nvml, codes: NvmlCodes, *, planner: Planner, xids: XidEvents, notes: Notes
    ) -> None:
        self._lib = lib
        self._codes = codes
        self._planner = planner
        self._xids = xids
        self._notes = notes

    def driver_version(self) -> str:
        """The driver version, a label on every GPU series (dcgm-exporter's DCGM_FI_DRIVER_VERSION).

        Empty, with a note, when NVML cannot tell.
        """
        try:
            return as_text(self._lib.nvmlSystemGetDriverVersion())
        except self._codes.error as err:
            self._notes.add("no driver version from NVML, the label is left out: %s", err)
            return ""

    def open(self, gpu: GpuState, *, quiet: bool = False) -> None:
        """Fill in `gpu`; on failure leave its handle None, with a note (a debug line if `quiet`)."""
        lib = self._lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(gpu.index)
            gpu.uuid = as_text(lib.nvmlDeviceGetUUID(handle))
            gpu.name = as_text(lib.nvmlDeviceGetName(handle))
            gpu.links = self._discover_links(handle)
            gpu.pci_bus_id = self._read_pci_bus_id(gpu, handle)
            plan = self._planner.plan(handle, gpu.links, gpu.stats, gpu.index)
        except self._codes.error as err:
            if quiet:
                logger.debug("GPU %s still does not open: %s", gpu.index, err)
            else:
                self._notes.add("GPU %s did not open, reported lost until it does: %s", gpu.index, err)
            return
        self._xids.register(gpu.index, handle, gpu.xids)
        gpu.plan.close()  # a GPU opened again: the old plan's GPM samples go
        gpu.plan = plan
        gpu.handle = handle

    def reopen(self, gpu: GpuState) -> bool:
        """Try once more to open a GPU that did not open; a failed try counts as one failed call."""
        self.open(gpu, quiet=True)
        if gpu.handle is None:
            gpu.failed_calls += 1  # one failed open attempt per scrape
            return False
        logger.warning("GPU %s opened on a later scrape (%s)", gpu.index, gpu.uuid)
        return True

    def _read_pci_bus_id(self, gpu: GpuState, handle: object) -> str:
        """The GPU's PCI bus id (dcgm-exporter's pci_bus_id label); a label, so a failure costs nothing else."""
        try:
            return as_text(self._lib.nvmlDeviceGetPciInfo(handle).busId)
        except self._codes.error as err:
            logger.debug("GPU %s: no PCI bus id: %s", gpu.index, err)
            return ""

    def _discover_links(self, handle: object) -> tuple[int, ...]:
        """The NVLink links the GPU has: every link whose state reads, or fails for a reason other than absence."""
        lib = self._lib
        absent = (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_INVALID_ARGUMENT)
        links = []
        for link in range(lib.NVML_NVLINK_MAX_LINKS):
            try:
                lib.nvmlDeviceGetNvLinkState(handle, link)
            except self._codes.error as err:
                if err.value in absent:
                    continue
                if err.value == self._codes.gpu_is_lost:
                    raise
            links.append(link)  # up, down or unreadable now: it exists, so it is read every scrape
        return tuple(links)
