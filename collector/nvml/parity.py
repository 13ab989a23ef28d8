"""The dcgm-exporter default fields read for parity only (faultcast.dcgm.PARITY): how NVML is asked.

They are not catalogue metrics: the model never reads them and they are not shipped. Each GPU's
plan runs them after every catalogue call, so a parity call that hangs costs no catalogue value,
and the scrape leaves them out of the collector's own health fields (call time, NOT_SUPPORTED and
failed-call counts, which the model reads): a driver that lacks them changes nothing the model
sees. Where NVML gives nothing (NOT_SUPPORTED, no NVLink, no GPM) the value is NaN and the series
is absent, never zero.

- `Codecs`: encoder and decoder utilisation (percent), as DCGM_FI_DEV_ENC_UTIL / DEC_UTIL, and the
  reserved framebuffer (MiB), DCGM_FI_DEV_FB_RESERVED, from nvmlDeviceGetMemoryInfo_v2.
- `NvLinkThroughput`: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as DCGM computes it (field 449): the NVLink
  data counters of every link, both directions (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX + _RX, KiB,
  scope UINT_MAX), their increase since the previous scrape per second, divided by 1000. Absent on
  the first scrape, after a counter went backwards (a driver reload) and on a GPU without NVLink.
- `Gpm`: the DCP fields through GPM (Hopper and newer), as DCGM reads them there: one GPM sample when
  the GPU opens and one per scrape, nvmlGpmMetricsGet between each and the one before; utilisations are percent in NVML,
  ratios in DCGM (/ 100); PCIe traffic is MiB/s in NVML, bytes/s in DCGM (x 2**20). A GPU whose
  nvmlGpmQueryDeviceSupport says no (or a binding or driver without GPM) gets no GPM calls at all.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from faultcast.collector.nvml.lib import Nvml, NvmlCodes, logger
from faultcast.collector.nvml.metrics import (
    PARITY_IDX,
    BoundCall,
    Call,
    PlannedCall,
    Raw,
)

NAN = float("nan")
_ALL_LINKS = 0xFFFFFFFF  # NVML's scope id for "every NVLink of the GPU" (what DCGM passes)
_MIB = float(2**20)
# Field-value union member per NVML_VALUE_TYPE_* (0..6), as pynvml's c_nvmlValue_t names them.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class Codecs:
    """Encoder and decoder utilisation (percent; NVML answers [utilisation, sampling period in us]),
    and the framebuffer the driver reserves (MiB, whole as DCGM gives it; nvmlMemory_v2 only)."""

    _ENC, _DEC = PARITY_IDX["enc_util"], PARITY_IDX["dec_util"]
    _RESERVED = PARITY_IDX["fb_reserved"]

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """The encoder, the decoder, then the memory information, version 2."""
        return (
            Call("nvmlDeviceGetEncoderUtilization"),
            Call("nvmlDeviceGetDecoderUtilization"),
            Call("nvmlDeviceGetMemoryInfo", (lib.nvmlMemory_v2,)),
        )

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """The utilisation of each answer; the reserved bytes in whole MiB."""
        for offset, idx in ((0, self._ENC), (1, self._DEC)):
            answer = raw[at + offset]
            if answer is not None:
                values[idx] = float(answer[0])
        memory = raw[at + 2]
        if memory is not None:
            values[self._RESERVED] = float(int(memory.reserved) // 2**20)

    def close(self) -> None:
        """Nothing held in NVML."""


def _field_number(field: Any) -> float:
    return float(getattr(field.value, _VALUE_MEMBERS[field.valueType]))


class NvLinkThroughput:
    """One GPU's NVLink data throughput, both directions, all links, as DCGM's field 449.

    Keeps the previous scrape's counter sum and time: one instance per GPU plan.
    """

    _IDX = PARITY_IDX["nvlink_bandwidth_total"]

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self._previous: tuple[float, float] | None = None  # (KiB, seconds) of the last counters read

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """Both data counters in one nvmlDeviceGetFieldValues call."""
        return (BoundCall("nvmlDeviceGetFieldValues", self._reader),)

    def _reader(self, lib: Nvml, codes: NvmlCodes, handle: object) -> Callable[[], object]:
        get, success, error = lib.nvmlDeviceGetFieldValues, codes.success, codes.error
        ids = [
            (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ]

        def read() -> tuple[float, float]:
            """(KiB through every link both ways, when NVML read them in seconds since 1970)."""
            tx, rx = get(handle, ids)
            for field in (tx, rx):
                if field.nvmlReturn != success:
                    raise error(field.nvmlReturn)
            stamp = max(int(tx.timestamp), int(rx.timestamp))  # microseconds; 0 when NVML gives none
            return _field_number(tx) + _field_number(rx), stamp / 1e6 if stamp else self._wall_clock()

        return read

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """The increase per second since the previous read, / 1000 and truncated as DCGM does."""
        answer = raw[at]
        if answer is None:
            return  # the previous read stays the baseline
        kib, seconds = answer
        previous, self._previous = self._previous, (kib, seconds)
        if previous is None or kib < previous[0] or seconds <= previous[1]:
            return  # nothing to difference against yet, or the counters were reset
        values[self._IDX] = float(int((kib - previous[0]) / (seconds - previous[1]) / 1000.0))

    def close(self) -> None:
        """Nothing held in NVML."""


# (GPM metric id name, parity position, scale from NVML's unit to DCGM's), in request order.
_GPM_METRICS: tuple[tuple[str, int, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", PARITY_IDX["prof_gr_engine_active"], 0.01),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", PARITY_IDX["prof_pipe_tensor_active"], 0.01),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", PARITY_IDX["prof_dram_active"], 0.01),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", PARITY_IDX["prof_pcie_tx_bytes"], _MIB),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", PARITY_IDX["prof_pcie_rx_bytes"], _MIB),
)


def gpm_supported(lib: Nvml, codes: NvmlCodes, handle: object, index: int) -> bool:
    """Whether the GPU offers GPM metrics: the binding has the calls and nvmlGpmQueryDeviceSupport says yes.

    A lost GPU raises (its opening fails and is tried again later); any other error means no GPM.
    """
    query = getattr(lib, "nvmlGpmQueryDeviceSupport", None)
    if query is None:
        logger.debug("GPU %s: this NVML binding has no GPM calls: no DCGM_FI_PROF_* fields", index)
        return False
    try:
        supported = bool(query(handle).isSupportedDevice)
    except codes.error as err:
        if err.value == codes.gpu_is_lost:
            raise
        logger.debug("GPU %s: nvmlGpmQueryDeviceSupport failed (%s): no DCGM_FI_PROF_* fields", index, err)
        return False
    if not supported:
        logger.debug("GPU %s does not support GPM: no DCGM_FI_PROF_* fields", index)
    return supported


class Gpm:
    """The DCP fields through GPM, for one GPU that supports it: two samples, taken in turn.

    The first sample is taken when the GPU opens; each scrape takes one into `current`, reads the
    metrics between it and the one before, and the two swap. A scrape whose sample failed reads no
    metrics (and the older sample stays the baseline).
    """

    def __init__(self, lib: Nvml, handle: object) -> None:
        """Allocate both samples and take the first; raises the binding's error (nothing left allocated)."""
        self._lib = lib
        self._closed = False
        self._current: object = lib.nvmlGpmSampleAlloc()
        try:
            self._previous: object = lib.nvmlGpmSampleAlloc()
        except BaseException:
            lib.nvmlGpmSampleFree(self._current)
            raise
        try:
            lib.nvmlGpmSampleGet(handle, self._previous)
        except BaseException:
            self.close()
            raise
        self._fresh = False  # the current sample was taken this scrape

    def calls(self, lib: Nvml) -> tuple[PlannedCall, ...]:
        """This scrape's sample, then the metrics since the last one."""
        return (BoundCall("nvmlGpmSampleGet", self._sampler), BoundCall("nvmlGpmMetricsGet", self._metrics))

    def _sampler(self, lib: Nvml, codes: NvmlCodes, handle: object) -> Callable[[], object]:
        sample_get = lib.nvmlGpmSampleGet

        def take() -> None:
            self._fresh = False
            sample_get(handle, self._current)
            self._fresh = True

        return take

    def _metrics(self, lib: Nvml, codes: NvmlCodes, handle: object) -> Callable[[], object]:
        metrics_get, success = lib.nvmlGpmMetricsGet, codes.success
        ids = [int(getattr(lib, name)) for name, _, _ in _GPM_METRICS]
        version = lib.NVML_GPM_METRICS_GET_VERSION

        def read() -> tuple[float, ...] | None:
            if not self._fresh:
                return None  # no sample this scrape: nothing to difference (NaN)
            try:
                request = lib.c_nvmlGpmMetricsGet_t()
                request.version = version
                request.numMetrics = len(ids)
                request.sample1, request.sample2 = self._previous, self._current
                for slot, metric_id in zip(request.metrics, ids, strict=False):
                    slot.metricId = metric_id
                answer = metrics_get(request)
                return tuple(
                    float(slot.value) if slot.nvmlReturn == success else NAN
                    for slot, _ in zip(answer.metrics, ids, strict=False)
                )
            finally:
                # The sample just taken is the next scrape's baseline, whatever the metrics call did.
                self._previous, self._current = self._current, self._previous
                self._fresh = False

        return read

    def decode(self, raw: Raw, at: int, values: list[float]) -> None:
        """Each metric NVML answered, in DCGM's unit."""
        answer = raw[at + 1]
        if answer is None:
            return
        for value, (_, idx, scale) in zip(answer, _GPM_METRICS, strict=True):
            if not math.isnan(value):  # a metric NVML refused stays missing
                values[idx] = value * scale

    def close(self) -> None:
        """Free both samples (errors ignored: the GPU may be gone)."""
        if self._closed:
            return
        self._closed = True
        for sample in (self._current, self._previous):
            try:
                self._lib.nvmlGpmSampleFree(sample)
            except Exception as err:
                logger.debug("nvmlGpmSampleFree failed: %s", err)
