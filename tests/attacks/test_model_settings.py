"""A model whose manifest (or threshold.json) holds an impossible setting must not load:
the probe set the threshold to -5 (88 alerts) and NaN (the service went silently blind),
k to 0, clear_steps and horizon_s to -1, and every one was accepted on load and on reload. Each bad
value is refused with the file, the key and what is allowed; at start that is fatal, on reload the
old model keeps serving.

A second probe scaled the windows with a tiny cadence (each window as many steps as before, names
and hash recomputed): cadence 1e-300 s loaded and every Push then died with OverflowError (UNKNOWN,
the stream ended); 1e-6 s loaded and one sample froze the event loop. The cadence now has a floor
of 1 s, each window is at least one step and the horizon at most 10,000; and whatever the sink
raises rejects that one sample ("scoring_error"), never the stream."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from faultcast import wire
from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import ModelError, load
from faultcast.model.features.engine import FeatureConfig, FeatureEngine, feature_schema_hash
from faultcast.model.risk_range import risk_range
from faultcast.readings import NodeSnapshot
from faultcast.service.rpc.telemetry import AsyncTelemetryServicer, TelemetryServicer
from faultcast.service.scoring import model_version
from faultcast.service.server import Service
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc
from tests.aio_server import aio_telemetry_server
from tests.attacks.victim import FLEET, WAIT_S

Manifest = dict[str, Any]


def _variant(good: Path, out: Path, edit: Callable[[Manifest], None]) -> Path:
    """A copy of the good model with its manifest edited (the good one is shared: never touched)."""
    shutil.copytree(good, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    _rehash(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))  # NaN and Infinity written as JSON allows
    return out


def _rehash(manifest: Manifest) -> None:
    """Give the edited feature settings their schema hash, as an attacker would: the bad value must
    be refused for itself, not because the hash no longer matches."""
    features = manifest["features"]
    windows = features["windows_s"]
    config = FeatureConfig(
        cadence_s=features["cadence_s"],
        windows_s=tuple(windows) if isinstance(windows, list) else windows,
        gpus_per_node=features["gpus_per_node"],
    )
    features["hash"] = feature_schema_hash(features["names"], config)


def _set(*path: str, value: object) -> Callable[[Manifest], None]:
    def edit(manifest: Manifest) -> None:
        where = manifest
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value

    return edit


def _features(**changes: object) -> Callable[[Manifest], None]:
    """Feature settings changed with their feature names recomputed (the names carry the windows),
    as an attacker would: refused for the value itself, not for names that no longer match."""

    def edit(manifest: Manifest) -> None:
        features = manifest["features"]
        features.update(changes)
        config = FeatureConfig(
            cadence_s=features["cadence_s"],
            windows_s=tuple(features["windows_s"]),
            gpus_per_node=features["gpus_per_node"],
        )
        features["names"] = list(FeatureEngine(config, 1).names)

    return edit


def _scaled(cadence_s: float) -> Callable[[Manifest], None]:
    """The cadence set and the windows scaled with it: each window as many steps as before, so the
    cap on window steps does not see it."""
    shipped = FeatureConfig()  # the service model's: 60 s, 5, 15 and 60 minutes
    scale = cadence_s / shipped.cadence_s
    return _features(cadence_s=cadence_s, windows_s=[w * scale for w in shipped.windows_s])


def _drop(*path: str) -> Callable[[Manifest], None]:
    def edit(manifest: Manifest) -> None:
        where = manifest
        for key in path[:-1]:
            where = where[key]
        del where[path[-1]]

    return edit


NAN, INF = math.nan, math.inf

# (key as the error names it, the edit): every one must be refused naming the key.
BAD_MANIFESTS = [
    ("threshold", _set("threshold", value=-5)),
    ("threshold", _set("threshold", value=NAN)),
    ("threshold", _set("threshold", value=INF)),
    ("threshold", _set("threshold", value=0)),
    ("threshold", _set("threshold", value=1.5)),
    ("threshold", _set("threshold", value="0.3")),
    ("threshold", _set("threshold", value=True)),
    ("threshold", _set("threshold", value=None)),
    ("threshold", _drop("threshold")),
    ("logistic_threshold", _set("logistic_threshold", value=NAN)),
    ("dcgm_default_threshold", _set("dcgm_default_threshold", value=-1)),
    ("alert_policy.k", _set("alert_policy", "k", value=0)),
    ("alert_policy.k", _set("alert_policy", "k", value=-3)),
    ("alert_policy.k", _set("alert_policy", "k", value=2.5)),
    ("alert_policy.k", _set("alert_policy", "k", value=True)),
    ("alert_policy.k", _set("alert_policy", "k", value="2")),
    ("alert_policy.k", _set("alert_policy", "k", value=10**9)),  # never opens within the horizon
    ("alert_policy.clear_steps", _set("alert_policy", "clear_steps", value=-1)),
    ("alert_policy.clear_steps", _set("alert_policy", "clear_steps", value=0)),
    ("alert_policy.clear_steps", _set("alert_policy", "clear_steps", value=2**40)),
    ("alert_policy.dark_steps", _set("alert_policy", "dark_steps", value=0)),
    ("alert_policy.hold_ratio", _set("alert_policy", "hold_ratio", value=0)),
    ("alert_policy.hold_ratio", _set("alert_policy", "hold_ratio", value=1.5)),
    ("alert_policy.hold_ratio", _set("alert_policy", "hold_ratio", value=NAN)),
    ("alert_policy", _set("alert_policy", value=[2, 10])),
    ("horizon_s", _set("horizon_s", value=-1)),
    ("horizon_s", _set("horizon_s", value=NAN)),
    ("horizon_s", _set("horizon_s", value=INF)),
    ("horizon_s", _set("horizon_s", value=0)),
    ("horizon_s", _set("horizon_s", value="1800")),
    ("features.cadence_s", _set("features", "cadence_s", value=0)),
    ("features.cadence_s", _set("features", "cadence_s", value=-60)),
    ("features.cadence_s", _set("features", "cadence_s", value=NAN)),
    ("features.cadence_s", _set("features", "cadence_s", value=1e-300)),  # windows of 10^303 steps
    ("features.cadence_s", _scaled(1e-300)),  # loaded, then every step number overflowed
    ("features.cadence_s", _scaled(1e-6)),  # loaded, then one sample froze the event loop
    ("features.cadence_s", _scaled(0.5)),  # finer than collectors sample
    ("features.windows_s", _features(windows_s=[30.0, 900.0, 3600.0])),  # a window under one step
    ("horizon_s", _set("horizon_s", value=60.0 * 10_001)),  # 10,001 steps of 60 s
    ("features.gpus_per_node", _set("features", "gpus_per_node", value=0)),
    ("features.gpus_per_node", _set("features", "gpus_per_node", value=True)),
    ("features.gpus_per_node", _set("features", "gpus_per_node", value=8.0)),
    ("features.gpus_per_node", _set("features", "gpus_per_node", value=10**7)),
    ("features.windows_s", _set("features", "windows_s", value=[])),
    ("features.windows_s", _set("features", "windows_s", value=[900.0, 300.0, 3600.0])),
    ("features.windows_s", _set("features", "windows_s", value=[300.0, NAN, 3600.0])),
    ("features.windows_s", _set("features", "windows_s", value="300,900,3600")),
    ("ttf_buckets_s", _set("ttf_buckets_s", value=[1800.0, 900.0, 300.0])),
    ("modes", _set("modes", value=["hbm_wear"])),  # the mode head gives seven classes
    ("modes", _set("modes", value="hbm_wear")),
    ("files", _set("files", value=["model.txt"])),
    ("files", _set("files", "/etc/hostname", value="0" * 64)),
]


@pytest.mark.parametrize(
    ("key", "edit"), BAD_MANIFESTS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(BAD_MANIFESTS)]
)
def test_an_impossible_manifest_value_is_refused_naming_the_key(
    service_model: Path, tmp_path: Path, key: str, edit: Callable[[Manifest], None]
) -> None:
    bad = _variant(service_model, tmp_path / "bad", edit)
    with pytest.raises(ModelError) as refused:
        load(bad)
    message = str(refused.value)
    assert "manifest.json" in message, message
    assert key in message, message


def test_a_manifest_that_is_not_an_object_is_refused(service_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(service_model, bad)
    (bad / "manifest.json").write_text("[1, 2, 3]")
    with pytest.raises(ModelError, match=r"manifest\.json.*object"):
        load(bad)


def test_a_calibration_that_makes_every_risk_nan_is_refused(service_model: Path, tmp_path: Path) -> None:
    """calibration.json's checksum is in the manifest, so whoever can edit one can edit both: a NaN
    slope would make every risk NaN, which the tracker reads as 'below the threshold' (blind)."""
    bad = tmp_path / "bad"
    shutil.copytree(service_model, bad)
    (bad / "calibration.json").write_text(json.dumps({"method": "platt", "a": NAN, "b": 0.0}))
    digest = hashlib.sha256((bad / "calibration.json").read_bytes()).hexdigest()
    _set_in_place(bad, _set("files", "calibration.json", value=digest))
    with pytest.raises(ModelError, match=r"calibration\.json.*\ba\b"):
        load(bad)


def _set_in_place(model_dir: Path, edit: Callable[[Manifest], None]) -> None:
    manifest = json.loads((model_dir / "manifest.json").read_text())
    edit(manifest)
    (model_dir / "manifest.json").write_text(json.dumps(manifest))


BAD_THRESHOLD_FILES: list[object] = [-5, NAN, INF, 0, 1, 1.5, "0.3", True, None]


@pytest.mark.parametrize("value", BAD_THRESHOLD_FILES, ids=[repr(v) for v in BAD_THRESHOLD_FILES])
def test_an_impossible_threshold_file_is_refused(service_model: Path, tmp_path: Path, value: object) -> None:
    """threshold.json (faultcast goodput --apply) replaces the trained threshold: the same rule."""
    bad = tmp_path / "bad"
    shutil.copytree(service_model, bad)
    digest = json.loads((bad / "manifest.json").read_text())["files"]["model.txt"]
    (bad / "threshold.json").write_text(json.dumps({"threshold": value, "model_sha256": digest}))
    with pytest.raises(ModelError, match=r"threshold\.json.*threshold"):
        load(bad)


def test_the_good_model_still_loads(service_model: Path) -> None:
    model = load(service_model)
    assert 0 < model.threshold < 1
    assert model.policy.k >= 1


def test_a_one_second_grid_still_loads(service_model: Path, tmp_path: Path) -> None:
    """The floor is the collectors' fastest sampling, 1 s: a model on that grid loads (the
    benchmark's twin samples every second), with windows and horizon in range."""
    load(_variant(service_model, tmp_path / "fine", _scaled(1.0)))  # does not raise


@pytest.mark.parametrize("never", [1.0, 1.0 + 1e-9])
def test_training_s_never_threshold_still_loads(service_model: Path, tmp_path: Path, never: float) -> None:
    """Training writes 1.0 (or 1e-9 above the top risk) when no threshold met its false-alarm
    budget (outcomes.choose_threshold, small validation sets): that model must still load, for
    evaluation and for goodput --apply to choose it a threshold. Above that is refused (1.5 above)."""
    model = load(_variant(service_model, tmp_path / "never", _set("threshold", value=never)))
    assert model.threshold == never


def test_a_service_refuses_to_start_on_an_impossible_model(service_model: Path, tmp_path: Path) -> None:
    bad = _variant(service_model, tmp_path / "bad", _set("threshold", value=NAN))
    with pytest.raises(ModelError, match="threshold"):
        Service.open(bad, tmp_path / "state")


@pytest.mark.parametrize(
    ("key", "edit"),
    [
        ("threshold", _set("threshold", value=-5)),
        ("threshold", _set("threshold", value=NAN)),
        ("alert_policy.k", _set("alert_policy", "k", value=0)),
        ("alert_policy.clear_steps", _set("alert_policy", "clear_steps", value=-1)),
        ("horizon_s", _set("horizon_s", value=-1)),
        ("features.cadence_s", _scaled(1e-300)),
        ("features.cadence_s", _scaled(1e-6)),
    ],
)
def test_a_reload_to_an_impossible_model_is_refused_and_the_old_one_keeps_serving(
    service_model: Path, tmp_path: Path, key: str, edit: Callable[[Manifest], None]
) -> None:
    service = Service.open(service_model, tmp_path / "state")
    try:
        before = model_version(service.model)
        threshold, policy, horizon = service.model.threshold, service.model.policy, service.model.horizon_s
        bad = _variant(service_model, tmp_path / "bad", edit)
        loaded, version, reason = service.reload(str(bad))
        assert not loaded
        assert version == before
        assert key in reason, reason
        assert "manifest.json" in reason, reason
        assert (service.model.threshold, service.model.policy, service.model.horizon_s) == (
            threshold,
            policy,
            horizon,
        )
        assert service.model_dir == service_model
        assert service.book.tracker.thresholds.tolist() == [threshold]
    finally:
        service.stop()


# -- a sink that fails on a sample -----------------------------------------------------------------


def test_a_sink_failing_on_one_sample_rejects_that_sample_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the 1e-300 model did to every sample (OverflowError in the scorer), here on the second
    of four samples and again on the third: each is rejected as "scoring_error" with one log line
    (the traceback the first time), and the samples after it on the same stream are taken."""
    taken: list[NodeSnapshot] = []

    def sink(snapshot: NodeSnapshot) -> None:
        if snapshot.sequence in (2, 3):
            raise OverflowError("cannot convert float infinity to integer")
        taken.append(snapshot)

    core = TelemetryServicer(sink)
    samples = list(twin_snapshots(TwinSource(FLEET, 0, []), "node-a", 4))

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello("node-a", 1)
        for snapshot in samples:
            yield tpb.PushRequest(sample=wire.to_proto(snapshot))

    with (
        aio_telemetry_server(AsyncTelemetryServicer(core)) as port,
        caplog.at_level(logging.ERROR, logger="faultcast.service.rpc.telemetry"),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        acks = list(tpb_grpc.TelemetryStub(channel).Push(requests(), timeout=WAIT_S))
    assert [s.sequence for s in taken] == [1, 4]
    assert [[r.sequence for r in a.rejections] for a in acks] == [[], [2], [3], []]
    assert "OverflowError" in acks[1].rejections[0].reason
    assert acks[-1].acked_through == 4
    assert core.rejects == {"scoring_error": 2}
    failures = [r for r in caplog.records if "sink failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failures] == [True, False]  # one traceback of a kind


# -- a threshold below every risk the model gives; ReloadModel("") and the version ------------------


def _with_threshold_file(good: Path, out: Path, threshold: float) -> Path:
    """A copy of the good model with threshold.json serving `threshold` (faultcast goodput --apply's
    file, as an operator or a mistake may write it)."""
    shutil.copytree(good, out)
    digest = json.loads((out / "manifest.json").read_text())["files"]["model.txt"]
    (out / "threshold.json").write_text(json.dumps({"threshold": threshold, "model_sha256": digest}))
    return out


def _lowest_risk(model_dir: Path) -> float:
    model = load(model_dir)
    low, high = risk_range(model.booster, model.calibration)
    assert 0.0 < low < model.threshold < high < 1.0
    return low


@pytest.mark.parametrize("scale", [0.0, 1e-300, 1e-12, 0.5, 1.0])
def test_a_threshold_at_or_below_every_risk_the_model_gives_is_refused_at_start_and_on_reload(
    service_model: Path, tmp_path: Path, scale: float
) -> None:
    # 1e-320 loaded before (a subnormal: scale 0 gives it), and every healthy node opened
    # SNAPSHOT_AND_MIGRATE alerts and was drained at the grace.
    threshold = 1e-320 if scale == 0.0 else _lowest_risk(service_model) * scale
    bad = _with_threshold_file(service_model, tmp_path / "bad", threshold)
    with pytest.raises(ModelError, match=r"threshold\.json: alert threshold .* at or below the lowest risk"):
        load(bad)
    with pytest.raises(ModelError, match="every GPU would alert"):
        Service.open(bad, tmp_path / "state-bad")
    service = Service.open(service_model, tmp_path / "state")
    try:
        before = service.model.threshold
        loaded, _, reason = service.reload(str(bad))
        assert not loaded
        assert "at or below the lowest risk" in reason
        assert service.model.threshold == before
    finally:
        service.stop()


def test_a_threshold_just_above_the_lowest_risk_loads(service_model: Path, tmp_path: Path) -> None:
    low = _lowest_risk(service_model)
    assert load(_with_threshold_file(service_model, tmp_path / "low", low * 1.01)).threshold == low * 1.01


def test_reload_without_a_path_goes_back_to_the_model_the_service_started_with(
    service_model: Path, tmp_path: Path
) -> None:
    start = tmp_path / "start"
    shutil.copytree(service_model, start)
    other = _with_threshold_file(service_model, tmp_path / "other", load(service_model).threshold * 2)
    service = Service.open(start, tmp_path / "state")
    try:
        first = model_version(service.model)
        loaded, second, _ = service.reload(str(other))
        assert loaded
        assert second != first  # the same trees, another served threshold: another version
        assert service.model.threshold == load(other).threshold

        loaded, back, error = service.reload(None)  # ReloadModel(path="")
        assert (loaded, error) == (True, "")
        assert back == first
        assert service.model.threshold == load(start).threshold
        assert service.model_dir == start
    finally:
        service.stop()
