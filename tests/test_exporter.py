from __future__ import annotations

import dataclasses
import math

from prometheus_client.parser import text_string_to_metric_families

from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.collector.exporter import GPU_LABELS, SnapshotExporter
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot
from faultcast.sim.realtime import SimulatedSource


def _exposition(snapshot: NodeSnapshot | None) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = SnapshotExporter(lambda: snapshot).render().decode()
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def _snapshot() -> NodeSnapshot:
    reading = SimulatedSource(gpus=2, seed=5).read()
    return NodeSnapshot.merge("node-7", 1, [reading], {"scrape_duration_seconds": 0.002})


def test_gpu_series_use_dcgm_exporter_names_and_labels() -> None:
    snapshot = _snapshot()
    families = _exposition(snapshot)
    temps = families["DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 2
    _, labels, value = temps[1]
    assert set(labels) == set(GPU_LABELS)
    gpu = snapshot.gpus[1]
    assert labels == {
        "gpu": "1", "UUID": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "device": "nvidia1",
        "modelName": gpu.model_name, "Hostname": "node-7", "DCGM_FI_DRIVER_VERSION": gpu.driver_version,
    }  # fmt: skip
    assert gpu.pci_bus_id
    assert gpu.driver_version
    assert value == gpu.get("gpu_temp")


def test_missing_values_are_left_out_rather_than_exported_as_numbers() -> None:
    snapshot = _snapshot()
    assert math.isnan(snapshot.gpus[0].get("fan_speed"))
    assert "DCGM_FI_DEV_FAN_SPEED" not in _exposition(snapshot)


def test_every_present_gpu_value_is_exported_once() -> None:
    snapshot = _snapshot()
    families = _exposition(snapshot)
    gpu_samples = [s for samples in families.values() for s in samples if "gpu" in s[1]]
    present = sum(1 for g in snapshot.gpus for v in g.values if not math.isnan(v))
    assert len(gpu_samples) == present


def test_xid_counters_share_one_family_told_apart_by_code() -> None:
    snapshot = _snapshot()
    values = list(snapshot.gpus[0].values)
    values[index_of(Scope.GPU)["xid_79_events"]] = 2.0
    gpu0 = dataclasses.replace(snapshot.gpus[0], values=tuple(values))
    families = _exposition(dataclasses.replace(snapshot, gpus=(gpu0, snapshot.gpus[1])))
    xids = families["faultcast_xid_events"]
    assert {s[1]["xid"] for s in xids} >= {"48", "79", "119", "other"}
    (fell_off,) = [s for s in xids if s[1]["xid"] == "79" and s[1]["gpu"] == "0"]
    assert fell_off[0] == "faultcast_xid_events_total"
    assert fell_off[2] == 2.0


def test_network_series_carry_device_port_and_peer_labels() -> None:
    snapshot = _snapshot()
    port = DeviceReading(
        Scope.IB_PORT, "mlx5_9:1", tuple(float(i) for i in range(len(metrics_for(Scope.IB_PORT))))
    )
    families = _exposition(dataclasses.replace(snapshot, devices=(*snapshot.devices, port)))
    symbol = [s for s in families["faultcast_ib_symbol_error"] if s[1]["device"] == "mlx5_9"]
    assert symbol == [
        ("faultcast_ib_symbol_error_total", {"device": "mlx5_9", "port": "1", "Hostname": "node-7"}, 0.0)
    ]
    peers = {d.device for d in snapshot.devices if d.scope is Scope.PEER}
    assert {s[1]["peer"] for s in families["faultcast_peer_rtt_p50_seconds"]} == peers
    assert len(peers) == 2
    assert families["faultcast_tcp_retrans_segs"][0][1] == {"Hostname": "node-7"}


def test_a_lost_gpu_is_visible_as_such() -> None:
    snapshot = _snapshot()
    nan_values = tuple(math.nan for _ in metrics_for(Scope.GPU))
    lost_values = list(nan_values)
    lost_values[index_of(Scope.GPU)["gpu_lost"]] = 1.0
    lost = GpuReading(1, snapshot.gpus[1].uuid, snapshot.gpus[1].model_name, tuple(lost_values), lost=True)
    families = _exposition(dataclasses.replace(snapshot, gpus=(snapshot.gpus[0], lost)))
    assert {s[1]["gpu"]: s[2] for s in families["faultcast_gpu_lost"]} == {"0": 0.0, "1": 1.0}
    assert [s[1]["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"]] == ["0"]


def test_nothing_is_exported_before_the_first_scrape() -> None:
    assert _exposition(None) == {}
