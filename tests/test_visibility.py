"""What a model can see (faultcast.model.evaluation.visibility): the feature-to-input map checked against a real
feature engine, the report on a twin (everything visible) and on an import of a few dcgm-exporter
default metrics (blind groups named, with the counters-file lines to add), the `faultcast score` and
`faultcast calibrate` output, and the service's `faultcast_model_feature_group_visible` gauges from
samples pushed over gRPC."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from faultcast import cli
from faultcast.catalogue import Scope, index_of
from faultcast.dcgm import Vocabulary, names
from faultcast.demo.feed import push, twin_snapshots
from faultcast.model.evaluation.visibility import FeatureMap, of_data
from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.groups import GROUPS, input_group
from faultcast.model.features.steps import WIDTH
from faultcast.model.importers.prometheus import import_prometheus
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.writer import simulate
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARY_COLUMNS

START = 1_767_571_200  # 2026-01-05T00:00:00Z
# Seven of dcgm-exporter's default-enabled fields (bench/dcgm_export.py's: a real cluster's export), and a
# plausible value of each.
DEFAULTS: dict[str, float] = {
    "DCGM_FI_DEV_GPU_TEMP": 60.0,
    "DCGM_FI_DEV_MEMORY_TEMP": 55.0,
    "DCGM_FI_DEV_POWER_USAGE": 300.5,
    "DCGM_FI_DEV_SM_CLOCK": 1410.0,
    "DCGM_FI_DEV_GPU_UTIL": 90.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
}
BLIND = {"memory ecc", "pcie", "nvlink", "throttle", "nvml health", "step summaries", "infiniband", "tcp"}
BLIND |= {"peer probes"}
SEEN = {"thermal", "clocks", "utilisation", "xid"}  # xid: counted by code from DCGM_FI_DEV_XID_ERRORS
PARTLY = {"power", "row remap"}  # no power limit; only uncorrectable row remaps


def _engine_names() -> tuple[str, ...]:
    return FeatureEngine(FeatureConfig(), 1).names


# -- the map from features to inputs --------------------------------------------------------------


def test_every_feature_has_a_source_and_every_input_a_group() -> None:
    fmap = FeatureMap.of(_engine_names())
    assert fmap.unmatched() == ()
    assert {input_group(i) for i in fmap.inputs} <= set(GROUPS)
    assert set(fmap.group_names()) == set(GROUPS)
    # The model reads every catalogue input the engine takes, and the step summary.
    assert set(GPU_INPUTS) | set(NODE_INPUTS) <= set(fmap.inputs)
    assert SCRAPES_COLUMN in fmap.inputs
    assert set(fmap.inputs) <= set(GPU_INPUTS) | set(NODE_INPUTS) | {SCRAPES_COLUMN, *SUMMARY_COLUMNS}
    bookkeeping = [n for n, g in zip(fmap.names, fmap.groups, strict=True) if g == ""]
    assert "is_h100" in bookkeeping
    assert "missing_inputs" in bookkeeping
    assert not any(n.startswith(("gpu_temp", "ecc", "node_", "pcie")) for n in bookkeeping)


def _run(blank: set[str], steps: int = 90) -> np.ndarray:
    """A 2-GPU node's features after `steps` minutes of varied readings, `blank` never read."""
    rng = np.random.default_rng(3)
    engine = FeatureEngine(FeatureConfig(gpus_per_node=2), 1)
    counters = {c for _, cs in _rates() for c in cs}
    gpu_total = np.zeros((2, len(GPU_INPUTS)))
    node_total = np.zeros((1, len(NODE_INPUTS)))
    out = np.empty(0)
    for step in range(steps):
        gpu = rng.normal(50.0, 5.0, (2, len(GPU_INPUTS)))
        for k, name in enumerate(GPU_INPUTS):
            if name in counters:
                gpu_total[:, k] += rng.poisson(0.5, 2)
                gpu[:, k] = gpu_total[:, k]
            elif name.startswith(("throttle_", "row_remap_")):
                gpu[:, k] = rng.integers(0, 2, 2)
        node = rng.normal(1.0, 0.1, (1, len(NODE_INPUTS)))
        for k, name in enumerate(NODE_INPUTS):
            if name in counters:
                node_total[:, k] += rng.poisson(0.5)
                node[:, k] = node_total[:, k]
        summary = np.empty((2, WIDTH))
        summary[:, 0] = 0.0 if SCRAPES_COLUMN in blank else 60.0
        low = rng.normal(40.0, 5.0, (2, len(SUMMARY_COLUMNS)))
        summary[:, 1:] = low + np.tile([0.0, 10.0, 5.0], len(SUMMARY_COLUMNS) // 3)
        for k, name in enumerate(SUMMARY_COLUMNS):
            if name in blank:
                summary[:, 1 + k] = math.nan
        gpu[:, [k for k, n in enumerate(GPU_INPUTS) if n in blank]] = math.nan
        node[:, [k for k, n in enumerate(NODE_INPUTS) if n in blank]] = math.nan
        out = engine.update(step, gpu, node, np.zeros(2), summary)
    return out


def _rates() -> tuple[tuple[str, tuple[str, ...]], ...]:
    from faultcast.model.features.engine import NODE_RATES, RATES

    return RATES + NODE_RATES


@pytest.fixture(scope="module")
def full() -> np.ndarray:
    return _run(set())


@pytest.mark.parametrize(
    "blank",
    [
        *(pytest.param(g, id=g) for g in GROUPS),
        *(pytest.param(i, id=i) for i in ("power_usage", "remapped_rows_correctable", "xid_48_events",
                                          "pcie_link_width_max", "step_scrapes", "sm_clock_step_min")),
    ],
)  # fmt: skip
def test_blanking_inputs_blinds_exactly_the_features_the_map_says(full: np.ndarray, blank: str) -> None:
    """The map is checked against the engine itself: with a group's inputs (or one input) never read,
    the features the map says cannot see are missing on every GPU, and the others keep a value."""
    fmap = FeatureMap.of(_engine_names())
    inputs = set(fmap.group_inputs(blank)) if blank in GROUPS else {blank}
    assert inputs
    seen = fmap.seen(set(fmap.inputs) - inputs)
    got = _run(inputs)
    valued = ~np.isnan(full).any(axis=0)
    # Almost every feature has a value by the end of the full run; those that do not cannot be judged.
    assert valued.sum() >= 0.95 * len(fmap.names), [
        n for n, v in zip(fmap.names, valued, strict=True) if not v
    ]
    blind = [n for k, n in enumerate(fmap.names) if not seen[k] and not np.isnan(got[:, k]).all()]
    assert blind == [], f"the map says these cannot see without {sorted(inputs)}, yet they have values"
    # Without both temperature and power a GPU is absent (the engine's test of presence): its
    # bookkeeping features, which read no exporter, have nothing to count then.
    absent = {"gpu_temp", "power_usage"} <= inputs
    lost = [
        n
        for k, n in enumerate(fmap.names)
        if seen[k] and valued[k] and np.isnan(got[:, k]).any() and not (absent and fmap.groups[k] == "")
    ]
    assert lost == [], f"the map says these still see without {sorted(inputs)}, yet they are missing"
    if blank in GROUPS:
        assert not seen[fmap.index(blank)].any()


# -- a data directory --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(service_model: Path) -> Path:
    return service_model


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twin")
    simulate(FleetConfig(nodes=2, gpus_per_node=2, days=0.05, seed=5, acceleration=0.0), out, [])
    return out


def _export(defaults: dict[str, float], nodes: int = 2, gpus: int = 2, samples: int = 40) -> dict[str, Any]:
    result: list[dict[str, Any]] = []
    for node in range(nodes):
        for gpu in range(gpus):
            labels = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "modelName": "NVIDIA A100-SXM4-80GB",
                      "Hostname": f"node-{node}"}  # fmt: skip
            for name, base in defaults.items():
                values = [[START + 600 * i, repr(base + i % 3)] for i in range(samples)]
                result.append({"metric": {"__name__": name, **labels}, "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@pytest.fixture(scope="module")
def few(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An import of seven dcgm-exporter default metrics at 10 minutes, as a real cluster exported."""
    root = tmp_path_factory.mktemp("few")
    (root / "export.json").write_text(json.dumps(_export(DEFAULTS)))
    import_prometheus(root / "export.json", None, root / "data")
    return root / "data"


def test_a_twin_shows_every_group_visible(model: Path, twin: Path) -> None:
    report = of_data(model, twin)
    assert {g.group for g in report.groups} == set(GROUPS)
    assert report.blind() == ()
    assert report.partial() == ()
    assert all(g.absent == () for g in report.groups)
    assert report.fixes == ()
    assert report.unseen_importance() == 0.0
    assert "every input the model reads is there" in report.render()


def test_a_few_default_metrics_name_the_blind_groups_and_the_lines_to_add(model: Path, few: Path) -> None:
    report = of_data(model, few)
    status = {g.group: g.status for g in report.groups}
    assert {g for g, s in status.items() if s == "blind"} == BLIND
    assert {g for g, s in status.items() if s == "visible"} == SEEN
    assert {g for g, s in status.items() if s == "partial"} == PARTLY
    # Ranked by the model's gain; the importances are shares of it.
    shares = [g.importance for g in report.groups]
    assert shares == sorted(shares, reverse=True)
    assert 0.99 < sum(shares) + report.bookkeeping_importance < 1.01
    assert report.unseen_importance() > 0.5  # the demo model leans on error counters and the network

    lines = report.lines("dcgm-exporter")
    classic = names(Vocabulary.CLASSIC)
    for line in lines:
        name, kind, help_text = (part.strip() for part in line.split(",", 2))
        entry = next(n for n in classic.values() if n.name == name)
        assert kind == ("counter" if entry.counter else "gauge")
        assert help_text.endswith(".")
    assert (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Single-bit ECC errors since the driver was loaded." in lines
    )
    assert any(line.startswith("DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter,") for line in lines)
    assert any(line.startswith("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter,") for line in lines)
    # The five throttle flags come from one field: one line.
    assert sum(line.startswith("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge,") for line in lines) == 1
    assert not any(line.split(",")[0] in DEFAULTS for line in lines), "a line for a metric already there"
    assert len(lines) == len(set(lines))
    assert report.lines("node_exporter") == ["--collector.infiniband", "--collector.netstat"]
    hows = {f.how for f, _, _ in report.fixes}
    assert hows == {"dcgm-exporter", "node_exporter", "step summaries", "faultcast collect"}

    text = report.render()
    assert "9 of 15 feature groups blind, 2 partly" in text
    assert (
        "    DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Double-bit ECC errors since the driver was loaded."
        in text
    )
    # Every line under the counters-file heading copies into the file as it is: a field or a comment.
    block = text.split("names):\n", 1)[1].split("\n  node_exporter", 1)[0].splitlines()
    assert block == [line for line in block if line.startswith("    # ") or line.strip() in lines]
    assert len(block) == len(lines) + 1  # the throttle field's comment
    assert "--collector.infiniband  (ib_symbol_error," in text
    assert "scrape at 10 s or faster" in text
    assert "peer probes (peer_rtt_p99_seconds, peer_loss_ratio)" in text
    assert "derived from changes of DCGM_FI_DEV_XID_ERRORS" in text

    document = json.loads(json.dumps(report.to_json()))
    assert set(document["blind_groups"]) == BLIND
    assert document["dcgm_exporter_lines"] == lines
    assert "ecc_sbe_volatile" in document["inputs"]["absent"]
    assert "gpu_temp" in document["inputs"]["present"]


def test_an_import_under_dcgm_4_6_names_gets_lines_in_that_vocabulary(model: Path, tmp_path: Path) -> None:
    canonical = names(Vocabulary.CANONICAL)
    renamed = {canonical[next(n.metric for n in names(Vocabulary.CLASSIC).values() if n.name == k)].name: v
               for k, v in DEFAULTS.items() if k != "DCGM_FI_DEV_GPU_UTIL"}  # fmt: skip
    (tmp_path / "export.json").write_text(json.dumps(_export(renamed, nodes=1, samples=12)))
    import_prometheus(tmp_path / "export.json", None, tmp_path / "data")
    lines = of_data(model, tmp_path / "data").lines("dcgm-exporter")
    assert any(line.startswith("DCGM_FI_DEV_PCIE_REPLAY_TOTAL, counter,") for line in lines)
    assert any(line.startswith("DCGM_FI_DEV_GPU_UTIL_RATIO, gauge,") for line in lines)
    assert not any(line.startswith("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") for line in lines)


def test_a_summary_of_too_few_scrapes_is_no_summary(model: Path, twin: Path, tmp_path: Path) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    shutil.copytree(twin, tmp_path / "data")
    path = tmp_path / "data" / "telemetry.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index(SCRAPES_COLUMN)
    coarse = pc.min_element_wise(table.column(column), 2).cast(table.schema.field(column).type)
    pq.write_table(table.set_column(column, SCRAPES_COLUMN, coarse), path)
    report = of_data(model, tmp_path / "data")
    assert report.blind() == ("step summaries",)


# -- the commands --------------------------------------------------------------------------------


def test_score_prints_what_the_model_can_see(
    model: Path, few: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["score", "--model", str(model), "--data", str(few)]) == 0
    out = capsys.readouterr().out
    assert f"what the model can see in {few}: 9 of 15 feature groups blind" in out
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter," in out


class _Calibrated:
    """What `calibrate` returns, as far as the command reads it."""

    def to_json(self) -> dict[str, Any]:
        return {"threshold": 0.5}


def test_calibrate_prints_and_writes_what_the_model_can_see(
    model: Path,
    few: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The calibration itself is tests/test_calibrate.py's (it needs 50 healthy GPU-days); here its
    result is a stand-in and the report beside it is real."""
    from faultcast.model.training import calibrate

    monkeypatch.setattr(calibrate, "calibrate", lambda *args, **kwargs: _Calibrated())
    monkeypatch.setattr(calibrate, "summary", lambda result: "calibrated")
    report = tmp_path / "calibrate.json"
    assert cli.main(["calibrate", "--model", str(model), "--data", str(few), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("calibrated\nwhat the model can see in")
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge," in out
    document = json.loads(report.read_text())
    assert set(document["visibility"]["blind_groups"]) == BLIND
    assert cli.main(["calibrate", "--model", str(model), "--data", str(few), "--json", "-"]) == 0
    assert set(json.loads(capsys.readouterr().out)["visibility"]["partial_groups"]) == PARTLY


# -- the service ---------------------------------------------------------------------------------


@pytest.fixture
def service(model: Path, tmp_path: Path) -> Iterator[tuple[Service, grpc.Channel]]:
    shutil.copytree(model, tmp_path / "model")
    running = Service.open(
        tmp_path / "model", tmp_path / "state", ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0))
    )
    port = running.start("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield running, channel
    channel.close()
    running.stop(0)


def _visible(service: Service) -> dict[str, float]:
    families = text_string_to_metric_families(generate_latest(service.metrics.registry).decode())
    family = next(f for f in families if f.name == "faultcast_model_feature_group_visible")
    return {s.labels["group"]: s.value for s in family.samples}


def _only_defaults(snapshot: NodeSnapshot) -> NodeSnapshot:
    """A twin sample as a dcgm-exporter of DEFAULTS would carry it: the rest missing, no devices."""
    keep = {next(n.metric for n in names(Vocabulary.CLASSIC).values() if n.name == k) for k in DEFAULTS}
    index = [i for name, i in index_of(Scope.GPU).items() if name in keep]
    gpus = []
    for gpu in snapshot.gpus:
        values = [math.nan] * len(gpu.values)
        for i in index:
            values[i] = gpu.values[i]
        gpus.append(replace(gpu, values=tuple(values), summary=None))
    return replace(snapshot, gpus=tuple(gpus), devices=(), host=tuple(math.nan for _ in snapshot.host))


def test_the_service_exports_which_groups_the_samples_feed(service: tuple[Service, grpc.Channel]) -> None:
    running, channel = service
    assert _visible(running) == dict.fromkeys(GROUPS, 0.0), "before any sample every group is blind"
    running.visibility.every_s = 0.0  # look at every sample (the service looks every 10 s)
    fleet = FleetConfig(nodes=1, days=1.0, seed=7, acceleration=0.0)
    plain = [_only_defaults(s) for s in twin_snapshots(TwinSource(fleet, 0), "node-few", 4)]
    assert push(channel, "node-few", plain)[-1].acked_through == 4
    visible = _visible(running)
    assert {g for g, v in visible.items() if v == 0.0} == BLIND | {"xid"}  # no Xid counter by code here
    assert {g for g, v in visible.items() if v == 1.0} == SEEN - {"xid"}
    assert all(0.0 < visible[g] < 1.0 for g in PARTLY)

    full = list(twin_snapshots(TwinSource(fleet, 0), "node-full", 4))
    assert push(channel, "node-full", full)[-1].acked_through == 4
    assert _visible(running) == dict.fromkeys(GROUPS, 1.0), "the twin's samples carry every input"
