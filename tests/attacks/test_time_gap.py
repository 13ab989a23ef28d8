"""A jump forward in a node's event time must cost the service a bounded amount of work
(nothing a caller sends may silence alerting). The probe: with --max-sample-age 0 --max-clock-skew 0
("no check"), a collector pushing only for its own node sent a sample stamped 1 s after the Unix
epoch and then one stamped now. The scorer stepped the feature engine through every model step of
the gap (~3e7 steps at ~1.5 ms each, on the gRPC event loop): ~13 h during which no Push, Health,
Subscribe or admin call was answered. Now a gap's empty steps past the first few are skipped in
one move that leaves the engine exactly as stepping through them would."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from faultcast import wire
from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import load
from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig, FeatureEngine
from faultcast.model.features.offline import Step
from faultcast.model.features.online import OnlineFeatures
from faultcast.readings import NodeSnapshot
from faultcast.service.scoring import Scorer
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc
from tests.attacks.victim import (
    FLEET,
    WAIT_S,
    assert_victim_alerted,
    serving,
)

ATTACKER = FLEET.node_name(0)
SECOND_NS = 1_000_000_000
YEAR_NS = 365 * 86_400 * SECOND_NS


def _twin_now_ns() -> int:
    """The time of the twin's first sample, which the victim's samples also start at."""
    (first,) = twin_snapshots(TwinSource(FLEET, 0, []), ATTACKER, 1)
    return first.time_unix_nano


def _push_stamped(channel: grpc.Channel, stamps: list[int]) -> list[tpb.PushAck]:
    """The attacker's own node's real twin readings, stamped as it likes, over one stream; with a
    deadline, so that a service that stopped answering fails the test instead of hanging it."""
    snapshots = twin_snapshots(TwinSource(FLEET, 0, []), ATTACKER, len(stamps))
    stamped = [replace(s, time_unix_nano=t) for s, t in zip(snapshots, stamps, strict=True)]

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello(ATTACKER, 1)
        for snapshot in stamped:
            yield tpb.PushRequest(sample=wire.to_proto(snapshot))

    return list(tpb_grpc.TelemetryStub(channel).Push(requests(), timeout=WAIT_S))


@pytest.fixture
def served(service_model: Path, tmp_path: Path) -> Iterator[tuple[Service, grpc.Channel]]:
    with serving(service_model, tmp_path / "state", tmp_path) as running:
        yield running


GAPS: dict[str, Callable[[int], list[int]]] = {
    "from-the-epoch-to-now": lambda now: [SECOND_NS, now],
    "from-now-to-ten-years-ahead": lambda now: [now, now + 10 * YEAR_NS],
    "to-the-last-representable-nanosecond": lambda now: [SECOND_NS, now, 2**63 - 1],
}


@pytest.mark.parametrize("gap", list(GAPS.values()), ids=list(GAPS))
def test_a_jump_in_event_time_leaves_the_service_answering_and_the_victim_alerted(
    served: tuple[Service, grpc.Channel], gap: Callable[[int], list[int]]
) -> None:
    _, channel = served
    stamps = gap(_twin_now_ns())
    acks = _push_stamped(channel, stamps)
    assert [list(a.rejections) for a in acks] == [[]] * len(stamps)  # taken: its own node, any time
    assert acks[-1].acked_through == len(stamps)
    checked = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
    assert checked.status == health_pb2.HealthCheckResponse.SERVING
    assert_victim_alerted(channel)  # the victim node still gets its alert


# -- the work one sample costs ----------------------------------------------------------------------

WORK_FLEET = FleetConfig(nodes=1, days=1.0, seed=2, confounders=False, failures=False, start_unix_s=0)


def _readings(count: int) -> list[NodeSnapshot]:
    source = TwinSource(WORK_FLEET, 0)
    out = []
    for _ in range(count):
        reading = source.read()
        assert reading.time_unix_nano is not None
        out.append(NodeSnapshot.merge("n0", reading.time_unix_nano, [reading], {}))
    return out


def _count_updates(engine: FeatureEngine) -> list[int]:
    """Count the engine's steps (calls of `update`) from now on: [count]."""
    calls = [0]
    update = engine.update

    def counted(
        step: int,
        gpu: np.ndarray,
        node: np.ndarray,
        is_h100: np.ndarray,
        summary: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        calls[0] += 1
        return update(step, gpu, node, is_h100, summary, history)

    engine.update = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("gap_steps", [10_000, 10**8])
def test_a_gap_of_any_length_costs_the_same_few_engine_steps(gap_steps: int) -> None:
    """The work one sample costs does not grow with the gap it jumps: counted in engine steps."""
    config = FeatureConfig()
    online = OnlineFeatures(config, ["n0"], 0.0)
    first, second = _readings(2)
    online.add(first)
    calls = _count_updates(online.engine)
    jump_ns = int(gap_steps * config.cadence_s) * SECOND_NS
    steps = online.add(replace(second, time_unix_nano=second.time_unix_nano + jump_ns))
    assert calls[0] == len(steps) <= 8  # the step of `first`, then a few empty ones, whatever the gap
    assert steps[0].present.any()
    assert not any(s.present.any() for s in steps[1:])
    # The next sample, one step on, completes the jumped-to step alone.
    after = replace(
        second, time_unix_nano=second.time_unix_nano + jump_ns + int(config.cadence_s) * SECOND_NS
    )
    (step,) = online.add(after)
    assert step.present.any()
    assert calls[0] == len(steps) + 1


def test_the_scorer_queues_a_bounded_number_of_steps_for_a_jump_and_says_so_once(
    service_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A jump queues a few steps, whatever its length; one past the feature windows is logged once
    per node, and a gap they still cover (a ten-minute outage) is not logged at all."""
    scorer = Scorer(load(service_model))
    now = _twin_now_ns()
    stamps = [SECOND_NS, SECOND_NS + 600 * SECOND_NS, now, now + YEAR_NS, now + 2 * YEAR_NS]
    snapshots = list(twin_snapshots(TwinSource(FLEET, 0, []), ATTACKER, len(stamps)))
    completed, logged = [], []
    with caplog.at_level(logging.WARNING, logger="faultcast.service.scoring"):
        for snapshot, stamp in zip(snapshots, stamps, strict=True):
            completed.append(scorer.add(replace(snapshot, time_unix_nano=stamp), 0.0))
            logged.append([r.getMessage() for r in caplog.records if "skipped unscored" in r.getMessage()])
    assert max(completed) <= 8
    assert scorer.backlog() == sum(completed)
    assert [len(m) for m in logged] == [0, 0, 1, 1, 1]  # once per node, not once per jump
    assert repr(ATTACKER) in logged[-1][0]
    scored = scorer.score_pending()
    assert [s.step for s in scored] == sorted(s.step for s in scored)


# -- skipping is exact ------------------------------------------------------------------------------


def _inputs(rng: np.random.Generator, slots: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    gpu = rng.uniform(0.0, 100.0, (slots, len(GPU_INPUTS)))
    gpu[rng.random(slots) < 0.3] = np.nan  # some GPUs absent in some steps
    node = rng.uniform(0.0, 10.0, (nodes, len(NODE_INPUTS)))
    return gpu, node


@pytest.mark.parametrize("gap", [1, 2, 4, 5, 12, 13, 14, 61, 62, 200])
def test_skipping_empty_steps_leaves_the_engine_as_stepping_through_them(gap: int) -> None:
    """Every feature after a skipped gap equals the feature after stepping through it: the windows,
    EWMAs, counters' last values, time since the last sample and the thermal baseline alike."""
    config = FeatureConfig(cadence_s=60.0, windows_s=(300.0, 600.0, 720.0), gpus_per_node=2)
    stepped, skipped = FeatureEngine(config, 2), FeatureEngine(config, 2)
    rng = np.random.default_rng(gap)
    h100 = np.array([1.0, 0.0, 1.0, 0.0])
    step = 0
    for _ in range(20):
        gpu, node = _inputs(rng, 4, 2)
        np.testing.assert_array_equal(
            stepped.update(step, gpu, node, h100), skipped.update(step, gpu, node, h100)
        )
        step += 1
    empty_gpu, empty_node = np.full((4, len(GPU_INPUTS)), np.nan), np.full((2, len(NODE_INPUTS)), np.nan)
    for k in range(gap):
        stepped.update(step + k, empty_gpu, empty_node, h100)
    skipped.skip(step, gap)
    step += gap
    for k in range(30):  # past the longest window: every window's sums leave the gap behind
        gpu, node = _inputs(rng, 4, 2)
        np.testing.assert_array_equal(
            stepped.update(step, gpu, node, h100), skipped.update(step, gpu, node, h100), err_msg=f"step {k}"
        )
        step += 1


def test_online_features_after_long_gaps_equal_those_of_stepping_through_them() -> None:
    """A node's samples with gaps of several lengths: each present step's features equal those of the
    same samples with an empty sample in every step of the gaps (which is stepped through)."""
    readings = _readings(600)
    cut = {*range(50, 52), *range(100, 161), *range(200, 262), *range(300, 500)}
    kept = [r for k, r in enumerate(readings) if k not in cut]
    filled = [r if k not in cut else replace(r, gpus=(), devices=()) for k, r in enumerate(readings)]

    def run(snapshots: list[NodeSnapshot]) -> dict[int, Step]:
        online = OnlineFeatures(FeatureConfig(), ["n0"], 0.0)
        steps = [s for snapshot in snapshots for s in online.add(snapshot)] + online.flush()
        return {s.index: s for s in steps if s.present.any()}

    gapped, reference = run(kept), run(filled)
    assert sorted(gapped) == sorted(reference)
    # Every sample's step, and the first step of each of the four gaps: a sample one interval late
    # is held (the GPU's reading until the next), a longer gap is missing.
    assert len(gapped) == len(kept) + 4
    for index, step in gapped.items():
        np.testing.assert_array_equal(step.features, reference[index].features, err_msg=f"step {index}")
