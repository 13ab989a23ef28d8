"""The shadow: a challenger scored beside the serving model on the same samples, alerting nothing, its
steps kept for a comparison on the fleet's labels; promotion of the challenger only when the comparison
finds it better (or forced, and said so); the comparison's rules on steps built by hand."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from faultcast.demo.feed import push, twin_snapshots
from faultcast.model.digest import content_digest
from faultcast.model.threshold_file import write as write_threshold
from faultcast.modes import FailureMode
from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.service.shadow_compare import Span, compare
from faultcast.service.state.labels import FailureLabel, LabelSource
from faultcast.service.state.models import ShadowStep
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.testing.stub_model import STUB_RISK, STUB_THRESHOLD
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import alerts_pb2_grpc as apb_grpc

MIN_NS = 60 * 10**9
HORIZON_S = 1800.0
WAIT_S = 30.0


def _steps(node: str, serving: list[float], challenger: list[float]) -> list[ShadowStep]:
    return [
        ShadowStep(node, i * MIN_NS, s, c) for i, (s, c) in enumerate(zip(serving, challenger, strict=True))
    ]


def test_a_challenger_that_catches_more_at_no_more_false_alarms_is_better() -> None:
    # Node a fails at minute 20; the challenger rises at minute 10, the serving model never.
    quiet = [0.1] * 30
    rising = [0.1] * 10 + [0.9] * 10 + [0.1] * 10
    steps = _steps("a", quiet, rising) + _steps("b", [0.1] * 30, [0.1] * 30)
    verdict = compare(
        steps, [("a", 20 * MIN_NS)], [], serving_threshold=0.5, challenger_threshold=0.5,
        horizon_s=HORIZON_S, cadence_s=60.0,
    )  # fmt: skip
    assert (verdict.serving.caught, verdict.challenger.caught, verdict.failures) == (0, 1, 1)
    assert (verdict.serving.false_alarms, verdict.challenger.false_alarms) == (0, 0)
    assert verdict.better
    assert verdict.extra_caught_low == verdict.extra_caught_high == 1  # one failure: every resample agrees
    assert verdict.steps == 60


def test_more_false_alarms_is_not_better_and_a_censored_run_counts_as_none() -> None:
    rising = [0.1] * 10 + [0.9] * 10 + [0.1] * 10
    noisy = [0.9, 0.1] * 15  # fifteen runs on a healthy node
    steps = _steps("a", [0.1] * 30, rising) + _steps("b", [0.1] * 30, noisy)
    verdict = compare(
        steps, [("a", 20 * MIN_NS)], [], serving_threshold=0.5, challenger_threshold=0.5,
        horizon_s=HORIZON_S, cadence_s=60.0,
    )  # fmt: skip
    assert (verdict.challenger.caught, verdict.challenger.false_alarms) == (1, 15)
    assert not verdict.better
    # The same runs inside a censored span (acted on, never settled) are neither true nor false.
    hidden = compare(
        steps, [("a", 20 * MIN_NS)], [Span("b", 0, 30 * MIN_NS)], serving_threshold=0.5,
        challenger_threshold=0.5, horizon_s=HORIZON_S, cadence_s=60.0,
    )  # fmt: skip
    assert hidden.challenger.false_alarms == 0
    assert hidden.better
    # At the serving model's false alarms (none) the challenger needs a threshold above 0.9: it catches nothing.
    assert (verdict.matched.false_alarms, verdict.matched.caught) == (0, 0)


def test_a_run_is_one_alarm_and_a_gap_starts_another() -> None:
    steps = [ShadowStep("b", t * MIN_NS, 0.1, 0.9) for t in (0, 1, 2, 10, 11)]  # a gap after minute 2
    verdict = compare(
        steps, [], [], serving_threshold=0.5, challenger_threshold=0.5, horizon_s=HORIZON_S, cadence_s=60.0
    )
    assert verdict.steps == len(steps)
    assert verdict.challenger.false_alarms == 2
    assert verdict.failures == 0


# -- over a real service --------------------------------------------------------------------------


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def challenger(stub_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("challenger") / "model"
    shutil.copytree(stub_model, out)
    manifest = json.loads((out / "manifest.json").read_text())
    write_threshold(out, 0.6, manifest["files"]["model.txt"], {"why": "a test"})
    return out


def test_a_shadowed_challenger_is_scored_on_the_same_samples_and_promoted_only_when_better(
    stub_model: Path, challenger: Path, tmp_path: Path
) -> None:
    fleet = FleetConfig(nodes=1, gpus_per_node=8, days=0.05, seed=11)
    state = tmp_path / "state"
    config = ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), grace_s=3600.0, archive=False)
    service = Service.open(stub_model, state, config, actuator=NoopActuator(), metrics=ServiceMetrics())
    port = service.start("127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            admin = apb_grpc.AdminStub(channel)
            model_id = admin.AddModel(apb.AddModelRequest(path=str(challenger), why="retrained")).model.id
            shadowed = admin.ShadowModel(apb.ShadowModelRequest(id=model_id, why="try it"))
            assert shadowed.event.kind == apb.MODEL_EVENT_KIND_SHADOWED
            assert admin.ListModels(apb.ListModelsRequest()).shadow_id == model_id

            samples = list(twin_snapshots(TwinSource(fleet, 0), "node-a", 40))
            assert push(channel, "node-a", samples)[-1].acked_through == len(samples)
            service.score_now()
            both = service.store.shadow_steps.steps
            _until(
                lambda: any(
                    s.challenger_risk is not None and s.serving_risk is not None for s in both(model_id)
                )
            )
            paired = [
                s for s in both(model_id) if s.challenger_risk is not None and s.serving_risk is not None
            ]
            # The same samples, the same booster (the stub's): the same risk under both, no alert from either.
            assert {(s.serving_risk, s.challenger_risk) for s in paired} == {(STUB_RISK, STUB_RISK)}
            assert not service.store.alerts.read_after(0, ["node-a"])

            failed_at = samples[30].time_unix_nano
            service.store.labels.add(
                [FailureLabel("node-a", 2, FailureMode.HBM_WEAR, failed_at, LabelSource.KERNEL_LOG)], "ops"
            )
            verdict = admin.CompareShadow(apb.CompareShadowRequest())
            assert (verdict.failures, verdict.serving.caught, verdict.challenger.caught) == (1, 0, 0)
            assert not verdict.better
            assert verdict.steps == len(paired)

            with pytest.raises(grpc.RpcError) as refused:
                admin.PromoteModel(apb.PromoteModelRequest(id=model_id, why="looks fine"))
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "does not catch more" in (refused.value.details() or "")
            assert service.model.threshold == STUB_THRESHOLD

            forced = admin.PromoteModel(apb.PromoteModelRequest(id=model_id, why="a fix", force=True))
            assert "forced over the shadow's comparison" in forced.event.why
            assert service.model.threshold == 0.6
            assert service.shadow is None  # the challenger serves: its shadow is over
            assert admin.ListModels(apb.ListModelsRequest()).shadow_id == ""
    finally:
        service.stop(0)


def test_a_restart_resumes_the_shadow_and_stop_ends_it(
    stub_model: Path, challenger: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = Service.open(stub_model, state, ServiceConfig(archive=False), metrics=ServiceMetrics())
    entry, _ = first.add_model(str(challenger), "ops", "retrained")
    first.shadow_model(entry.id, "ops", "try it")
    first.store.close()

    again = Service.open(stub_model, state, ServiceConfig(archive=False), metrics=ServiceMetrics())
    again.start("127.0.0.1:0")
    try:
        assert again.shadow is not None
        assert again.shadow.model_id == entry.id == content_digest(challenger)[:16]
        again.stop_shadow("ops", "enough")
        assert again.shadow is None
        kinds = [e.kind.value for e in again.registry.events.all()]
        assert kinds == ["added", "shadowed", "shadow_stopped"]
    finally:
        again.stop(0)
