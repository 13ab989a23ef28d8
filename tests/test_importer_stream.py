"""The streaming import: slices and spills that do not change a byte of the output, series
split across files, the JSON reader on any block size, what a real fleet exports (node_exporter's
InfiniBand and TCP series, dcgm-exporter's NVLink totals and GR_ENGINE_ACTIVE), what is not used
reported once, frozen exporters blanked, and memory that follows the slice, not the history."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from faultcast import cli
from faultcast.model.features.offline import open_dataset, unix_seconds
from faultcast.model.importers.export_reader import read_export
from faultcast.model.importers.prometheus import import_prometheus
from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate
from tests.test_import_score import DCGM_COLUMNS, gpu_export, merged, network_export, write_json

Response = dict[str, Any]
START = 1_767_571_200  # 2026-01-05T00:00:00Z, a multiple of every cadence used here

PARITY_WHY = "a dcgm-exporter default the collector exports for parity; the model has no column for it"


def answer(result: list[dict[str, Any]]) -> Response:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def series(
    name: str, values: list[float] | np.ndarray, every_s: float = 30.0, **labels: str
) -> dict[str, Any]:
    return {
        "metric": {"__name__": name, **labels},
        "values": [[START + every_s * i, repr(float(v))] for i, v in enumerate(values)],
    }


def gpu(
    name: str, values: list[float] | np.ndarray, gpu_index: int = 0, node: str = "a", **kw: Any
) -> dict[str, Any]:
    return series(name, values, gpu=str(gpu_index), UUID=f"GPU-{node}-{gpu_index}", Hostname=node, **kw)


def files(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    return (
        pq.read_table(out / "telemetry.parquet").to_pandas(),
        pq.read_table(out / "network.parquet").to_pandas(),
        (out / "failures.csv").read_text(),
    )


def rows(out: Path) -> pd.DataFrame:
    frame: pd.DataFrame = pq.read_table(out / "telemetry.parquet").to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    return frame


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(FleetConfig(nodes=2, gpus_per_node=2, days=0.25, seed=3, acceleration=0.0), out)
    return out


@pytest.fixture(scope="module")
def export(twin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The twin's GPU series at 30 s (dcgm-exporter names) and its network at 60 s, two ports."""
    folder = tmp_path_factory.mktemp("export")
    return write_json(
        folder / "export.json", merged(gpu_export(twin, DCGM_COLUMNS, 30.0), network_export(twin, 60.0, 2))
    )


# -- streaming changes nothing -----------------------------------------------------------------------


def test_slices_buckets_and_flushes_of_any_size_write_the_same_files(
    tmp_path: Path, twin: Path, export: Path
) -> None:
    whole = import_prometheus(export, twin / "failures.csv", tmp_path / "whole", chunk_steps=10**6)
    expected = files(tmp_path / "whole")
    assert whole["streaming"]["row_groups"] == 1
    sizes: list[tuple[int | None, float, int]] = [
        (7, 600.0, 1000),
        (97, 86_400.0, 10**9),
        (None, 3600.0, 2_000_000),
    ]
    for k, (chunk, bucket, flush) in enumerate(sizes):
        manifest = import_prometheus(
            export,
            twin / "failures.csv",
            tmp_path / f"run{k}",
            chunk_steps=chunk,
            bucket_s=bucket,
            flush_samples=flush,
        )
        kwargs = sizes[k]
        got = files(tmp_path / f"run{k}")
        assert got[0].equals(expected[0]), kwargs  # NaN equals NaN here
        assert got[1].equals(expected[1]), kwargs
        assert got[2] == expected[2]
        for key in ("rows", "mapped", "derived", "missing", "not_used", "frozen", "gpu_days"):
            assert manifest[key] == whole[key], key
    # Row groups in time order, each sorted: what replay reads.
    parquet = pq.ParquetFile(tmp_path / "run0" / "telemetry.parquet")
    assert parquet.num_row_groups > 10
    last = -1
    for group in range(parquet.num_row_groups):
        stamps = parquet.read_row_group(group, columns=["timestamp"]).column(0).to_numpy().astype(np.int64)
        assert stamps[0] > last
        assert (np.diff(stamps) >= 0).all()
        last = stamps[-1]


def test_a_series_split_across_files_by_time_imports_as_one(tmp_path: Path, twin: Path, export: Path) -> None:
    import_prometheus(export, twin / "failures.csv", tmp_path / "whole")
    document = json.loads(export.read_text())
    folder = tmp_path / "pieces"
    folder.mkdir()
    for piece in range(3):  # each series cut in three by time, one file each, in shuffled order
        part = copy.deepcopy(document)
        for s in part["data"]["result"]:
            n = len(s["values"])
            s["values"] = s["values"][piece * n // 3 : (piece + 1) * n // 3]
        part["data"]["result"] = [s for s in part["data"]["result"] if s["values"]][::-1]
        write_json(folder / f"{2 - piece}.json", part)
    manifest = import_prometheus(folder, twin / "failures.csv", tmp_path / "split", chunk_steps=50)
    assert len(manifest["source"]["responses"]) == 3
    got, expected = files(tmp_path / "split"), files(tmp_path / "whole")
    assert got[0].equals(expected[0])
    assert got[1].equals(expected[1])
    assert got[2] == expected[2]


def test_the_later_of_two_samples_at_the_same_time_wins_as_before(tmp_path: Path) -> None:
    first = gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42])
    second = gpu("DCGM_FI_DEV_GPU_TEMP", [50, 51, 52])
    folder = tmp_path / "two"
    folder.mkdir()
    write_json(folder / "a.json", answer([first]))
    write_json(folder / "b.json", answer([second]))
    import_prometheus(folder, None, tmp_path / "out")
    assert rows(tmp_path / "out")["gpu_temp"].tolist() == [50, 51, 52]


@pytest.mark.parametrize("indent", [None, 1])
def test_the_json_reader_gives_what_json_loads_gives_on_any_block_size(
    tmp_path: Path, indent: int | None
) -> None:
    long = gpu("DCGM_FI_DEV_POWER_USAGE", np.linspace(100, 400, 700))  # parsed in bulk
    short = gpu("DCGM_FI_DEV_GPU_TEMP", [40, float("nan")], gpu_index=1)
    short["values"][1][1] = "NaN"
    values_first = {"values": long["values"][:300], "metric": {**long["metric"], "gpu": "2"}}
    document = [answer([long, short]), answer([values_first])]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(document, indent=indent))
    for block in (5, 64, 4096, 1 << 22):
        responses: list[str] = []
        got = list(read_export(path, lambda labels: True, responses, block_chars=block))
        assert responses == [f"{path}[0]", f"{path}[1]"]
        assert [s.labels for s in got] == [long["metric"], short["metric"], values_first["metric"]]
        for s, original in zip(got, [long, short, values_first], strict=True):
            expected = np.array([[float(t), float(v)] for t, v in original["values"]])
            if s.samples is not None:
                pairs = np.column_stack(s.samples)
            else:
                pairs = np.array([[float(t), float(v)] for t, v in s.raw_values])
            np.testing.assert_array_equal(pairs, expected)


def test_a_truncated_or_trailing_export_is_not_json(tmp_path: Path) -> None:
    text = json.dumps(answer([gpu("DCGM_FI_DEV_GPU_TEMP", np.arange(400.0))]))
    for name, broken in (("cut", text[: len(text) // 2]), ("tail", text + " {}")):
        (tmp_path / f"{name}.json").write_text(broken)
        with pytest.raises(Exception, match="not JSON"):
            import_prometheus(tmp_path / f"{name}.json", None, tmp_path / name)
        assert not (tmp_path / name).exists()


# -- what a real fleet exports ----------------------------------------------------------------------


def test_nvlink_totals_of_either_vocabulary_are_the_catalogue_sums(tmp_path: Path) -> None:
    export = answer([
        gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42]),
        gpu("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", [0, 2, 5]),
        gpu("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", [1, 1, 1]),
        gpu("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", [0, 0, 3]),
        gpu("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", [0, 0, 0]),
        gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42], gpu_index=1),
        gpu("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", [7, 8, 9], gpu_index=1),  # DCGM 4.6's name
    ])  # fmt: skip
    manifest = import_prometheus(write_json(tmp_path / "e.json", export), None, tmp_path / "out")
    frame = rows(tmp_path / "out")
    assert frame.query("gpu == 0")["nvlink_crc_flit_errors"].tolist() == [0, 2, 5]
    assert frame.query("gpu == 0")["nvlink_replay_errors"].tolist() == [0, 0, 3]
    assert frame.query("gpu == 1")["nvlink_crc_flit_errors"].tolist() == [7, 8, 9]
    assert manifest["mapped"]["nvlink_crc_flit_errors"] == {
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 1,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": 1,
    }
    assert manifest["not_used"] == {}


def test_node_exporter_infiniband_tcp_and_interfaces_roll_up_per_node(tmp_path: Path) -> None:
    def node(name: str, values: list[float], **labels: str) -> dict[str, Any]:
        return series(name, values, 30.0, instance="a:9100", job="node", **labels)

    def ports(name: str, first: list[float], second: list[float]) -> list[dict[str, Any]]:
        return [
            node(f"node_infiniband_{name}", first, device="mlx5_0", port="1"),
            node(f"node_infiniband_{name}", second, device="mlx5_1", port="1"),
        ]

    zeros = [0.0, 0.0, 0.0]
    export = answer([
        gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42]),
        *ports("symbol_error_total", [0, 1, 2], [10, 10, 10]),
        *ports("link_error_recovery_total", [0, 0, 1], zeros),
        *ports("link_downed_total", zeros, zeros),
        *ports("port_errors_received_total", [3, 3, 4], zeros),
        *ports("port_discards_transmitted_total", [0, 5, 5], zeros),
        *ports("local_ack_timeout_errors_total", [0, 0, 9], zeros),
        *ports("state_id", [4, 4, 1], [4, 4, 4]),
        *ports("rate_bytes_per_second", [5e10] * 3, [5e10] * 3),
        node("node_infiniband_vl15_dropped_total", zeros, device="mlx5_0", port="1"),
        node("node_netstat_Tcp_RetransSegs", [100, 130, 190]),
        node("node_network_receive_bytes_total", [9, 9, 9], device="lo"),
        node("node_network_receive_bytes_total", [5, 5, 5], device="docker0"),
        node("node_network_receive_bytes_total", [1e6, 2e6, 3e6], device="eth0"),
        node("node_load1", [0.5, 0.7, 0.6]),
    ])  # fmt: skip
    manifest = import_prometheus(write_json(tmp_path / "e.json", export), None, tmp_path / "out")
    net = pq.read_table(tmp_path / "out" / "network.parquet").to_pandas()
    assert net["node"].astype(str).tolist() == ["a"] * 3  # one node: dcgm's Hostname and node's instance
    assert net["ib_symbol_error"].tolist() == [10, 11, 12]  # summed over ports
    assert net["ib_link_error_recovery"].tolist() == [0, 0, 1]
    assert net["ib_port_rcv_errors"].tolist() == [3, 3, 4]
    assert net["ib_port_xmit_discards"].tolist() == [0, 5, 5]
    assert net["ib_local_ack_timeout_err"].tolist() == [0, 0, 9]
    assert net["ib_port_state"].tolist() == [4, 4, 1]  # the worst port
    assert net["ib_port_rate_gbps"].tolist() == [400.0] * 3  # 5e10 bytes/s
    assert net["tcp_retrans_segs"].tolist() == [100, 130, 190]
    assert net["net_rx_bytes"].tolist() == [1e6, 2e6, 3e6]  # eth0: the loopback and docker0 left out
    assert manifest["units_converted"]["node_infiniband_rate_bytes_per_second"] == "x 8e-09 (bytes/s -> Gb/s)"
    assert manifest["not_used"]["node_infiniband_vl15_dropped_total"]["series"] == 1
    assert "InfiniBand" in manifest["not_used"]["node_infiniband_vl15_dropped_total"]["why"]
    assert manifest["not_used"]["node_load1"]["series"] == 1
    skipped = [k for k in manifest["not_used"] if "virtual interface" in k]
    assert len(skipped) == 1
    assert manifest["not_used"][skipped[0]]["series"] == 2
    assert manifest["nodes_without_gpus"] == []


def test_gr_engine_active_stands_in_for_gpu_util_only_where_it_is_missing(tmp_path: Path) -> None:
    export = answer([
        gpu("DCGM_FI_DEV_GPU_UTIL", [90, 95, 99], gpu_index=0),
        gpu("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [0.5, 0.5, 0.5], gpu_index=0),
        gpu("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [0.25, 0.5, 0.875], gpu_index=1),
        gpu("DCGM_FI_PROF_GR_ENGINE_ACTIVE", [0.0, 1.0, 1.0], gpu_index=2),
        gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", [0.1, 0.2, 0.3], gpu_index=0),
        gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", [0.1, 0.2, 0.3], gpu_index=1),
    ])  # fmt: skip
    manifest = import_prometheus(write_json(tmp_path / "e.json", export), None, tmp_path / "out")
    frame = rows(tmp_path / "out")
    assert frame.query("gpu == 0")["gpu_util"].tolist() == [90, 95, 99]  # its own, not GR's 50
    assert frame.query("gpu == 1")["gpu_util"].tolist() == [25, 50, 87.5]
    assert frame.query("gpu == 2")["gpu_util"].tolist() == [0, 100, 100]
    assert manifest["mapped"]["gpu_util"] == {"DCGM_FI_DEV_GPU_UTIL": 1, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 2}
    assert (
        "on the 2 GPUs without DCGM_FI_DEV_GPU_UTIL"
        in manifest["units_converted"]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    )
    assert manifest["not_used"]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]["series"] == 1
    assert "imported but unused" in manifest["not_used"]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]["why"]
    assert manifest["not_used"]["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == {
        "series": 2, "why": PARITY_WHY,
    }  # fmt: skip


def test_what_is_not_used_is_said_once_with_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = [gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42], gpu_index=g) for g in range(4)]
    result += [gpu("DCGM_FI_DEV_FB_RESERVED", [1, 1, 1], gpu_index=g) for g in range(4)]
    result += [series("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42], Hostname="a")]  # no gpu label
    result += [series("faultcast_gpus_present", [4, 4, 4], Hostname="a")]
    path = write_json(tmp_path / "e.json", answer(result))
    assert cli.main(["import-prometheus", "--export", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "not used: 6 series of 3 names:" in printed
    assert printed.count("DCGM_FI_DEV_FB_RESERVED") == 1
    assert f"  DCGM_FI_DEV_FB_RESERVED (4): {PARITY_WHY}" in printed
    assert "(series skipped: GPU metric without a gpu label) (1)" in printed
    assert "faultcast_gpus_present (1): the collector's own health" in printed
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert next(iter(manifest["not_used"].values())) == {
        "series": 4, "why": PARITY_WHY,
    }  # fmt: skip


# -- frozen exporters ------------------------------------------------------------------------------


def _fleet(steps: int, frozen: tuple[int, int], every_s: float = 30.0) -> Response:
    """Node a: GPU 0 works (power noise), GPU 1's exporter freezes over steps [lo, hi), GPU 2 idles:
    its clocks, utilisation and power (rounded) hold still, its temperature creeps by a degree now and
    then (every 40 minutes). Node b: one GPU that works."""
    rng = np.random.default_rng(7)
    lo, hi = frozen
    creep = 40 * 60 // int(every_s)
    out = []
    for node, gpus in (("a", 3), ("b", 1)):
        for g in range(gpus):
            temp = 60 + np.cumsum(rng.integers(-1, 2, steps)).astype(float)
            power = np.round(300 + 40 * rng.random(steps), 3)
            clock = np.full(steps, 1980.0)
            energy = np.cumsum(np.full(steps, 9e6))
            if node == "a" and g == 1:
                temp[lo:hi], power[lo:hi], energy[lo:hi] = temp[lo], power[lo], energy[lo]
            if node == "a" and g == 2:
                temp = 30 + (np.arange(steps) // creep) % 2
                power, clock = np.full(steps, 61.0), np.full(steps, 210.0)
            for name, values in (("DCGM_FI_DEV_GPU_TEMP", temp), ("DCGM_FI_DEV_POWER_USAGE", power),
                                 ("DCGM_FI_DEV_SM_CLOCK", clock),
                                 ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", energy)):  # fmt: skip
                out.append(series(name, values, every_s, gpu=str(g), Hostname=node, UUID=f"{node}{g}"))
    return answer(out)


@pytest.mark.parametrize("chunk_steps", [None, 13])
def test_a_frozen_exporter_is_blanked_and_counted_and_an_idle_gpu_is_not(
    tmp_path: Path, chunk_steps: int | None
) -> None:
    steps, lo, hi = 600, 100, 400  # 2.5 h frozen of 5 h, at 30 s
    path = write_json(tmp_path / "e.json", _fleet(steps, (lo, hi)))
    manifest = import_prometheus(path, None, tmp_path / "out", chunk_steps=chunk_steps)
    frame = rows(tmp_path / "out")
    frozen = frame.query("node == 'a' and gpu == 1")
    step = ((frozen["time_s"] - START) // 30).astype(int)
    assert step.tolist() == [*range(lo + 1), *range(hi, steps)]  # the first frozen step is a reading
    assert manifest["frozen"]["samples_blanked"] == hi - lo - 1
    assert manifest["frozen"]["by_node"] == {
        "a": {"gpus": 1, "spans": 1, "samples_blanked": hi - lo - 1, "hours": (hi - lo - 1) * 30 / 3600},
    }  # fmt: skip
    for node, g in (("a", 0), ("a", 2), ("b", 0)):  # working, idle (a degree every 40 min), working
        assert len(frame.query(f"node == '{node}' and gpu == {g}")) == steps
    kept = import_prometheus(path, None, tmp_path / "kept", frozen_after_s=0)
    assert kept["frozen"]["samples_blanked"] == 0
    assert len(rows(tmp_path / "kept")) == 4 * steps


def test_a_span_shorter_than_the_threshold_is_kept(tmp_path: Path) -> None:
    path = write_json(tmp_path / "e.json", _fleet(400, (100, 200)))  # 50 minutes
    manifest = import_prometheus(path, None, tmp_path / "out", chunk_steps=17)
    assert manifest["frozen"]["samples_blanked"] == 0
    # At 30 minutes the 50-minute span goes, and so does the idle GPU that warms a degree every 40
    # minutes: why the default is an hour.
    shorter = import_prometheus(path, None, tmp_path / "short", frozen_after_s=1800, chunk_steps=17)
    frame = rows(tmp_path / "short")
    assert len(frame.query("node == 'a' and gpu == 1")) == 400 - 99
    assert len(frame.query("node == 'a' and gpu == 0")) == len(frame.query("node == 'b'")) == 400
    assert shorter["frozen"]["by_node"]["a"]["gpus"] == 2


# -- memory follows the slice ----------------------------------------------------------------------


def test_the_grid_held_at_once_follows_the_slice_not_the_history(tmp_path: Path) -> None:
    """Four times the history: as many slices more, no bigger a slice, and no more samples read back
    from the spill at once (the buckets of one slice); a dense grid would hold it all."""
    held: dict[int, list[int]] = {}
    streaming: dict[int, dict[str, int]] = {}
    for days in (1, 4):
        steps = days * 2880
        path = write_json(tmp_path / f"{days}.json", _fleet(steps, (10, 20)))
        held[days] = []
        manifest = import_prometheus(
            path, None, tmp_path / f"out{days}", chunk_steps=240, bucket_s=3600.0, observe=held[days].append
        )
        assert manifest["rows"]["telemetry"] == 4 * steps
        stream = manifest["streaming"]
        assert max(held[days]) == stream["largest_chunk_rows"] <= (240 + 121) * 4  # slice + lookahead
        assert len(held[days]) == -(-steps // 240)
        streaming[days] = stream
    assert streaming[4]["largest_read_samples"] <= streaming[1]["largest_read_samples"]
    assert streaming[4]["spill_bytes"] >= 3.9 * streaming[1]["spill_bytes"]
    assert max(held[4]) == max(held[1])
    assert sum(held[4]) > 3.5 * sum(held[1])


def test_a_dataset_of_four_gpu_nodes_opens_with_its_own_size(tmp_path: Path) -> None:
    result = [gpu("DCGM_FI_DEV_GPU_TEMP", [40, 41, 42], gpu_index=g) for g in range(4)]
    import_prometheus(write_json(tmp_path / "e.json", answer(result)), None, tmp_path / "out")
    assert open_dataset(tmp_path / "out").gpus_per_node == 4
