"""The model registry over a real service on port 0: a model added is copied under the state directory,
promoted and rolled back without a restart (the service serves it at once), every change logged with who
and why; a restart serves the registry's model whatever --model says; a corrupt model, an unknown id and
a model the service refuses are refused with clear codes and leave nothing logged; `faultcast models`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from faultcast.model.digest import content_digest
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.threshold_file import write as write_threshold
from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.model_registry import MODELS_DIR, of_store
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.server import Service
from faultcast.service.state.store import StateStore
from faultcast.testing.stub_model import STUB_THRESHOLD
from faultcast.testing.stub_model import stub_model as build_stub
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

FAULTCAST = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "faultcast")
CHALLENGER_THRESHOLD = 0.6  # another threshold than the stub's: another model, another digest


@pytest.fixture(scope="module")
def challenger(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub model with a threshold chosen after training (threshold.json beside it): a model that
    loads like any other and serves another threshold, so it has a digest of its own."""
    out = tmp_path_factory.mktemp("challenger") / "model"
    shutil.copytree(stub_model, out)
    manifest = json.loads((out / "manifest.json").read_text())
    write_threshold(out, CHALLENGER_THRESHOLD, manifest["files"]["model.txt"], {"why": "a test"})
    return out


Served = tuple[Service, apb_grpc.AdminStub, Path, str]


@pytest.fixture
def served(stub_model: Path, tmp_path: Path) -> Iterator[Served]:
    """A service on port 0 serving a copy of the stub model: (it, an Admin stub, its state directory,
    its address)."""
    model_dir = tmp_path / "serving"
    shutil.copytree(stub_model, model_dir)
    state = tmp_path / "state"
    service = Service.open(
        model_dir, state, ServiceConfig(), actuator=NoopActuator(), metrics=ServiceMetrics()
    )
    port = service.start("127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield service, apb_grpc.AdminStub(channel), state, f"127.0.0.1:{port}"
    channel.close()
    service.stop(0)


def _id(model_dir: Path) -> str:
    return content_digest(model_dir)[:16]


def _counted(service: Service, name: str, label: str, value: str) -> float:
    count = service.metrics.registry.get_sample_value(name, {label: value})
    assert count is not None
    return count


def test_promote_and_rollback_swap_the_serving_model_without_a_restart(
    served: Served, challenger: Path, stub_model: Path
) -> None:
    service, admin, state, _ = served
    added = admin.AddModel(apb.AddModelRequest(path=str(challenger), why="retrained on last week"))
    assert (added.model.id, added.already_there) == (_id(challenger), False)
    assert added.model.threshold == CHALLENGER_THRESHOLD
    assert added.model.source == str(challenger)
    copy = state / MODELS_DIR / added.model.id
    assert Path(added.model.path) == copy
    assert _id(copy) == added.model.id
    again = admin.AddModel(apb.AddModelRequest(path=str(challenger), why="twice"))
    assert again.already_there
    assert again.model.added.why == "retrained on last week"
    assert service.model.threshold == STUB_THRESHOLD  # adding serves nothing

    promoted = admin.PromoteModel(apb.PromoteModelRequest(id=added.model.id, why="catches more"))
    assert service.model.threshold == CHALLENGER_THRESHOLD
    assert service.model_dir == copy
    assert promoted.model_version.endswith(f"@{CHALLENGER_THRESHOLD!r}")
    # What served before came from outside the registry: it was added so that a rollback can return.
    assert promoted.event.from_model_id == _id(stub_model)

    back = admin.RollbackModel(apb.RollbackModelRequest(why="too many false alarms"))
    assert back.event.model_id == _id(stub_model)
    assert back.event.from_model_id == added.model.id
    assert service.model.threshold == STUB_THRESHOLD
    assert service.model_dir == state / MODELS_DIR / _id(stub_model)

    with pytest.raises(grpc.RpcError) as refused:
        admin.RollbackModel(apb.RollbackModelRequest(why="once more"))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    listed = admin.ListModels(apb.ListModelsRequest())
    assert listed.serving_id == _id(stub_model)
    assert [(m.id, m.serving) for m in listed.models] == [(added.model.id, False), (_id(stub_model), True)]
    log = [(apb.ModelEventKind.Name(e.kind), e.model_id, e.why) for e in listed.events]
    assert log == [
        ("MODEL_EVENT_KIND_ADDED", added.model.id, "retrained on last week"),
        ("MODEL_EVENT_KIND_ADDED", _id(stub_model), f"served before the first promotion (from {service.started_from})"),
        ("MODEL_EVENT_KIND_PROMOTED", added.model.id, "catches more"),
        ("MODEL_EVENT_KIND_ROLLED_BACK", _id(stub_model), "too many false alarms"),
    ]  # fmt: skip
    assert {e.by for e in listed.events} == {"admin 'insecure' (insecure)"}
    events = "faultcast_model_registry_events_total"
    assert [_counted(service, events, "event", e) for e in ("added", "promoted", "rolled_back")] == [2, 1, 1]
    assert _counted(service, "faultcast_model_registry_refusals_total", "action", "rollback") == 1


def test_a_restart_serves_the_registrys_model_whatever_model_says(
    stub_model: Path, challenger: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    service = Service.open(stub_model, state, ServiceConfig(), metrics=ServiceMetrics())
    entry, _ = service.add_model(str(challenger), "ops", "retrained")
    service.promote_model(entry.id, "ops", "catches more")
    service.store.close()  # never started: nothing else to stop

    with caplog.at_level(logging.WARNING, logger="faultcast.service.model_registry"):
        restarted = Service.open(stub_model, state, ServiceConfig(), metrics=ServiceMetrics())
    try:
        assert restarted.model.threshold == CHALLENGER_THRESHOLD
        assert restarted.model_dir == restarted.started_from == state / MODELS_DIR / entry.id
        (warning,) = [r.getMessage() for r in caplog.records if r.name == "faultcast.service.model_registry"]
        assert entry.id in warning
        assert f"not --model {stub_model}" in warning
        info = {s.labels["registry_id"] for m in restarted.metrics.model_info.collect() for s in m.samples}
        assert info == {entry.id}
    finally:
        restarted.store.close()


def test_a_model_added_beside_the_service_is_listed_by_it(served: Served, challenger: Path) -> None:
    service, admin, state, _ = served
    other = StateStore.in_dir(state)  # as `faultcast retrain` opens it, the service running
    try:
        entry, known = of_store(other).add(challenger, "retrain", "the weekly retrain")
    finally:
        other.close()
    assert not known
    (listed,) = admin.ListModels(apb.ListModelsRequest()).models
    assert (listed.id, listed.added.by, listed.serving) == (entry.id, "retrain", False)
    admin.PromoteModel(apb.PromoteModelRequest(id=entry.id, why="catches more"))
    assert service.model.threshold == CHALLENGER_THRESHOLD


def test_a_corrupt_model_is_refused_at_add_and_nothing_is_logged(
    served: Served, stub_model: Path, tmp_path: Path
) -> None:
    _, admin, state, _ = served
    corrupt = tmp_path / "corrupt"
    shutil.copytree(stub_model, corrupt)
    with (corrupt / "model.txt").open("a") as model_file:
        model_file.write("\n")  # the manifest's SHA-256 of it no longer holds
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (corrupt, empty, tmp_path / "absent"):
        with pytest.raises(grpc.RpcError) as refused:
            admin.AddModel(apb.AddModelRequest(path=str(path), why="a try"))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert str(path) in (refused.value.details() or "")
    assert not admin.ListModels(apb.ListModelsRequest()).events
    assert not list((state / MODELS_DIR).glob("*")), "a refused model left a copy"


def test_promoting_an_unknown_a_serving_or_a_refused_model_logs_nothing(
    served: Served, stub_model: Path, tmp_path: Path
) -> None:
    service, admin, _, _ = served
    with pytest.raises(grpc.RpcError) as unknown:
        admin.PromoteModel(apb.PromoteModelRequest(id="0123456789abcdef", why="a try"))
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND

    same = admin.AddModel(apb.AddModelRequest(path=str(stub_model), why="the one serving"))
    with pytest.raises(grpc.RpcError) as serving:
        admin.PromoteModel(apb.PromoteModelRequest(id=same.model.id, why="a try"))
    assert serving.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    # A model that loads but that this service cannot serve: built for another number of GPUs per node.
    other = build_stub(tmp_path / "four-gpus", FeatureConfig(gpus_per_node=4))
    added = admin.AddModel(apb.AddModelRequest(path=str(other), why="for another fleet"))
    with pytest.raises(grpc.RpcError) as refused:
        admin.PromoteModel(apb.PromoteModelRequest(id=added.model.id, why="a try"))
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "GPUs per node" in (refused.value.details() or "")
    assert service.model.threshold == STUB_THRESHOLD
    kinds = {e.kind for e in admin.ListModels(apb.ListModelsRequest()).events}
    assert kinds == {apb.MODEL_EVENT_KIND_ADDED}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FAULTCAST, "models", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_command(served: Served, challenger: Path) -> None:
    service, _, _, address = served
    target = ["--service", address, "--insecure"]
    added = _cli("add", str(challenger), "--why", "retrained", *target)
    assert added.returncode == 0, added.stderr
    model_id = _id(challenger)
    assert model_id in added.stdout
    promoted = _cli("promote", model_id[:8], "--why", "catches more", *target)
    assert promoted.returncode == 0, promoted.stderr
    assert service.model.threshold == CHALLENGER_THRESHOLD
    listed = _cli("list", "--json", *target)
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert next((r["id"], r["serving"]) for r in rows if "id" in r) == (model_id, True)
    rolled = _cli("rollback", "--why", "false alarms", *target)
    assert rolled.returncode == 0, rolled.stderr
    assert service.model.threshold == STUB_THRESHOLD
    again = _cli("rollback", "--why", "again", *target)
    assert again.returncode == 1
    assert "FAILED_PRECONDITION" in again.stderr
