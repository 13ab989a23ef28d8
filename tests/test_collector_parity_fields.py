"""dcgm-exporter's default fields that are not catalogue metrics (faultcast.dcgm.PARITY): read through
the fake NVML at the pynvml boundary, exported under dcgm-exporter's names, types, units and labels
when NVML gives them, absent (never zero) when it does not, and kept out of everything the model reads."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from faultcast.catalogue import Scope, metrics_for
from faultcast.collector.exporter import SnapshotExporter, gpu_labels
from faultcast.collector.nvml.source import NvmlSource
from faultcast.dcgm import PARITY, PARITY_INDEX, Vocabulary, parity_name, readable_names
from faultcast.readings import GpuReading, NodeSnapshot, pack
from faultcast.testing.fake_nvml import FakeNvml

N = pynvml
GPM_FIELDS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
}
SECOND_US = 1_000_000


@pytest.fixture
def fake() -> FakeNvml:
    """Two H100s whose field values are stamped one second apart, in call order."""
    nvml = FakeNvml(gpus=2, nvlink_links=18)
    stamps = itertools.count(1_700_000_000 * SECOND_US, SECOND_US)
    nvml.field_time_us = lambda: next(stamps)
    return nvml


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    with NvmlSource(fake, timeout=None) as opened:  # one thread: the field stamps come in call order
        yield opened


def _text(readings: tuple[GpuReading, ...], vocabulary: Vocabulary = Vocabulary.CLASSIC) -> str:
    snapshot = NodeSnapshot("node-7", 1, readings, (), pack(Scope.HOST, {}), pack(Scope.COLLECTOR, {}))
    return SnapshotExporter(lambda: snapshot, vocabulary).render().decode()


def _families(text: str) -> dict[str, tuple[str, dict[str, float]]]:
    """family -> (type, {gpu: value}), through prometheus-client's parser."""
    return {
        family.name: (family.type, {s.labels["gpu"]: s.value for s in family.samples})
        for family in text_string_to_metric_families(text)
        if family.name.startswith("DCGM_")
    }


def _parity(reading: GpuReading, key: str) -> float:
    return reading.parity[PARITY_INDEX[key]]


def test_every_parity_field_is_exported_with_dcgm_exporter_s_name_type_unit_and_labels(
    fake: FakeNvml, source: NvmlSource
) -> None:
    fake.set_value(0, "nvmlDeviceGetEncoderUtilization", [12, 167_000])
    fake.set_value(0, "nvmlDeviceGetDecoderUtilization", [7, 167_000])
    fake.set_value(0, "nvmlGpmMetricsGet", 62.5, N.NVML_GPM_METRIC_GRAPHICS_UTIL)
    fake.set_value(0, "nvmlGpmMetricsGet", 20.0, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
    fake.set_value(0, "nvmlGpmMetricsGet", 50.0, N.NVML_GPM_METRIC_DRAM_BW_UTIL)
    fake.set_value(0, "nvmlGpmMetricsGet", 3.0, N.NVML_GPM_METRIC_PCIE_TX_PER_SEC)  # MiB/s
    fake.set_value(0, "nvmlGpmMetricsGet", 1.5, N.NVML_GPM_METRIC_PCIE_RX_PER_SEC)
    source.read()
    # The NVLink counters advance 5,000,000 KiB between two reads of GPU 0's fields; the fixture's
    # field clock gives each nvmlDeviceGetFieldValues call (memory temperature, then NVLink, per GPU)
    # the next second, so GPU 0's two NVLink reads are four calls, 4 s, apart.
    fake.advance(0, nvlink_tx_kib=3_000_000, nvlink_rx_kib=2_000_000)
    reading = source.read()
    gpu = reading.gpus[0]

    families = _families(_text(reading.gpus))
    expected = {
        "DCGM_FI_DEV_ENC_UTIL": ("gauge", 12.0),  # percent
        "DCGM_FI_DEV_DEC_UTIL": ("gauge", 7.0),
        "DCGM_FI_DEV_FB_RESERVED": ("gauge", 519.0),  # MiB
        # DCGM's MB/s: KiB per second / 1000, truncated; typed counter as default-counters.csv says.
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", float(int(5_000_000 / 4 / 1000))),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", 0.625),  # ratios, 0-1
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", 0.2),
        "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", 0.5),
        "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", 3.0 * 2**20),  # bytes per second
        "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", 1.5 * 2**20),
    }
    assert set(expected) == {field.classic for field in PARITY}
    for name, (kind, value) in expected.items():
        assert families[name][0] == kind, name
        assert families[name][1]["0"] == pytest.approx(value), name
        assert families[name][1].keys() == {"0", "1"}, name  # both GPUs give every field
    assert _parity(gpu, "nvlink_bandwidth_total") == 1250.0
    # The same labels as every other GPU series, in dcgm-exporter's order.
    line = next(line for line in _text(reading.gpus).splitlines() if line.startswith("DCGM_FI_DEV_ENC_UTIL{"))
    assert line.startswith('DCGM_FI_DEV_ENC_UTIL{gpu="0",UUID="GPU-')
    for family in text_string_to_metric_families(_text(reading.gpus)):
        if family.name in expected:
            for sample in family.samples:
                assert tuple(sample.labels) == gpu_labels(), family.name


def test_the_canonical_vocabulary_names_them_as_dcgm_4_6_does(source: NvmlSource) -> None:
    source.read()
    reading = source.read()
    classic, canonical = _families(_text(reading.gpus)), _families(_text(reading.gpus, Vocabulary.CANONICAL))
    renamed = {
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    }
    for field in PARITY:
        new = renamed.get(field.classic, field.classic)
        assert parity_name(field, Vocabulary.CANONICAL) == new
        assert canonical[new] == classic[field.classic], new  # same type, same values (same units)
        if new != field.classic:
            assert new not in classic
            assert field.classic not in canonical


def test_the_first_scrape_has_no_nvlink_rate_and_a_counter_reset_starts_again(
    fake: FakeNvml, source: NvmlSource
) -> None:
    first = source.read()
    assert math.isnan(_parity(first.gpus[0], "nvlink_bandwidth_total"))  # nothing to difference yet
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in _text(first.gpus)
    assert _parity(source.read().gpus[0], "nvlink_bandwidth_total") == 0.0  # no traffic: a real zero
    fake.set_value(
        0, "nvmlDeviceGetFieldValues", 10, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    )  # driver reload
    assert math.isnan(_parity(source.read().gpus[0], "nvlink_bandwidth_total"))
    assert _parity(source.read().gpus[0], "nvlink_bandwidth_total") == 0.0


@pytest.mark.parametrize(
    ("unsupported", "absent"),
    [
        ("nvmlDeviceGetEncoderUtilization", {"DCGM_FI_DEV_ENC_UTIL"}),
        ("nvmlDeviceGetDecoderUtilization", {"DCGM_FI_DEV_DEC_UTIL"}),
        ("nvmlDeviceGetMemoryInfo_v2", {"DCGM_FI_DEV_FB_RESERVED"}),
        ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}),
        ("nvmlGpmSampleGet", GPM_FIELDS),
        ("nvmlGpmMetricsGet", GPM_FIELDS),
    ],
)
def test_a_field_the_driver_does_not_support_is_absent_and_counts_nowhere_the_model_reads(
    fake: FakeNvml, unsupported: str, absent: set[str]
) -> None:
    with NvmlSource(fake) as source:
        source.read()
        if unsupported.startswith("NVML_FI_"):
            fake.set_error(1, "nvmlDeviceGetFieldValues", N.NVML_ERROR_NOT_SUPPORTED, getattr(N, unsupported))
        elif unsupported == "nvmlDeviceGetMemoryInfo_v2":
            fake.set_error(1, "nvmlDeviceGetMemoryInfo", N.NVML_ERROR_NOT_SUPPORTED, N.nvmlMemory_v2)
        else:
            fake.set_error(1, unsupported, N.NVML_ERROR_NOT_SUPPORTED)
        source.read()
        reading = source.read()
    families = _families(_text(reading.gpus))
    for name in {field.classic for field in PARITY}:
        gpus = set(families.get(name, ("", {}))[1])
        assert gpus == ({"0"} if name in absent else {"0", "1"}), name  # absent, not zero
    # Nothing the model reads moved: the GPU's catalogue values, unsupported and failed counts.
    for gpu in reading.gpus:
        assert gpu.get("nvml_unsupported_fields") == 0
        assert gpu.get("nvml_failed_calls") == 0
        assert not any(math.isnan(v) for v in gpu.values)


def test_an_error_in_a_parity_call_is_no_failed_call(fake: FakeNvml) -> None:
    with NvmlSource(fake) as source:
        fake.set_error(0, "nvmlGpmMetricsGet", N.NVML_ERROR_UNKNOWN)
        fake.set_error(0, "nvmlDeviceGetEncoderUtilization", N.NVML_ERROR_UNKNOWN)
        reading = source.read()
    gpu = reading.gpus[0]
    assert gpu.get("nvml_failed_calls") == 0
    assert math.isnan(_parity(gpu, "enc_util"))
    assert math.isnan(_parity(gpu, "prof_gr_engine_active"))
    assert not math.isnan(_parity(gpu, "dec_util"))


def test_a_gpu_without_gpm_gets_no_gpm_call_and_no_prof_series() -> None:
    fake = FakeNvml(gpus=2, model_name="NVIDIA A100-SXM4-80GB", gpm=False)
    with NvmlSource(fake) as source:
        source.read()
        reading = source.read()
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 2
    assert (
        fake.calls["nvmlGpmSampleAlloc"]
        == fake.calls["nvmlGpmSampleGet"]
        == fake.calls["nvmlGpmMetricsGet"]
        == 0
    )
    text = _text(reading.gpus)
    assert not GPM_FIELDS & set(_families(text))
    assert "DCGM_FI_DEV_ENC_UTIL" in _families(text)  # the rest is there


def test_one_gpu_without_gpm_among_gpus_with_it(fake: FakeNvml) -> None:
    fake.set_gpm_supported(1, False)
    with NvmlSource(fake) as source:
        reading = source.read()
    families = _families(_text(reading.gpus))
    for name in GPM_FIELDS:
        assert set(families[name][1]) == {"0"}, name


def test_a_metric_gpm_refuses_alone_is_absent(fake: FakeNvml, source: NvmlSource) -> None:
    del fake._gpus[0].values["nvmlGpmMetricsGet", (N.NVML_GPM_METRIC_DRAM_BW_UTIL,)]
    reading = source.read()
    assert math.isnan(_parity(reading.gpus[0], "prof_dram_active"))
    assert _parity(reading.gpus[0], "prof_gr_engine_active") == pytest.approx(0.975)


class _OldBinding(FakeNvml):
    """A pynvml without GPM calls: asking for one raises AttributeError, as for any missing function."""

    def __getattribute__(self, name: str) -> object:
        if name.startswith("nvmlGpm"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_binding_without_gpm_reads_everything_else() -> None:
    fake = _OldBinding(gpus=1)
    with NvmlSource(fake) as source:
        reading = source.read()
    gpu = reading.gpus[0]
    assert all(math.isnan(_parity(gpu, f.key)) for f in PARITY if f.classic in GPM_FIELDS)
    assert not math.isnan(_parity(gpu, "enc_util"))
    assert not any(math.isnan(v) for v in gpu.values)


def test_gpm_samples_are_taken_when_a_gpu_opens_and_freed_on_close(fake: FakeNvml) -> None:
    fake.lose_gpu(1)
    source = NvmlSource(fake)
    assert len(fake.gpm_samples) == 2  # two for GPU 0; GPU 1 did not open
    assert fake.calls["nvmlGpmSampleGet"] == 1  # the first sample, taken at opening
    fake.restore_gpu(1)
    reading = source.read()  # GPU 1 opens on this scrape
    assert len(fake.gpm_samples) == 4
    assert not math.isnan(_parity(reading.gpus[0], "prof_gr_engine_active"))  # against the opening's sample
    source.close()
    assert fake.gpm_samples == {}


def test_no_nvlink_no_nvlink_bandwidth_and_no_call_for_it() -> None:
    fake = FakeNvml(gpus=1, nvlink_links=0)  # a PCIe card
    with NvmlSource(fake) as source:
        source.read()
        reading = source.read()
    assert math.isnan(_parity(reading.gpus[0], "nvlink_bandwidth_total"))
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2  # the memory temperature only
    assert reading.gpus[0].get("nvml_unsupported_fields") == 0


def test_a_hung_parity_call_costs_no_catalogue_value(fake: FakeNvml) -> None:
    with NvmlSource(fake, timeout=0.2) as source:
        hang = fake.hang(0, "nvmlGpmSampleGet")
        try:
            reading = source.read()
        finally:
            hang.release()
        assert source.join(10)
    gpu = reading.gpus[0]
    assert gpu.get("nvml_timed_out_calls") == 1  # a hang is a hang
    catalogue = {m.name for m in metrics_for(Scope.GPU)}
    # Every catalogue value stands (NOT_SUPPORTED counts are not known for an abandoned scrape).
    assert {name for name in catalogue if math.isnan(gpu.get(name))} == {"nvml_unsupported_fields"}
    assert not math.isnan(_parity(gpu, "enc_util"))  # read before the hang
    assert math.isnan(_parity(gpu, "prof_gr_engine_active"))


def test_readings_without_parity_values_export_none_of_them(source: NvmlSource) -> None:
    reading = source.read()
    bare = tuple(
        GpuReading(g.index, g.uuid, g.model_name, g.values) for g in reading.gpus
    )  # a simulated source
    names = set(_families(_text(bare)))
    assert not names & {field.classic for field in PARITY}
    assert "DCGM_FI_DEV_GPU_TEMP" in names


def test_the_importer_leaves_parity_fields_out_and_says_why() -> None:
    from faultcast.model.importers.names import why_unknown

    readable = readable_names()
    for field in PARITY:
        for vocabulary in Vocabulary:
            name = parity_name(field, vocabulary)
            assert name not in readable  # never mapped onto a catalogue column
            assert "exports for parity" in why_unknown(name)
