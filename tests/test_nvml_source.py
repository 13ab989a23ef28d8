"""NvmlSource over the shipped FakeNvml: every metric, unit conversions, and every failure path."""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

import pynvml
import pytest

from faultcast.catalogue import TRACKED_XIDS, Scope, metrics_for
from faultcast.collector.nvml.source import NvmlSource, NvmlUnavailable, nvml_available
from faultcast.collector.nvml.xid import handle_key
from faultcast.collector.source import Source
from faultcast.readings import GpuReading, Reading
from faultcast.testing.fake_nvml import FakeHang, FakeNvml

LINKS = 18
GPU_NAMES = [m.name for m in metrics_for(Scope.GPU)]
SELF_HEALTH = {
    "nvml_call_seconds",
    "nvml_slowest_call_seconds",
    "nvml_failed_calls",
    "nvml_timed_out_calls",
    "nvml_unsupported_fields",
}
# Short enough for a quick test, long enough that a healthy call on a busy machine never hits it.
TIMEOUT_S = 0.5
# Only a bound on a read that must not wait for a hung call; nothing waits this long when it works.
GENEROUS_S = 60.0
XID_METRICS = {m.name for m in metrics_for(Scope.GPU) if m.name.startswith("xid_")}
NVLINK_COUNTER_METRICS = {
    m.name for m in metrics_for(Scope.GPU) if m.name.startswith("nvlink_") and m.name != "nvlink_links_active"
}
REMAPPED_METRICS = {
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_pending",
    "row_remap_failure",
}
UNTRACKED_XID = next(code for code in range(1, 1000) if code not in TRACKED_XIDS)


class TickClock:
    """Advances a fixed step on every reading, so each NVML call appears to take exactly `step`.

    One count per thread: the source reads each GPU on its own worker thread.
    """

    def __init__(self, step: float) -> None:
        self.step = step
        self._local = threading.local()

    def __call__(self) -> float:
        now: float = getattr(self._local, "now", 0.0) + self.step
        self._local.now = now
        return now


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(gpus=8, nvlink_links=LINKS)


@pytest.fixture
def source(fake: FakeNvml) -> NvmlSource:
    return NvmlSource(fake)


@pytest.fixture
def hang(fake: FakeNvml) -> Iterator[Callable[..., FakeHang]]:
    """fake.hang, with every hang released at the end so no worker thread outlives the test."""
    made: list[FakeHang] = []

    def make(gpu: int | None, function: str, *args: object) -> FakeHang:
        made.append(fake.hang(gpu, function, *args))
        return made[-1]

    yield make
    for hung in made:
        hung.release()


def nan_names(gpu: GpuReading) -> set[str]:
    return {name for name in GPU_NAMES if math.isnan(gpu.get(name))}


T = TypeVar("T")


def within(fn: Callable[[], T], seconds: float = GENEROUS_S) -> T:
    """fn() on a helper thread: a call that waits for a hung NVML call fails here instead of hanging."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as err:  # handed to the test thread below
            error.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if error:
        raise error[0]
    assert result, f"did not return within {seconds} s: it waited for the hung call"
    return result[0]


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage())


def test_is_a_source(source: NvmlSource) -> None:
    assert isinstance(source, NvmlSource)
    typed: Source = source  # mypy checks the protocol
    assert typed.name == "nvml"
    reading = source.read()
    assert isinstance(reading, Reading)
    assert reading.devices == ()
    assert reading.host is None
    assert [g.index for g in reading.gpus] == list(range(8))


def test_every_gpu_metric_is_read_and_identity_reported(fake: FakeNvml, source: NvmlSource) -> None:
    reading = source.read()
    assert len(reading.gpus) == 8
    for gpu in reading.gpus:
        assert nan_names(gpu) == set(), f"GPU {gpu.index} left metrics unread"
        assert not gpu.lost
        assert gpu.get("gpu_lost") == 0.0
        assert gpu.model_name == "NVIDIA H100 80GB HBM3"
        assert gpu.uuid == pynvml_uuid(fake, gpu.index)
    assert len({g.uuid for g in reading.gpus}) == 8


def test_each_gpu_reports_its_pci_bus_id_and_the_driver_version(fake: FakeNvml) -> None:
    fake.driver_version = "570.133.20"
    fake.set_value(
        3,
        "nvmlDeviceGetPciInfo",
        pynvml.nvmlPciInfo_t(busIdLegacy=b"0000:9A:00.0", busId=b"00000000:9A:00.0"),
    )
    reading = NvmlSource(fake).read()
    assert reading.gpus[3].pci_bus_id == "00000000:9A:00.0"  # the binding's bytes, decoded
    assert len({g.pci_bus_id for g in reading.gpus}) == 8
    assert {g.driver_version for g in reading.gpus} == {"570.133.20"}


def test_identity_labels_nvml_cannot_give_are_empty_and_cost_nothing_else(fake: FakeNvml) -> None:
    fake.set_error(2, "nvmlDeviceGetPciInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.set_error(None, "nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_UNKNOWN)
    source = NvmlSource(fake)
    reading = source.read()
    assert reading.gpus[2].pci_bus_id == ""
    assert all(g.pci_bus_id for g in reading.gpus if g.index != 2)
    assert {g.driver_version for g in reading.gpus} == {""}
    assert any("driver version" in note for note in source.notes)
    # Labels only: every metric of the GPU is still read, and no call is counted as failed.
    assert nan_names(reading.gpus[2]) == set()
    assert {g.get("nvml_failed_calls") for g in reading.gpus} == {0.0}


def pynvml_uuid(fake: FakeNvml, gpu: int) -> str:
    fake.nvmlInit()
    try:
        return str(fake.nvmlDeviceGetUUID(fake.handle(gpu)))
    finally:
        fake.nvmlShutdown()


def test_values_are_converted_from_nvml_units(fake: FakeNvml) -> None:
    n = pynvml
    g = 2
    fake.set_value(g, "nvmlDeviceGetTemperature", 71, n.NVML_TEMPERATURE_GPU)
    fake.set_value(g, "nvmlDeviceGetFieldValues", 88, n.NVML_FI_DEV_MEMORY_TEMP)
    fake.set_value(g, "nvmlDeviceGetPowerUsage", 412_345)  # mW
    fake.set_value(g, "nvmlDeviceGetEnforcedPowerLimit", 650_000)
    fake.set_value(g, "nvmlDeviceGetTotalEnergyConsumption", 123_456_789)  # mJ, kept as is
    fake.set_value(g, "nvmlDeviceGetClockInfo", 1755, n.NVML_CLOCK_SM)
    fake.set_value(g, "nvmlDeviceGetClockInfo", 2600, n.NVML_CLOCK_MEM)
    fake.set_value(g, "nvmlDeviceGetUtilizationRates", n.c_nvmlUtilization_t(gpu=63, memory=27))
    fake.set_value(
        g,
        "nvmlDeviceGetMemoryInfo",
        n.c_nvmlMemory_t(total=81_559 * 2**20, used=1234 * 2**20 + 2**19, free=80_324 * 2**20 + 2**19),
    )
    fake.set_value(g, "nvmlDeviceGetFanSpeed", 44)
    fake.set_value(g, "nvmlDeviceGetPerformanceState", 2)
    reasons = (
        n.nvmlClocksEventReasonGpuIdle
        | n.nvmlClocksEventReasonSwPowerCap
        | n.nvmlClocksEventReasonHwThermalSlowdown
    )
    fake.set_value(g, "nvmlDeviceGetCurrentClocksEventReasons", reasons)
    fake.set_value(g, "nvmlDeviceGetRetiredPagesPendingStatus", n.NVML_FEATURE_ENABLED)
    fake.set_value(g, "nvmlDeviceGetRemappedRows", (4, 1, 1, 0))
    fake.set_value(g, "nvmlDeviceGetCurrPcieLinkGeneration", 4)
    fake.set_value(g, "nvmlDeviceGetCurrPcieLinkWidth", 8)
    fake.set_value(g, "nvmlDeviceGetPcieThroughput", 3, n.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
    fake.set_value(g, "nvmlDeviceGetPcieThroughput", 5, n.NVML_PCIE_UTIL_RX_BYTES)
    fake.advance(g, ecc_sbe=3, ecc_dbe=1, retired_sbe=2, retired_dbe=1, pcie_replay=7)
    fake.advance(g, link=0, nvlink_crc_flit=5)
    fake.advance(g, link=7, nvlink_crc_flit=11, nvlink_recovery=2)
    fake.advance(g, link=LINKS - 1, nvlink_replay=3, nvlink_crc_data=1)
    fake.set_value(g, "nvmlDeviceGetNvLinkState", n.NVML_FEATURE_DISABLED, 4)  # one link down

    gpu = NvmlSource(fake).read().gpus[g]

    expected = {
        "gpu_temp": 71.0,
        "memory_temp": 88.0,
        "power_usage": 412.345,
        "power_limit": 650.0,
        "total_energy": 123_456_789.0,
        "sm_clock": 1755.0,
        "mem_clock": 2600.0,
        "gpu_util": 63.0,
        "mem_copy_util": 27.0,
        "fb_used": 1234.5,
        "fb_free": 80_324.5,
        "fan_speed": 44.0,
        "pstate": 2.0,
        "clock_event_reasons": float(reasons),
        "throttle_sw_power_cap": 1.0,
        "throttle_hw_slowdown": 0.0,
        "throttle_sw_thermal": 0.0,
        "throttle_hw_thermal": 1.0,
        "throttle_hw_power_brake": 0.0,
        "ecc_sbe_volatile": 3.0,
        "ecc_dbe_volatile": 1.0,
        "ecc_sbe_aggregate": 3.0,
        "ecc_dbe_aggregate": 1.0,
        "retired_pages_sbe": 2.0,
        "retired_pages_dbe": 1.0,
        "retired_pages_pending": 1.0,
        "remapped_rows_correctable": 4.0,
        "remapped_rows_uncorrectable": 1.0,
        "row_remap_pending": 1.0,
        "row_remap_failure": 0.0,
        "pcie_replay": 7.0,
        "pcie_link_gen": 4.0,
        "pcie_link_width": 8.0,
        "pcie_link_gen_max": 5.0,
        "pcie_link_width_max": 16.0,
        "pcie_tx_bytes_per_second": 3 * 1024.0,
        "pcie_rx_bytes_per_second": 5 * 1024.0,
        "nvlink_crc_flit_errors": 16.0,
        "nvlink_crc_flit_errors_worst_link": 11.0,
        "nvlink_crc_data_errors": 1.0,
        "nvlink_crc_data_errors_worst_link": 1.0,
        "nvlink_replay_errors": 3.0,
        "nvlink_replay_errors_worst_link": 3.0,
        "nvlink_recovery_errors": 2.0,
        "nvlink_recovery_errors_worst_link": 2.0,
        "nvlink_links_active": float(LINKS - 1),
    }
    actual = {name: gpu.get(name) for name in expected}
    assert actual == pytest.approx(expected)


def test_throttle_flags_follow_each_bit(fake: FakeNvml) -> None:
    flags = {
        "throttle_sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "throttle_hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "throttle_sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "throttle_hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "throttle_hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    }
    for gpu, bit in enumerate(flags.values()):
        fake.set_value(gpu, "nvmlDeviceGetCurrentClocksEventReasons", bit)
    reading = NvmlSource(fake).read()
    for gpu, raised in enumerate(flags):
        got = {name: reading.gpus[gpu].get(name) for name in flags}
        assert got == {name: float(name == raised) for name in flags}


def test_memory_temp_decodes_the_field_value_type(fake: FakeNvml) -> None:
    fake.set_value(0, "nvmlDeviceGetFieldValues", 84.5, pynvml.NVML_FI_DEV_MEMORY_TEMP)  # a double field
    assert NvmlSource(fake).read().gpus[0].get("memory_temp") == 84.5


def test_not_supported_is_nan_for_exactly_those_metrics(fake: FakeNvml) -> None:
    ns = pynvml.NVML_ERROR_NOT_SUPPORTED
    g = 4
    fake.set_error(g, "nvmlDeviceGetFanSpeed", ns)
    fake.set_error(
        g, "nvmlDeviceGetFieldValues", ns, pynvml.NVML_FI_DEV_MEMORY_TEMP
    )  # the field's nvmlReturn
    fake.set_error(g, "nvmlDeviceGetRemappedRows", ns)
    source = NvmlSource(fake)
    fake.set_error(g, "nvmlDeviceGetNvLinkErrorCounter", ns)  # links exist, counters unreadable

    reading = source.read()

    gpu = reading.gpus[g]
    assert nan_names(gpu) == {"fan_speed", "memory_temp"} | REMAPPED_METRICS | NVLINK_COUNTER_METRICS
    assert gpu.get("nvlink_links_active") == LINKS
    assert gpu.get("nvml_unsupported_fields") == 3 + 4 * LINKS  # one per NOT_SUPPORTED call
    assert gpu.get("nvml_failed_calls") == 0
    assert not gpu.lost
    for other in reading.gpus:
        if other.index != g:
            assert nan_names(other) == set()
            assert other.get("nvml_unsupported_fields") == 0


def test_a_function_missing_from_an_older_driver_counts_as_unsupported(fake: FakeNvml) -> None:
    fake.set_error(0, "nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    gpu = NvmlSource(fake).read().gpus[0]
    assert nan_names(gpu) == {"clock_event_reasons", *(n for n in GPU_NAMES if n.startswith("throttle_"))}
    assert gpu.get("nvml_unsupported_fields") == 1
    assert gpu.get("nvml_failed_calls") == 0


def test_a_generic_failure_is_nan_and_counted_on_that_gpu_only(fake: FakeNvml) -> None:
    g = 2
    source = NvmlSource(fake)
    fake.set_error(g, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    fake.set_error(g, "nvmlDeviceGetFieldValues", pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_FI_DEV_MEMORY_TEMP)

    first = source.read()
    second = source.read()

    assert nan_names(first.gpus[g]) == {"power_usage", "memory_temp"}
    assert first.gpus[g].get("nvml_failed_calls") == 2
    assert second.gpus[g].get("nvml_failed_calls") == 4  # cumulative
    assert first.gpus[g].get("nvml_unsupported_fields") == 0
    for other in second.gpus:
        if other.index != g:
            assert nan_names(other) == set()
            assert other.get("nvml_failed_calls") == 0

    fake.set_error(g, "nvmlDeviceGetPowerUsage", None)
    third = source.read()
    assert not math.isnan(third.gpus[g].get("power_usage"))
    assert third.gpus[g].get("nvml_failed_calls") == 5  # only the memory field still fails


def test_a_lost_gpu_is_reported_and_the_others_complete(fake: FakeNvml) -> None:
    source = NvmlSource(fake)
    before = Counter(fake.calls)
    source.read()
    per_gpu_calls = device_calls(fake.calls - before) // 8
    lost = 5
    fake.lose_gpu(lost)
    before = Counter(fake.calls)

    reading = source.read()  # must not raise

    gpu = reading.gpus[lost]
    assert gpu.lost
    assert gpu.get("gpu_lost") == 1.0
    assert gpu.get("nvml_failed_calls") == 1
    # Only self-health (and the collector-side Xid bookkeeping) survives the loss.
    assert nan_names(gpu) == set(GPU_NAMES) - SELF_HEALTH - XID_METRICS - {"gpu_lost"}
    # The source stops calling a lost GPU after its first failure.
    assert device_calls(fake.calls - before) == 7 * per_gpu_calls + 1
    for other in reading.gpus:
        if other.index != lost:
            assert not other.lost
            assert nan_names(other) == set()

    fake.restore_gpu(lost)  # retried on the next scrape: a GPU that comes back is seen
    back = source.read().gpus[lost]
    assert not back.lost
    assert nan_names(back) == set()


def device_calls(made: Counter[str]) -> int:
    """Calls on GPUs, leaving out the per-scrape event-set drain."""
    return made.total() - made["nvmlEventSetWait"]


def test_a_gpu_lost_before_opening_is_reported_and_opened_later(fake: FakeNvml) -> None:
    fake.lose_gpu(6)
    source = NvmlSource(fake)
    assert any("GPU 6" in note for note in source.notes)
    gpu = source.read().gpus[6]
    assert gpu.lost
    assert gpu.get("gpu_lost") == 1.0
    fake.restore_gpu(6)
    gpu = source.read().gpus[6]
    assert not gpu.lost
    assert nan_names(gpu) == set()
    assert gpu.uuid == pynvml_uuid(fake, 6)


def test_xid_events_count_on_the_gpu_that_raised_them(fake: FakeNvml) -> None:
    source = NvmlSource(fake)
    fake.inject_xid(3, 79)
    fake.inject_xid(3, 48)
    fake.inject_xid(1, UNTRACKED_XID)

    first = source.read()

    assert xids(first.gpus[3]) == {"xid_79_events": 1.0, "xid_48_events": 1.0, "xid_last": 48.0}
    assert xids(first.gpus[1]) == {"xid_other_events": 1.0, "xid_last": float(UNTRACKED_XID)}
    for gpu in first.gpus:
        if gpu.index not in (1, 3):
            assert xids(gpu) == {}
    assert all(not event_set.queue for event_set in fake.event_sets)  # drained

    second = source.read()  # no new events: nothing counted twice
    assert xids(second.gpus[3]) == xids(first.gpus[3])

    fake.inject_xid(3, 79)
    third = source.read()  # counters accumulate since the collector started
    assert xids(third.gpus[3]) == {"xid_79_events": 2.0, "xid_48_events": 1.0, "xid_last": 79.0}


def xids(gpu: GpuReading) -> dict[str, float]:
    """The non-zero Xid metrics of one GPU."""
    return {name: gpu.get(name) for name in sorted(XID_METRICS) if gpu.get(name) != 0}


def test_xid_counters_survive_a_lost_gpu(fake: FakeNvml) -> None:
    source = NvmlSource(fake)
    fake.inject_xid(0, 79)
    fake.lose_gpu(0)
    gpu = source.read().gpus[0]
    assert gpu.lost
    assert gpu.get("xid_79_events") == 1.0
    assert gpu.get("xid_last") == 79.0


def test_xids_are_nan_where_events_cannot_be_registered(fake: FakeNvml) -> None:
    fake.set_supported_events(1, pynvml.nvmlEventTypeSingleBitEccError)
    fake.set_error(2, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_UNKNOWN)
    source = NvmlSource(fake)
    assert len(source.notes) == 2
    reading = source.read()
    for g in (1, 2):
        assert nan_names(reading.gpus[g]) == XID_METRICS
    assert nan_names(reading.gpus[0]) == set()


def test_event_device_handles_match_by_address() -> None:
    # pynvml returns a fresh pointer object per call; the source must still map it to its GPU.
    first = ctypes.cast(0x7F00_1000, pynvml.c_nvmlDevice_t)
    again = ctypes.cast(0x7F00_1000, pynvml.c_nvmlDevice_t)
    other = ctypes.cast(0x7F00_2000, pynvml.c_nvmlDevice_t)
    assert first is not again
    assert handle_key(first) == handle_key(again)
    assert handle_key(first) != handle_key(other)


def test_an_unreadable_link_leaves_the_sums_missing_but_not_the_worst_link(fake: FakeNvml) -> None:
    source = NvmlSource(fake)
    fake.advance(0, link=2, nvlink_crc_flit=9)
    fake.advance(0, link=3, nvlink_crc_flit=4)
    fake.set_error(
        0,
        "nvmlDeviceGetNvLinkErrorCounter",
        pynvml.NVML_ERROR_UNKNOWN,
        3,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    )
    gpu = source.read().gpus[0]
    # A sum short of one link would read downstream as a counter reset.
    assert nan_names(gpu) == {"nvlink_crc_flit_errors"}
    assert gpu.get("nvlink_crc_flit_errors_worst_link") == 9.0
    assert gpu.get("nvml_failed_calls") == 1


def test_gpus_without_nvlink_report_nvlink_as_missing() -> None:
    reading = NvmlSource(FakeNvml(gpus=2, model_name="NVIDIA L4", nvlink_links=0)).read()
    for gpu in reading.gpus:
        assert nan_names(gpu) == NVLINK_COUNTER_METRICS | {"nvlink_links_active"}
        assert gpu.model_name == "NVIDIA L4"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "permission"),
    ],
)
def test_unavailable_when_nvml_does_not_start(code: int, words: str) -> None:
    fake = FakeNvml()
    fake.set_error(None, "nvmlInit", code)
    available, why = nvml_available(fake)
    assert not available
    assert words in why
    with pytest.raises(NvmlUnavailable, match=words):
        NvmlSource(fake)


def test_unavailable_without_gpus() -> None:
    fake = FakeNvml(gpus=0)
    available, why = nvml_available(fake)
    assert not available
    assert "no GPU" in why
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        NvmlSource(fake)
    assert not fake.initialized  # NVML shut down again


def test_available_with_gpus(fake: FakeNvml) -> None:
    available, why = nvml_available(fake)
    assert available
    assert "8 GPU" in why
    assert not fake.initialized


def test_call_latencies_are_recorded(fake: FakeNvml) -> None:
    step = 1e-6
    source = NvmlSource(fake, clock=TickClock(step))
    before = Counter(fake.calls)
    scrapes = 3
    for _ in range(scrapes):
        reading = source.read()

    stats = source.call_stats
    made = fake.calls - before
    assert {name: s.count for name, s in stats.items()} == dict(made)
    for name, s in stats.items():
        assert s.total_seconds == pytest.approx(s.count * step), name
        assert s.max_seconds == pytest.approx(step), name
        assert s.mean_seconds == pytest.approx(step), name
    # The parity calls (encoder, decoder, memory v2, NVLink throughput fields, GPM sample and metrics) are
    # recorded above, but left out of the GPU's own call time, which the model reads.
    per_gpu = device_calls(made) / scrapes / 8 - 6
    for gpu in reading.gpus:
        assert gpu.get("nvml_call_seconds") == pytest.approx(per_gpu * step)
        assert gpu.get("nvml_slowest_call_seconds") == pytest.approx(step)
    as_json = source.call_stats_json()
    assert as_json["nvmlDeviceGetNvLinkErrorCounter"]["count"] == scrapes * 8 * 4 * LINKS


def test_close_releases_nvml(fake: FakeNvml) -> None:
    source = NvmlSource(fake)
    assert fake.initialized
    assert len(fake.event_sets) == 1
    source.close()
    source.close()  # idempotent
    assert not fake.initialized
    assert fake.event_sets == []
    with pytest.raises(RuntimeError, match="close"):
        source.read()


def test_fake_raises_the_real_binding_errors(fake: FakeNvml) -> None:
    fake.nvmlInit()
    fake.set_error(0, "nvmlDeviceGetFanSpeed", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.lose_gpu(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetFanSpeed(fake.handle(0))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetFanSpeed(fake.handle(1))
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(fake.nvmlEventSetCreate(), 0)
    assert fake.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST  # constants delegate
    with pytest.raises(AttributeError):
        _ = fake.nvmlDeviceGetBoardId  # unimplemented functions never reach a real driver


# -- hung calls ---------------------------------------------------------------------------------


def test_a_hung_call_is_abandoned_at_the_timeout_and_the_scrape_goes_on(
    fake: FakeNvml, hang: Callable[..., FakeHang], caplog: pytest.LogCaptureFixture
) -> None:
    g = 3
    hung = hang(g, "nvmlDeviceGetPowerUsage")
    source = NvmlSource(fake, timeout=TIMEOUT_S)

    reading = within(source.read)

    # The scrape came back while the call is still inside NVML: it did not wait for it.
    assert hung.blocked == 1
    assert not hung.released
    gpu = reading.gpus[g]
    assert math.isnan(gpu.get("power_usage"))
    # Read before the hang (the plan's first calls): kept.
    assert {"gpu_temp", "memory_temp"}.isdisjoint(nan_names(gpu))
    assert gpu.get("gpu_temp") == fake.get_value(g, "nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
    assert gpu.get("nvml_timed_out_calls") == 1
    assert gpu.get("nvml_failed_calls") == 1  # counted like an NVML error
    assert gpu.get("nvml_slowest_call_seconds") >= TIMEOUT_S
    assert not gpu.lost
    assert gpu.get("gpu_lost") == 0.0
    for other in reading.gpus:
        if other.index != g:
            assert nan_names(other) == set()
            assert other.get("nvml_timed_out_calls") == 0
    assert source.call_stats["nvmlDeviceGetPowerUsage"].timeouts == 1
    assert source.call_stats_json()["nvmlDeviceGetPowerUsage"]["timeouts"] == 1
    assert source.call_stats["nvmlDeviceGetTemperature"].timeouts == 0
    assert warnings_about(caplog, "nvmlDeviceGetPowerUsage") == 1


def test_a_gpu_with_a_hung_call_is_skipped_until_the_call_returns(
    fake: FakeNvml, hang: Callable[..., FakeHang], caplog: pytest.LogCaptureFixture
) -> None:
    g = 5
    corrected, volatile = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
    hung = hang(g, "nvmlDeviceGetTotalEccErrors", corrected, volatile)
    source = NvmlSource(fake, timeout=TIMEOUT_S)
    within(source.read)
    calls_on_g = fake.gpu_calls(g)
    calls_on_others = [fake.gpu_calls(i) for i in range(8) if i != g]

    second = within(source.read)  # still hung

    assert fake.gpu_calls(g) == calls_on_g  # no call at all on that GPU, so no second stuck thread
    assert hung.entered == 1
    assert hung.blocked == 1
    assert [fake.gpu_calls(i) for i in range(8) if i != g] != calls_on_others  # the others were read
    gpu = second.gpus[g]
    # Nothing read: only the collector's bookkeeping (timing, failure counts, Xids) is there.
    assert nan_names(gpu) == set(GPU_NAMES) - (SELF_HEALTH - {"nvml_unsupported_fields"}) - XID_METRICS - {
        "gpu_lost"
    }
    assert gpu.get("nvml_timed_out_calls") == 1  # the same hung call, counted once
    assert gpu.get("nvml_failed_calls") == 2  # the timeout, then one skipped scrape
    assert gpu.get("nvml_call_seconds") == 0.0
    assert not gpu.lost
    for other in second.gpus:
        if other.index != g:
            assert nan_names(other) == set()
    assert warnings_about(caplog, "nvmlDeviceGetTotalEccErrors") == 1  # once per hung call, not per scrape

    hung.release()
    assert source.join(GENEROUS_S)
    third = within(source.read)

    back = third.gpus[g]
    assert nan_names(back) == set()
    assert back.get("ecc_sbe_volatile") == 0.0
    assert back.get("nvml_timed_out_calls") == 1  # cumulative
    assert back.get("nvml_failed_calls") == 2
    assert hung.entered == 2  # called again once it had returned
    assert source.call_stats["nvmlDeviceGetTotalEccErrors"].timeouts == 1
    assert warnings_about(caplog, "nvmlDeviceGetTotalEccErrors") == 1


def test_a_hung_event_drain_does_not_stop_the_gpu_reads_and_loses_no_xid(
    fake: FakeNvml, hang: Callable[..., FakeHang]
) -> None:
    hung = hang(None, "nvmlEventSetWait")
    source = NvmlSource(fake, timeout=TIMEOUT_S)
    fake.inject_xid(2, 79)

    first = within(source.read)
    second = within(source.read)  # the drain is still hung: not called again

    assert hung.blocked == 1
    assert hung.entered == 1
    for reading in (first, second):
        for gpu in reading.gpus:
            assert nan_names(gpu) == set()
        assert reading.gpus[2].get("xid_79_events") == 0.0  # not drained yet
    assert source.call_stats["nvmlEventSetWait"].timeouts == 1

    hung.release()  # the hung wait returns the queued Xid: it still counts
    assert source.join(GENEROUS_S)
    third = within(source.read)
    assert third.gpus[2].get("xid_79_events") == 1.0
    assert third.gpus[2].get("xid_last") == 79.0


def test_a_gpu_hung_while_opening_is_reported_missing_and_opened_later(
    fake: FakeNvml, hang: Callable[..., FakeHang]
) -> None:
    g = 6
    fake.lose_gpu(g)
    source = NvmlSource(fake, timeout=TIMEOUT_S)  # GPU 6 does not open: tried again on each scrape
    fake.restore_gpu(g)
    hung = hang(g, "nvmlDeviceGetHandleByIndex")

    first = within(source.read)

    assert hung.blocked == 1
    gpu = first.gpus[g]
    assert nan_names(gpu) == set(GPU_NAMES) - {
        "nvml_call_seconds",
        "nvml_slowest_call_seconds",
        "nvml_failed_calls",
        "nvml_timed_out_calls",
        "gpu_lost",
    }
    assert gpu.get("nvml_timed_out_calls") == 1
    assert not gpu.lost
    for other in first.gpus:
        if other.index != g:
            assert nan_names(other) == set()

    hung.release()
    assert source.join(GENEROUS_S)
    back = within(source.read).gpus[g]
    assert nan_names(back) == set()
    assert back.uuid == pynvml_uuid(fake, g)


def test_close_does_not_wait_for_a_hung_call(fake: FakeNvml, hang: Callable[..., FakeHang]) -> None:
    hung = hang(1, "nvmlDeviceGetMemoryInfo")
    source = NvmlSource(fake, timeout=TIMEOUT_S)
    within(source.read)

    within(source.close)

    assert hung.blocked == 1
    assert not source.join(0.0)
    with pytest.raises(RuntimeError, match="close"):
        source.read()


def test_without_a_timeout_every_call_runs_on_the_calling_thread(fake: FakeNvml) -> None:
    seen: set[str] = set()
    get = fake.nvmlDeviceGetPowerUsage

    def power(handle: object) -> object:
        seen.add(threading.current_thread().name)
        return get(handle)

    fake.nvmlDeviceGetPowerUsage = power  # type: ignore[method-assign]  # spy on the thread only
    reading = NvmlSource(fake, timeout=None).read()

    assert seen == {threading.current_thread().name}
    for gpu in reading.gpus:
        assert nan_names(gpu) == set()


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan])
def test_a_timeout_must_be_positive(fake: FakeNvml, timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        NvmlSource(fake, timeout=timeout)
