"""`faultcast import-prometheus` and `faultcast score`, end to end on twin data.

The Prometheus exports are built here from the twin's own files (dcgm-exporter names and labels,
at another cadence than the twin's), so every imported value can be checked against the original.
"""

from __future__ import annotations

import copy
import csv
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from faultcast import cli
from faultcast.catalogue import METRICS, Scope, by_name, metrics_for
from faultcast.dcgm import Vocabulary, names
from faultcast.model.artifact import load
from faultcast.model.evaluation.batch_alerts import CSV_FIELDS, ScoredAlert, score
from faultcast.model.evaluation.evaluate import WARMUP_S
from faultcast.model.evaluation.outcomes import Outcome
from faultcast.model.features.offline import DataError, open_dataset, unix_seconds
from faultcast.model.importers.prometheus import import_prometheus
from faultcast.model.training.train import TrainConfig, train
from faultcast.modes import NODE_LEVEL_MODES
from faultcast.rollup import NETWORK_COLUMNS
from faultcast.schemas import FAILURE_FIELDS, NETWORK_SCHEMA, TELEMETRY_SCHEMA
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate

H = 3600.0
DCGM_COLUMNS = [m.name for m in metrics_for(Scope.GPU) if m.dcgm is not None]

Response = dict[str, Any]


# -- building exports from twin files ---------------------------------------------------------


def _labels(metric_name: str, extra: dict[str, str]) -> dict[str, str]:
    metric = by_name(metric_name)
    labels = {"__name__": metric.prometheus_name, **extra}
    if metric.family_label is not None:
        labels[metric.family_label[0]] = metric.family_label[1]
    return labels


def _samples(times: np.ndarray, values: np.ndarray, every_s: float, base_s: float) -> list[list[Any]]:
    """[t, "v"] pairs at `every_s`: the twin's samples repeated (finer) or subsampled (coarser)."""
    keep = np.isfinite(values)  # the exporter leaves missing values out
    times, values = times[keep], values[keep].astype(np.float64)
    if every_s < base_s:
        copies = round(base_s / every_s)
        return [
            [t + k * every_s, repr(float(v))]
            for t, v in zip(times, values, strict=True)
            for k in range(copies)
        ]
    on = np.isclose(np.mod(times - times.min(initial=0.0), every_s), 0.0) if len(times) else keep[:0]
    return [[float(t), repr(float(v))] for t, v in zip(times[on], values[on], strict=True)]


def gpu_export(twin: Path, columns: Sequence[str], every_s: float) -> Response:
    """A range-query answer with one series per GPU and column, dcgm-exporter's labels."""
    frame = pq.read_table(twin / "telemetry.parquet").to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    result = []
    for (node, gpu, uuid, model), rows in frame.groupby(["node", "gpu", "uuid", "model"], observed=True):
        extra = {"gpu": str(gpu), "UUID": str(uuid), "device": f"nvidia{gpu}", "modelName": str(model),
                 "Hostname": str(node), "instance": f"{node}:9400", "job": "dcgm"}  # fmt: skip
        times = rows["time_s"].to_numpy()
        for column in columns:
            values = _samples(times, rows[column].to_numpy(np.float64), every_s, 60.0)
            if values:
                result.append({"metric": _labels(column, extra), "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def network_export(twin: Path, every_s: float, ib_ports: int = 1) -> Response:
    """Network series from the twin's per-node rows: one device each, or the IB counters split over
    `ib_ports` ports (the first port carries the value, the others a constant 7)."""
    frame = pq.read_table(twin / "network.parquet").to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    result = []
    for node, rows in frame.groupby("node", observed=True):
        times = rows["time_s"].to_numpy()
        for column in NETWORK_COLUMNS:
            metric = by_name(column)
            devices: list[tuple[dict[str, str], np.ndarray]] = []
            values = rows[column].to_numpy(np.float64)
            if metric.scope is Scope.IB_PORT:
                devices = [({"device": "mlx5_0", "port": "1"}, values)]
                devices += [
                    ({"device": f"mlx5_{p}", "port": "1"}, np.full_like(values, 7.0))
                    for p in range(1, ib_ports)
                ]
            elif metric.scope is Scope.INTERFACE:
                devices = [({"device": "eth0"}, values)]
            elif metric.scope is Scope.PEER:
                devices = [({"peer": "node-peer"}, values)]
            else:
                devices = [({}, values)]
            for labels, series in devices:
                samples = _samples(times, series, every_s, 60.0)
                if samples:
                    result.append(
                        {"metric": _labels(column, {**labels, "Hostname": str(node)}), "values": samples}
                    )
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def merged(*responses: Response) -> Response:
    out = copy.deepcopy(responses[0])
    for r in responses[1:]:
        out["data"]["result"] += copy.deepcopy(r["data"]["result"])
    return out


def write_json(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def telemetry(out: Path) -> pd.DataFrame:
    frame: pd.DataFrame = pq.read_table(out / "telemetry.parquet").to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    for name in ("node", "uuid", "model"):
        frame[name] = frame[name].astype(str)
    return frame


def same(a: pd.Series | np.ndarray, b: pd.Series | np.ndarray) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True))


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 nodes x 2 GPUs x 7.2 h at 60 s, with a GPU failure and a node failure on cue."""
    out = tmp_path_factory.mktemp("twin")
    scenarios = [Scenario("hbm_wear", 0, 1, 4 * H, strength=2.0), Scenario("infiniband", 1, None, 5 * H)]
    simulate(FleetConfig(nodes=2, gpus_per_node=2, days=0.3, seed=5, acceleration=0.0), out, scenarios)
    return out


@pytest.fixture(scope="module")
def export_60s(twin: Path) -> Response:
    return gpu_export(twin, DCGM_COLUMNS, 60.0)


def _import(
    tmp_path: Path, export: object, failures: Path | None, **kwargs: Any
) -> tuple[Path, dict[str, Any]]:
    source = write_json(tmp_path / "export.json", export)
    out = tmp_path / "data"
    return out, import_prometheus(source, failures, out, **kwargs)


# -- import -------------------------------------------------------------------------------------


def test_a_finer_cadence_is_kept_and_values_match_the_originals(tmp_path: Path, twin: Path) -> None:
    out, manifest = _import(tmp_path, gpu_export(twin, DCGM_COLUMNS, 15.0), twin / "failures.csv")
    original, imported = telemetry(twin), telemetry(out)
    assert manifest["kind"] == "prometheus import"
    assert manifest["config"]["cadence_s"] == 15.0
    assert manifest["config"]["gpus_per_node"] == 2
    assert manifest["nodes"] == sorted(original["node"].unique())
    assert pq.read_schema(out / "telemetry.parquet").equals(TELEMETRY_SCHEMA)
    assert imported["time_s"].is_monotonic_increasing
    assert set(np.mod(imported["time_s"] - manifest["config"]["start_unix_s"], 15.0)) == {0.0}
    # Each twin minute is four grid steps of the same values.
    assert len(imported) == 4 * len(original)
    keys = ["time_s", "node", "gpu"]
    joined = original.merge(imported, on=keys, suffixes=("", "_imported"))
    assert len(joined) == len(original)
    for column in DCGM_COLUMNS:
        assert same(joined[column], joined[f"{column}_imported"]), column
    assert (joined["uuid"] == joined["uuid_imported"]).all()
    assert (joined["model"] == joined["model_imported"]).all()
    later = imported.assign(time_s=imported["time_s"] - 45.0).merge(
        original, on=keys, suffixes=("_imported", "")
    )
    assert same(later["gpu_temp_imported"], later["gpu_temp"])
    dataset = open_dataset(out)
    assert dataset.cadence_s == 15.0
    assert dataset.nodes == tuple(manifest["nodes"])
    assert dataset.end_s >= imported["time_s"].max()
    exported = [c for c in DCGM_COLUMNS if original[c].notna().any()]  # the exporter leaves NaN out
    assert sorted(manifest["mapped"]) == sorted(exported)
    assert "pcie_tx_bytes_per_second" in manifest["missing"]["telemetry"]  # no dcgm name


def test_a_coarser_cadence_and_an_explicit_interval_take_the_last_sample(tmp_path: Path, twin: Path) -> None:
    export = gpu_export(twin, ["gpu_temp", "power_usage", "ecc_sbe_volatile"], 120.0)
    out, manifest = _import(tmp_path, export, twin / "failures.csv")
    assert manifest["config"]["cadence_s"] == 120.0
    original, imported = telemetry(twin), telemetry(out)
    joined = imported.merge(original, on=["time_s", "node", "gpu"], suffixes=("_imported", ""))
    assert (
        len(joined)
        == len(imported)
        == len(original[np.mod(original["time_s"] - original["time_s"].min(), 120) == 0])
    )
    assert same(joined["ecc_sbe_volatile_imported"], joined["ecc_sbe_volatile"])

    coarse = tmp_path / "coarse"
    manifest = import_prometheus(tmp_path / "export.json", twin / "failures.csv", coarse, cadence_s=300.0)
    start = manifest["config"]["start_unix_s"]
    assert start % 300 == 0
    sampled = original[np.mod(original["time_s"] - original["time_s"].min(), 120) == 0]
    sampled = sampled.assign(step=((sampled["time_s"] - start) // 300).astype(int))
    expected = sampled.sort_values("time_s").groupby(["step", "node", "gpu"]).last().reset_index()
    got = telemetry(coarse).assign(step=lambda f: ((f["time_s"] - start) // 300).astype(int))
    check = got.merge(expected, on=["step", "node", "gpu"], suffixes=("", "_expected"))
    assert len(check) == len(got) == len(expected)
    assert same(check["power_usage"], check["power_usage_expected"])
    assert (check["time_s_expected"] > check["time_s"]).any()  # the last sample of the step, not the first


def test_nan_and_inf_values_become_missing(tmp_path: Path, twin: Path, export_60s: Response) -> None:
    export = copy.deepcopy(export_60s)
    series = {
        (s["metric"]["__name__"], s["metric"]["Hostname"], s["metric"]["gpu"]): s
        for s in export["data"]["result"]
    }
    temp = series[("DCGM_FI_DEV_GPU_TEMP", "node-0000", "0")]["values"]
    power = series[("DCGM_FI_DEV_POWER_USAGE", "node-0000", "0")]["values"]
    temp[3][1], temp[4][1], power[5][1] = "NaN", "+Inf", "-Inf"
    out, manifest = _import(tmp_path, export, twin / "failures.csv")
    assert manifest["samples_not_finite"] == 3
    rows = telemetry(out).query("node == 'node-0000' and gpu == 0").set_index("time_s")
    assert np.isnan(rows.loc[[temp[3][0], temp[4][0]], "gpu_temp"]).all()
    assert np.isfinite(rows.loc[[temp[3][0], temp[4][0]], "power_usage"]).all()  # the rest of the row stays
    assert np.isnan(rows.loc[power[5][0], "power_usage"])
    assert rows.loc[temp[2][0], "gpu_temp"] == float(temp[2][1])


def test_unknown_metrics_are_counted_not_fatal(tmp_path: Path, twin: Path, export_60s: Response) -> None:
    export = copy.deepcopy(export_60s)
    base = export["data"]["result"][0]
    extras = [
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {"gpu": "0"}),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {"gpu": "1"}),
        ("node_load1", {}),
        ("faultcast_xid_events_total", {"xid": "999"}),
        ("faultcast_gpus_present", {}),
    ]
    for name, extra in extras:
        labels = {**base["metric"], **extra, "__name__": name}
        export["data"]["result"].append({"metric": labels, "values": base["values"][:5]})
    _, manifest = _import(tmp_path, export, twin / "failures.csv")
    assert manifest["unknown_metrics"] == {
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 2, "node_load1": 1, 'faultcast_xid_events_total{xid="999"}': 1,
    }  # fmt: skip
    assert manifest["ignored_metrics"] == {"faultcast_gpus_present": 1}  # the collector's own health
    assert manifest["rows"]["telemetry"] == len(telemetry(twin))


def test_a_list_of_responses_and_a_directory_give_the_same_data(
    tmp_path: Path, twin: Path, export_60s: Response
) -> None:
    whole, _ = _import(tmp_path, export_60s, twin / "failures.csv")
    result = export_60s["data"]["result"]
    halves = [{"status": "success", "data": {"resultType": "matrix", "result": part}}
              for part in (result[::2], result[1::2])]  # fmt: skip
    listed = write_json(tmp_path / "list.json", halves)
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, half in enumerate(halves):
        write_json(folder / f"query-{i}.json", half)
    expected = pq.read_table(whole / "telemetry.parquet").to_pandas()
    for source, out in ((listed, tmp_path / "from-list"), (folder, tmp_path / "from-folder")):
        manifest = import_prometheus(source, twin / "failures.csv", out)
        assert len(manifest["source"]["responses"]) == 2
        assert pq.read_table(out / "telemetry.parquet").to_pandas().equals(expected)  # NaN equals NaN here


def test_network_series_are_rolled_up_per_node(tmp_path: Path, twin: Path, export_60s: Response) -> None:
    out, manifest = _import(
        tmp_path, merged(export_60s, network_export(twin, 60.0, ib_ports=2)), twin / "failures.csv"
    )
    assert pq.read_schema(out / "network.parquet").equals(NETWORK_SCHEMA)
    original = pq.read_table(twin / "network.parquet").to_pandas()
    imported = pq.read_table(out / "network.parquet").to_pandas()
    joined = original.merge(imported, on=["timestamp", "node"], suffixes=("", "_imported"))
    assert len(joined) == len(original) == manifest["rows"]["network"]
    # Port counters add up, a port's state takes the worst port; the rest come through unchanged.
    assert same(joined["ib_symbol_error_imported"], joined["ib_symbol_error"] + 7.0)
    assert same(joined["ib_port_state_imported"], np.minimum(joined["ib_port_state"], 7.0))
    assert same(joined["tcp_retrans_segs_imported"], joined["tcp_retrans_segs"])
    assert same(joined["peer_rtt_p99_seconds_imported"], joined["peer_rtt_p99_seconds"])
    assert manifest["missing"]["network"] == []

    (tmp_path / "gpu-only").mkdir()
    gpu_only, _ = _import(tmp_path / "gpu-only", export_60s, twin / "failures.csv")
    empty = pq.read_table(gpu_only / "network.parquet")
    assert empty.num_rows == 0
    assert empty.schema.equals(NETWORK_SCHEMA)


def test_a_plain_dcgm_exporter_yields_throttle_flags_and_xid_counts(tmp_path: Path) -> None:
    start = 1_767_571_200
    reasons = [0, 0x08, 0x48, 0x20, 0x84, 0, 0]
    xids = [13, 13, 48, 48, 63, 0, 48]  # the first is history; each change to a new code is an event
    labels = {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "a"}

    def series(name: str, values: Iterable[float]) -> dict[str, Any]:
        return {
            "metric": {"__name__": name, **labels},
            "values": [[start + 30 * i, str(v)] for i, v in enumerate(values)],
        }

    export = {"status": "success", "data": {"resultType": "matrix", "result": [
        series("DCGM_FI_DEV_GPU_TEMP", range(40, 47)), series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", reasons),
        series("DCGM_FI_DEV_XID_ERRORS", xids)]}}  # fmt: skip
    out, manifest = _import(tmp_path, export, None)
    rows = telemetry(out)
    assert manifest["config"]["cadence_s"] == 30.0
    assert rows["throttle_hw_slowdown"].tolist() == [0, 1, 1, 0, 0, 0, 0]
    assert rows["throttle_hw_thermal"].tolist() == [0, 0, 1, 0, 0, 0, 0]
    assert rows["throttle_sw_thermal"].tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert rows["throttle_hw_power_brake"].tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert rows["throttle_sw_power_cap"].tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert rows["xid_48_events"].tolist() == [0, 0, 1, 1, 1, 1, 2]
    assert rows["xid_63_events"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert rows["xid_13_events"].tolist() == [0] * 7
    assert "throttle_hw_slowdown" in manifest["derived"]
    assert "xid_48_events" in manifest["derived"]
    assert manifest["failure_log"] is False
    assert manifest["rows"]["failures"] == 0
    assert open_dataset(out).gpus_per_node == 1


def _canonical(export: Response) -> Response:
    """The export as a dcgm-exporter configured with DCGM 4.6's canonical field names would give it:
    renamed series in base units, and the node in a lowercase `hostname` label."""
    renamed = {n.name: n for n in names(Vocabulary.CLASSIC).values()}
    canonical = names(Vocabulary.CANONICAL)
    out = copy.deepcopy(export)
    for series in out["data"]["result"]:
        labels = series["metric"]
        labels["hostname"] = labels.pop("Hostname")
        classic = renamed.get(labels["__name__"])
        if classic is None:
            continue
        new = canonical[classic.metric]
        labels["__name__"] = new.name
        series["values"] = [[t, repr(float(v) * new.scale)] for t, v in series["values"]]
    return out


def test_the_canonical_dcgm_vocabulary_imports_to_the_same_data(
    tmp_path: Path, twin: Path, export_60s: Response
) -> None:
    canonical = _canonical(export_60s)
    names_seen = {s["metric"]["__name__"] for s in canonical["data"]["result"]}
    assert {"DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
            "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_GPU_UTIL_RATIO"} <= names_seen  # fmt: skip
    assert not {n for n in names_seen if n in {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK"}}
    (tmp_path / "classic").mkdir()
    (tmp_path / "canonical").mkdir()
    classic_out, classic_manifest = _import(tmp_path / "classic", export_60s, twin / "failures.csv")
    canonical_out, manifest = _import(tmp_path / "canonical", canonical, twin / "failures.csv")
    expected, got = telemetry(classic_out), telemetry(canonical_out)
    assert len(got) == len(expected)
    assert manifest["nodes"] == classic_manifest["nodes"]
    assert sorted(manifest["mapped"]) == sorted(classic_manifest["mapped"])
    for column in DCGM_COLUMNS:  # hertz, joules and ratios back in the catalogue's units
        np.testing.assert_allclose(got[column], expected[column], rtol=1e-12, err_msg=column)
    assert manifest["mapped"]["sm_clock"] == {"DCGM_FI_DEV_SM_CLOCK_HERTZ": 4}
    assert manifest["units_converted"]["DCGM_FI_DEV_SM_CLOCK_HERTZ"] == "x 1e-06 (hertz -> megahertz)"
    assert (
        manifest["units_converted"]["DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"] == "x 1000 (joules -> millijoules)"
    )
    assert manifest["units_converted"]["DCGM_FI_DEV_GPU_UTIL_RATIO"] == "x 100 (ratio -> percent)"
    assert "units_converted" not in classic_manifest or classic_manifest["units_converted"] == {}


def test_gpu_util_ratio_is_read_as_the_percent_dcgm_4_6_wrote_under_that_name(tmp_path: Path) -> None:
    def export(values: list[float]) -> Response:
        labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu": "0", "hostname": "a"}
        return _with([{"metric": labels, "values": [[60 * (i + 1), str(v)] for i, v in enumerate(values)]}])

    (tmp_path / "ratio").mkdir()
    (tmp_path / "percent").mkdir()
    ratio_out, _ = _import(tmp_path / "ratio", export([0.25, 0.97, 1.0]), None)
    percent_out, manifest = _import(tmp_path / "percent", export([0.5, 97.0, 100.0]), None)
    assert telemetry(ratio_out)["gpu_util"].tolist() == [25.0, 97.0, 100.0]
    assert telemetry(percent_out)["gpu_util"].tolist() == [0.5, 97.0, 100.0]  # field 203's percent kept
    assert "percent already" in manifest["units_converted"]["DCGM_FI_DEV_GPU_UTIL_RATIO"]


def test_the_node_comes_from_hostname_else_instance_or_a_chosen_label(tmp_path: Path) -> None:
    def series(**labels: str) -> dict[str, Any]:
        return {
            "metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", **labels},
            "values": [[60, "40"], [120, "41"]],
        }

    export = _with([series(Hostname="a", instance="x:9400"), series(instance="10.0.0.5:9400"),
                    series(instance="[fd00::1]:9400", kubernetes_node="c"), series(job="dcgm"),
                    series(hostname="b", instance="y:9400")])  # fmt: skip
    _, manifest = _import(tmp_path, export, None)
    assert manifest["nodes"] == ["10.0.0.5", "a", "b", "fd00::1"]  # hostname: dcgm-exporter after 4.8.2
    assert manifest["skipped_series"] == {"no node label (Hostname or hostname or instance)": 1}
    chosen = import_prometheus(
        tmp_path / "export.json", None, tmp_path / "chosen", node_labels=("kubernetes_node", "Hostname")
    )
    assert chosen["nodes"] == ["a", "c"]


def test_the_failure_log_is_validated_and_normalised(
    tmp_path: Path, twin: Path, export_60s: Response
) -> None:
    original = list(csv.DictReader((twin / "failures.csv").open()))
    assert {row["gpu"] for row in original} >= {"", "1"}  # a node-level and a GPU failure
    log = tmp_path / "ops-log.csv"
    with log.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["mode", "node", "timestamp", "gpu", "note"])
        for i, row in enumerate(reversed(original)):
            moment = pd.Timestamp(row["timestamp"])
            when = str(moment.timestamp()) if i % 2 else moment.tz_localize(None).isoformat(sep=" ")
            writer.writerow([row["mode"], row["node"], when, row["gpu"], "from the ticket system"])
    out, manifest = _import(tmp_path, export_60s, log)
    with (out / "failures.csv").open() as handle:
        assert next(csv.reader(handle)) == list(FAILURE_FIELDS)
    written = list(csv.DictReader((out / "failures.csv").open()))
    for field in ("timestamp", "node", "gpu", "mode", "uuid"):  # the UUID comes from the telemetry
        assert [r[field] for r in written] == [r[field] for r in original], field
    assert manifest["failure_counts"] == {
        m: sum(r["mode"] == m for r in original) for m in {r["mode"] for r in original}
    }
    assert manifest["failures_outside_data"] == 0
    assert {r["precursor_s"] for r in written} == {""}  # the user's log does not say: unknown
    dataset = open_dataset(out)
    assert len(dataset.failures) == len(original)
    assert np.isnan(dataset.failures.precursor_s).all()


def test_a_precursor_column_in_the_failure_log_is_carried_through(
    tmp_path: Path, twin: Path, export_60s: Response
) -> None:
    original = list(csv.DictReader((twin / "failures.csv").open()))
    given = ["1800", "0", "", "42.5", " 7 "]
    log = tmp_path / "ops-log.csv"
    with log.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timestamp", "node", "gpu", "mode", "precursor_s"])
        for i, row in enumerate(original):
            writer.writerow([row["timestamp"], row["node"], row["gpu"], row["mode"], given[i % len(given)]])
    out, _ = _import(tmp_path, export_60s, log)
    expected = [given[i % len(given)].strip() for i in range(len(original))]
    assert [r["precursor_s"] for r in csv.DictReader((out / "failures.csv").open())] == expected
    read = open_dataset(out).failures.precursor_s.tolist()
    assert [str(v) for v in read] == [str(float(v)) if v else "nan" for v in expected]


def _with(result: list[dict[str, Any]], **changes: Any) -> Response:
    return {"status": "success", "data": {"resultType": "matrix", "result": result, **changes}}


MALFORMED: list[tuple[str, Callable[[Response], object], str, dict[str, Any]]] = [
    ("vector", lambda e: _with(e["data"]["result"], resultType="vector"), "expected 'matrix'", {}),
    ("failed query", lambda e: {"status": "error", "error": "bad_data: parse error"}, "query failed", {}),
    ("not an object", lambda e: [42], "expected a Prometheus API response", {}),
    (
        "no GPU series",
        lambda e: _with([{"metric": {"__name__": "node_load1", "instance": "a:9100"}, "values": [[1, "1"]]}]),
        "no series of a GPU metric",
        {},
    ),
    (
        "bad sample",
        lambda e: _with([{**e["data"]["result"][0], "values": [[1767571200, "warm"]]}]),
        "samples must be",
        {},
    ),
    (
        "bad gpu label",
        lambda e: _with(
            [{**e["data"]["result"][0], "metric": {**e["data"]["result"][0]["metric"], "gpu": "x"}}]
        ),
        "not an index",
        {},
    ),
    ("too many GPUs", lambda e: e, "more than --gpus-per-node 1", {"gpus_per_node": 1}),
]


@pytest.mark.parametrize(("case", "change", "message", "kwargs"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_exports_raise_data_error(
    tmp_path: Path, twin: Path, export_60s: Response, case: str, change: Callable[[Response], object],
    message: str, kwargs: dict[str, Any],
) -> None:  # fmt: skip
    with pytest.raises(DataError, match=message):
        _import(tmp_path, change(copy.deepcopy(export_60s)), twin / "failures.csv", **kwargs)


def test_an_export_that_is_not_json_raises(tmp_path: Path, twin: Path) -> None:
    (tmp_path / "broken.json").write_text('{"status": "success", "data": ')
    with pytest.raises(DataError, match="not JSON"):
        import_prometheus(tmp_path / "broken.json", twin / "failures.csv", tmp_path / "out")


@pytest.mark.parametrize(
    ("header", "row", "message"),
    [
        (
            "timestamp,node,gpu,mode",
            "2026-01-05T03:00:00Z,node-9999,0,power",
            "node 'node-9999' is not in the export",
        ),
        ("timestamp,node,gpu", "2026-01-05T03:00:00Z,node-0000,0", r"lacks columns \['mode'\]"),
        ("timestamp,node,gpu,mode", "2026-01-05T03:00:00Z,node-0000,7,power", "gpu 7 outside 0..1"),
        ("timestamp,node,gpu,mode", "yesterday-ish,node-0000,0,power", "is not a time"),
        ("timestamp,node,gpu,mode", "nan,node-0000,0,power", "is not a time"),
        (
            "timestamp,node,gpu,mode,xid",
            "2026-01-05T03:00:00Z,node-0000,0,power,Xid",
            "xid 'Xid' is not a number",
        ),
        ("timestamp,node,gpu,mode", "2026-01-05T03:00:00Z,node-0000,0,", "mode is empty"),
        (
            "timestamp,node,gpu,mode,precursor_s",
            "2026-01-05T03:00:00Z,node-0000,0,power,-5",
            "precursor_s '-5' is not a non-negative number",
        ),
        (
            "timestamp,node,gpu,mode,precursor_s",
            "2026-01-05T03:00:00Z,node-0000,0,power,soon",
            "precursor_s 'soon'",
        ),
    ],
)
def test_malformed_failure_logs_raise_data_error(
    tmp_path: Path, export_60s: Response, header: str, row: str, message: str
) -> None:
    log = tmp_path / "failures.csv"
    log.write_text(f"{header}\n{row}\n")
    with pytest.raises(DataError, match=message):
        _import(tmp_path, export_60s, log)
    assert not (tmp_path / "data").exists()  # nothing half-written


def test_the_import_command(
    tmp_path: Path, twin: Path, export_60s: Response, capsys: pytest.CaptureFixture[str]
) -> None:
    export = write_json(tmp_path / "export.json", export_60s)
    out = tmp_path / "data"
    code = cli.main(["import-prometheus", "--export", str(export), "--failures", str(twin / "failures.csv"),
                     "--out", str(out), "--interval", "2m", "--gpus-per-node", "4"])  # fmt: skip
    assert code == 0
    assert f"wrote {out}" in capsys.readouterr().out
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert (config["cadence_s"], config["gpus_per_node"]) == (120.0, 4)
    write_json(export, _with([], resultType="vector"))
    assert cli.main(["import-prometheus", "--export", str(export), "--out", str(tmp_path / "x")]) == 2
    assert "faultcast import-prometheus:" in capsys.readouterr().err


# -- score --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model, trained on a twin with failures on cue in both the fit and validation slices."""
    data = tmp_path_factory.mktemp("training-twin")
    days, nodes, modes = 2.0, 8, ("hbm_wear", "cooling", "nvlink", "power")
    scenarios = [Scenario(modes[n % 4], n, n % 4, days * 86_400 * (0.2 + 0.04 * n)) for n in range(nodes)]
    scenarios += [
        Scenario(modes[(n + 1) % 4], n, (n + 1) % 4, days * 86_400 * (0.56 + 0.012 * n)) for n in range(nodes)
    ]
    simulate(
        FleetConfig(nodes=nodes, gpus_per_node=4, days=days, seed=1, acceleration=100.0), data, scenarios
    )
    out = tmp_path_factory.mktemp("model")
    train(open_dataset(data), out, TrainConfig(num_boost_round=30))
    return out


SCRIPTED = (
    Scenario("hbm_wear", 0, 2, 9 * H, strength=3.0),
    Scenario("cooling", 1, 1, 10.5 * H, strength=3.0),
)


@pytest.fixture(scope="module")
def scored_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A twin with two failures on cue, exported in full and imported: (with, without) failure log."""
    twin = tmp_path_factory.mktemp("score-twin")
    simulate(FleetConfig(nodes=2, gpus_per_node=4, days=0.5, seed=11, acceleration=0.0), twin, SCRIPTED)
    gpu_columns = [m.name for m in METRICS if m.scope is Scope.GPU]
    export = write_json(
        twin / "export.json", merged(gpu_export(twin, gpu_columns, 60.0), network_export(twin, 60.0))
    )
    with_log, without_log = tmp_path_factory.mktemp("with-log"), tmp_path_factory.mktemp("without-log")
    manifest = import_prometheus(export, twin / "failures.csv", with_log)
    original = telemetry(twin)
    unsupported = [c for c in gpu_columns if original[c].isna().all()]  # NOT_SUPPORTED on every GPU
    assert manifest["missing"] == {"telemetry": unsupported, "network": []}
    assert manifest["rows"]["failures"] == len(SCRIPTED)
    import_prometheus(export, None, without_log)
    return with_log, without_log


@pytest.fixture(scope="module")
def alerts(model_dir: Path, scored_data: tuple[Path, Path]) -> list[ScoredAlert]:
    return score(model_dir, scored_data[0])


def test_score_lists_well_formed_alerts_that_precede_the_scripted_failures(
    model_dir: Path, scored_data: tuple[Path, Path], alerts: list[ScoredAlert]
) -> None:
    model = load(model_dir)
    data = open_dataset(scored_data[0])
    assert alerts, "the model raised no alert on two loud scripted failures"
    assert alerts == sorted(alerts, key=lambda a: (a.time_s, a.node, a.gpu))
    for a in alerts:
        c = a.content
        assert data.start_s + WARMUP_S <= a.time_s < data.end_s
        assert a.node in data.nodes
        assert a.gpus
        assert set(a.gpus) <= set(range(4))
        assert a.gpu == -1 or a.gpus == (a.gpu,)
        assert model.threshold <= c.risk <= 1.0
        assert c.mode in model.modes
        assert a.node_level == (c.mode in NODE_LEVEL_MODES)
        assert 0.0 <= c.mode_probability <= 1.0
        assert len(c.risk_within) == 3
        assert all(x <= y + 1e-12 for x, y in zip(c.risk_within, c.risk_within[1:], strict=False))
        assert c.risk_within[-1] <= c.risk + 1e-9
        if c.ttf_s is not None:
            assert 0 <= c.ttf_s[0] <= c.ttf_s[1] <= c.ttf_s[2] <= model.horizon_s
        assert len(c.top_features) == 3
        assert all(name in model.feature_names for name, _, _ in c.top_features)
        assert a.outcome is not None
        if a.failure is not None:
            assert 0 <= a.failure.lead_s <= 24 * 3600
            assert a.failure.gpu == a.gpu  # credited only where its evidence pointed
        assert (a.outcome is Outcome.FALSE) == (a.failure is None)
    caught = {(a.node, a.failure.mode) for a in alerts if a.outcome is Outcome.TRUE and a.failure is not None}
    scripted = {(data.nodes[s.node], s.mode) for s in SCRIPTED}
    assert caught & scripted, f"no alert 5 min to 2 h before a scripted failure: {alerts}"


def test_score_without_a_failure_log_raises_the_same_alerts(
    model_dir: Path, scored_data: tuple[Path, Path], alerts: list[ScoredAlert]
) -> None:
    with_log, without_log = alerts, score(model_dir, scored_data[1])
    assert [(a.time_s, a.node, a.gpu, a.risk) for a in without_log] == [
        (a.time_s, a.node, a.gpu, a.risk) for a in with_log
    ]
    assert all(a.outcome is None and a.failure is None for a in without_log)


def test_the_score_command_prints_a_table_and_writes_csv(
    tmp_path: Path, model_dir: Path, scored_data: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "alerts.csv"
    assert (
        cli.main(["score", "--model", str(model_dir), "--data", str(scored_data[0]), "--csv", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "| time | node | GPU | time to failure p50 (p10-p90), min | risk | x threshold |" in printed
    assert " true (their failure came 5 min to 2 h after)" in printed
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == list(CSV_FIELDS)
    assert any(r["outcome"] == "true" and float(r["lead_min"]) >= 5.0 for r in rows)
    assert all(float(r["risk"]) >= 0 and r["feature_1"] for r in rows)
    assert {r["outcome"] for r in rows} <= {"true", "late", "premature", "false"}
    assert not math.isnan(float(rows[0]["risk_30min"]))


def test_the_score_command_exits_2_on_bad_inputs(
    tmp_path: Path, model_dir: Path, scored_data: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["score", "--model", str(tmp_path), "--data", str(scored_data[0])]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err
    assert cli.main(["score", "--model", str(model_dir), "--data", str(tmp_path)]) == 2
    assert "telemetry.parquet is missing" in capsys.readouterr().err


def test_score_notes_a_cadence_other_than_the_models(
    tmp_path: Path, model_dir: Path, twin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from faultcast.cli.import_score import cadence_note

    same_cadence, _ = _import(tmp_path, gpu_export(twin, DCGM_COLUMNS, 60.0), None)
    assert cadence_note(model_dir, same_cadence) is None
    (tmp_path / "coarse").mkdir()
    coarse, manifest = _import(tmp_path / "coarse", gpu_export(twin, DCGM_COLUMNS, 600.0), None)
    assert manifest["config"]["cadence_s"] == 600.0
    note = cadence_note(model_dir, coarse)
    assert note is not None
    assert "600 s, 10 times the model's 60 s" in note
    assert "one step in 10 has a sample" in note
    cli.main(["score", "--model", str(model_dir), "--data", str(coarse)])
    assert note in capsys.readouterr().out  # said before scoring, whatever scoring then says
