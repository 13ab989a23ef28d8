"""The collector's /metrics against dcgm-exporter: Prometheus types, exact names, labels, and the
newer DCGM vocabulary, checked with prometheus-client's parser, the real promtool and a real
Prometheus scraping real `faultcast collect` processes."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from faultcast.catalogue import Scope, metrics_for
from faultcast.collector.exporter import SnapshotExporter, gpu_labels, start_metrics_server
from faultcast.collector.nvml.source import NvmlSource
from faultcast.dcgm import PARITY, Vocabulary, names
from faultcast.readings import NodeSnapshot
from faultcast.testing.fake_nvml import FakeNvml
from faultcast.testing.system import require_binary
from tests.prometheus_api import api, running_prometheus, until

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))

# The Prometheus type of each field as dcgm-exporter declares it in etc/default-counters.csv and
# etc/dcp-metrics-included.csv (NVIDIA/dcgm-exporter at d5e5f51, the same as release 4.5.3-4.8.2),
# commented-out rows included: they are the rows users enable. Written down here from those files,
# independently of faultcast.dcgm, which this checks.
DCGM_EXPORTER_TYPES = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_RETIRED_SBE": "counter",
    "DCGM_FI_DEV_RETIRED_DBE": "counter",
    "DCGM_FI_DEV_RETIRED_PENDING": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    # Default fields exported for parity only, outside the catalogue (faultcast.dcgm.PARITY).
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    # Listed twice in default-counters.csv: commented out as a counter under "PCIE", and enabled as
    # a gauge (bytes per second) under the DCP fields. The enabled row is what dcgm-exporter serves.
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}
# The rows etc/default-counters.csv of dcgm-exporter 4.5.3-4.8.2 enables (not commented out), in its
# order: what dcgm-exporter serves by default.
DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)  # fmt: skip
# Default rows faultcast does not export as a series, and why (docs/metrics.md says the same).
NOT_EXPORTED = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "a vGPU guest's licence state: no vGPU on the nodes faultcast reads",
    "DCGM_FI_DRIVER_VERSION": "a label on every GPU series, not a series (as in dcgm-exporter)",
}
# Fields once typed gauge here and counter in dcgm-exporter.
ISSUE_COUNTERS = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}  # fmt: skip
# The same fields under DCGM 4.6's canonical names (dcgm_fields.h of NVIDIA/go-dcgm at b7fa315, DCGM
# 4.6.1), with the unit scale from the classic field.
CANONICAL = {
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1e6),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1e-3),
    "DCGM_FI_DEV_FAN_SPEED": ("DCGM_FI_DEV_FAN_SPEED_RATIO", 1e-2),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1e-2),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 1.0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0),
}
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", re.M)


def _snapshot(gpus: int = 2) -> NodeSnapshot:
    """The second scrape of fake H100s through the real NVML source: every GPU metric present, and
    every parity field (NVLink bandwidth is a rate: the first scrape has none)."""
    fake = FakeNvml(gpus=gpus)
    stamps = itertools.count(1_700_000_000_000_000, 1_000_000)  # field values a second apart
    fake.field_time_us = lambda: next(stamps)
    with NvmlSource(fake) as source:
        source.read()
        for gpu in range(gpus):
            fake.advance(gpu, nvlink_tx_kib=40_000_000, nvlink_rx_kib=40_000_000)
        reading = source.read()
    return NodeSnapshot.merge("node-7", 1, [reading], {"scrape_duration_seconds": 0.002})


def _text(snapshot: NodeSnapshot, vocabulary: Vocabulary = Vocabulary.CLASSIC) -> str:
    return SnapshotExporter(lambda: snapshot, vocabulary).render().decode()


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of one family, through prometheus-client's parser."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    ]


def test_every_exported_field_has_the_type_dcgm_exporter_declares_and_its_exact_name() -> None:
    text = _text(_snapshot())
    declared = dict(_TYPE.findall(text))
    exported = {name for name in declared if name.startswith("DCGM_")}
    assert exported >= ISSUE_COUNTERS  # the scrape really has every field the check is about
    checked = exported & DCGM_EXPORTER_TYPES.keys()
    assert checked == DCGM_EXPORTER_TYPES.keys(), sorted(DCGM_EXPORTER_TYPES.keys() - exported)
    assert {name: declared[name] for name in checked} == {name: DCGM_EXPORTER_TYPES[name] for name in checked}
    # Fields dcgm-exporter's CSVs do not list (fan, pstate, PCIe link, power limit) are gauges.
    assert {declared[name] for name in exported - checked} == {"gauge"}
    # Samples carry the family's name exactly: no `_total` appended to dcgm-exporter's counters.
    sample_names = set(_SAMPLE.findall(text))
    assert exported <= sample_names
    assert not {n for n in sample_names if n.startswith("DCGM_") and n.endswith("_total")}
    # prometheus-client's parser reads the same types.
    parsed = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {name: parsed[name] for name in checked} == {name: DCGM_EXPORTER_TYPES[name] for name in checked}
    # faultcast's own counters are still `_total` counters.
    assert declared["faultcast_xid_events_total"] == "counter"
    assert declared["faultcast_nvml_failed_calls_total"] == "counter"


def test_every_default_counter_is_exported_but_those_that_do_not_apply() -> None:
    text = _text(_snapshot())
    exported = set(dict(_TYPE.findall(text)))
    assert {name for name in DEFAULT_COUNTERS if name not in exported} == NOT_EXPORTED.keys()
    assert 'DCGM_FI_DRIVER_VERSION="550.127.08"' in text  # the label dcgm-exporter makes of that row
    # Every default row that is exported has the type its row declares.
    assert {name for name in DEFAULT_COUNTERS if name in exported} <= DCGM_EXPORTER_TYPES.keys()
    # The parity fields are exactly the default rows the catalogue lacks, and nothing else.
    catalogue = {n.name for n in names(Vocabulary.CLASSIC).values()}
    assert {f.classic for f in PARITY} == set(DEFAULT_COUNTERS) - catalogue - NOT_EXPORTED.keys()


def test_gpu_series_carry_pci_bus_id_and_driver_version_in_dcgm_exporter_order() -> None:
    snapshot = _snapshot()
    text = _text(snapshot)
    gpu = snapshot.gpus[1]
    line = next(
        line for line in text.splitlines() if line.startswith('DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="1"')
    )
    # dcgm-exporter's template: gpu, UUID, pci_bus_id, device, modelName, Hostname, then label fields.
    assert line == (
        f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="1",UUID="{gpu.uuid}",pci_bus_id="00000000:28:00.0",'
        f'device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7",'
        f'DCGM_FI_DRIVER_VERSION="550.127.08"}} 0.0'
    )
    # Every GPU series, faultcast_* included, carries the same identity labels.
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "gpu" in sample.labels:
                assert set(gpu_labels()) <= set(sample.labels), (family.name, sample.labels)


def test_an_unknown_bus_id_or_driver_leaves_the_label_out() -> None:
    fake = FakeNvml(gpus=2)
    fake.set_error(0, "nvmlDeviceGetPciInfo", fake.NVML_ERROR_NOT_SUPPORTED)
    fake.set_error(None, "nvmlSystemGetDriverVersion", fake.NVML_ERROR_NOT_SUPPORTED)
    with NvmlSource(fake) as source:
        snapshot = NodeSnapshot.merge("n", 1, [source.read()], {})
    text = _text(snapshot)
    temps = {labels["gpu"]: labels for labels, _ in _samples(text, "DCGM_FI_DEV_GPU_TEMP")}
    assert "pci_bus_id" not in temps["0"]
    assert temps["1"]["pci_bus_id"] == "00000000:28:00.0"
    assert 'pci_bus_id=""' not in text
    assert "DCGM_FI_DRIVER_VERSION" not in text


def test_promtool_parses_the_exposition_and_finds_nothing_but_dcgm_exporter_s_own_naming() -> None:
    promtool = require_binary("promtool")
    for vocabulary in Vocabulary:
        text = _text(_snapshot(), vocabulary)
        done = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        # 0: clean, 3: lint problems only; 1 would be a text the parser refuses.
        assert done.returncode in (0, 3), done.stderr + done.stdout
        problems = {line for line in (done.stdout + done.stderr).splitlines() if line.strip()}
        assert problems
        for problem in problems:
            name, _, what = problem.partition(" ")
            inherited = (
                # dcgm-exporter's modelName label, on every GPU series
                what == "label names should be written in 'snake_case' not 'camelCase'"
                # dcgm-exporter's counter names: upper case, some without any TOTAL
                or (name.startswith("DCGM_FI_") and what == 'counter metrics should have "_total" suffix')
                or (name == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
                    and what == "metric name should not include type 'counter'")
            )  # fmt: skip
            assert inherited, (vocabulary, problem)


def test_the_canonical_vocabulary_renames_and_converts_to_base_units() -> None:
    snapshot = _snapshot()
    classic, canonical = _text(snapshot), _text(snapshot, Vocabulary.CANONICAL)
    classic_types = dict(_TYPE.findall(classic))
    canonical_types = dict(_TYPE.findall(canonical))
    for old, (new, scale) in CANONICAL.items():
        assert old not in canonical_types
        assert new not in classic_types
        assert canonical_types[new] == classic_types[old], new
        before = {labels["gpu"]: value for labels, value in _samples(classic, old)}
        after = {labels["gpu"]: value for labels, value in _samples(canonical, new)}
        assert before, old
        assert after.keys() == before.keys(), new
        for gpu, value in before.items():
            assert after[gpu] == pytest.approx(value * scale), (new, gpu)
    labels = _samples(canonical, "DCGM_FI_DEV_GPU_TEMP_CELSIUS")[0][0]
    assert labels["hostname"] == "node-7"
    assert "Hostname" not in labels
    assert labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "550.127.08"
    # Network and host series use the same node label.
    assert all(
        "Hostname" not in s.labels for f in text_string_to_metric_families(canonical) for s in f.samples
    )
    # Every catalogue metric with a DCGM name is named in both vocabularies, each name once.
    dcgm_metrics = {m.name for m in metrics_for(Scope.GPU) if m.dcgm is not None}
    assert names(Vocabulary.CLASSIC).keys() == names(Vocabulary.CANONICAL).keys() == dcgm_metrics


def test_collect_once_offers_the_canonical_names_behind_a_flag() -> None:
    def once(*extra: str) -> str:
        done = subprocess.run(
            [FAULTCAST, "collect", "--source", "simulated", "--gpus", "1", "--node", "n1", "--once", *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    default, canonical = once(), once("--dcgm-names", "canonical")
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in default
    assert "DCGM_FI_DEV_GPU_TEMP_CELSIUS" not in default
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP_CELSIUS gauge" in canonical
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_TOTAL counter" in canonical
    assert 'hostname="n1"' in canonical
    assert 'Hostname="n1"' in default


def test_metrics_are_served_as_the_text_format_dcgm_exporter_serves() -> None:
    snapshot = _snapshot()
    exporter = SnapshotExporter(lambda: snapshot)
    server = start_metrics_server(exporter.render, 0, "127.0.0.1")
    try:
        port = server.server_port
        # Prometheus asks for OpenMetrics first; like dcgm-exporter, the answer is the text format.
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  (an http:// URL above)
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert response.read() == exporter.render()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
        assert missing.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


# -- a real Prometheus scraping real collectors --------------------------------------------------


def _collector(node: str, *extra: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [FAULTCAST, "collect", "--source", "simulated", "--node", node, "--prometheus-address", "127.0.0.1",
         "--prometheus-port", "0", "--interval", "1s", "--duration", "300s", *extra],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "serving /metrics" in line, line
    return proc, int(line.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[int]:
    """A real Prometheus scraping a collector with the classic names and one with the canonical ones."""
    procs = []
    try:
        classic, classic_port = _collector("parity-classic")
        procs.append(classic)
        canonical, canonical_port = _collector("parity-canonical", "--dcgm-names", "canonical")
        procs.append(canonical)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: faultcast\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{classic_port}', '127.0.0.1:{canonical_port}']\n"
        )
        with running_prometheus(config, tmp_path) as port:
            yield port
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def test_prometheus_records_dcgm_exporter_s_types_names_and_labels(prometheus: int) -> None:
    until(
        lambda: len([t for t in api(prometheus, "targets")["activeTargets"] if t["health"] == "up"]) == 2,
        "both collectors to be up",
    )
    metadata = until(
        lambda: (m := api(prometheus, "metadata")) and "DCGM_FI_DEV_PCIE_REPLAY_TOTAL" in m and m,
        "the metadata of both targets",
    )
    canonical_counters = {
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
    }  # fmt: skip
    for name in ISSUE_COUNTERS | canonical_counters:
        assert {entry["type"] for entry in metadata.get(name, [])} == {"counter"}, name
    assert {entry["type"] for entry in metadata["DCGM_FI_DEV_GPU_TEMP"]} == {"gauge"}

    series = api(prometheus, "query", query='DCGM_FI_DEV_PCIE_REPLAY_COUNTER{Hostname="parity-classic"}')
    assert len(series["result"]) == 8
    for result in series["result"]:
        labels = result["metric"]
        assert labels["__name__"] == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])
        assert re.fullmatch(r"\d+\.\d+\.\d+", labels["DCGM_FI_DRIVER_VERSION"])
    assert api(prometheus, "query", query="DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total")["result"] == []
    canonical = api(prometheus, "query", query='DCGM_FI_DEV_SM_CLOCK_HERTZ{hostname="parity-canonical"}')
    assert len(canonical["result"]) == 8
    assert all(float(r["value"][1]) > 1e8 for r in canonical["result"])  # hertz, not megahertz
