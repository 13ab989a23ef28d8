"""Saved scoring state (service/scoring_state.py) through real `Service` objects on a real state
directory: a service stopped cleanly, or dropped without stopping as a killed one is, and started
again goes on with the very risks of one that never stopped; a state that cannot be trusted
(damaged, planted, saved under other features) is not taken: the node starts over from the samples
its journal holds; one older than the node's newest stored event (a kill between the event's write
and the node's save) is taken, and the replay's events matched to the stored ones, none twice."""

from __future__ import annotations

import logging
import pickle
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.model.artifact import load
from faultcast.readings import NodeSnapshot
from faultcast.service.config import ServiceConfig
from faultcast.service.scoring_state import FORMAT, StateRefused, decode
from faultcast.service.server import Service
from faultcast.service.state import StateStore
from faultcast.service.state_scoring import SavedState
from faultcast.service.validation import Limits
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU = 2, 3
NAME = FLEET.node_name(NODE)
FAIL_S = 3 * 3600.0
CONFIG = ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0), checkpoint_steps=10)


@pytest.fixture(scope="module")
def samples() -> list[NodeSnapshot]:
    source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
    return [replace(s, spool_id=7) for s in twin_snapshots(source, NAME, int(FAIL_S / 60) - 10)]


def _service(model: Path, state: Path) -> Service:
    return Service(load(model), StateStore.in_dir(state), CONFIG, model_dir=model)


Scored = list[tuple[int, np.ndarray]]


def _feed(service: Service, samples: list[NodeSnapshot]) -> Scored:
    """Each sample through ingest and scoring, as the service's threads would; (step, risks) scored."""
    risks = []
    for sample in samples:
        service._ingest(sample)
        risks += _score(service)
    return risks


def _score(service: Service) -> Scored:
    with service._scoring:
        scored = service.scorer.score_pending()
        service.book.observe(scored)
        due = service.scorer.due_for_saving({s.node for s in scored}, CONFIG.checkpoint_steps)
        service._save_states(sorted(due))
    return [(s.step, s.risk.copy()) for s in scored]


@pytest.fixture
def steady(service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]) -> Iterator[Scored]:
    service = _service(service_model, tmp_path / "steady")
    yield _feed(service, samples)
    service.store.close()


@pytest.mark.parametrize("ending", ["stopped", "killed"])
def test_a_service_started_again_scores_on_as_if_it_never_stopped(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot], steady: Scored, ending: str
) -> None:
    state = tmp_path / "state"
    cut = len(samples) - 25  # within the precursor, a few steps after the last periodic save
    first = _service(service_model, state)
    before = _feed(first, samples[:cut])
    if ending == "stopped":
        first.stop()  # saves every node: nothing to replay
    # else: dropped as it is, as after kill -9: the last periodic save, and the journal after it
    second = _service(service_model, state)
    replayed = second.recover()
    after = _score(second) + _feed(second, samples[cut:])
    second.store.close()

    # Stopped, it saved everything; killed, the steps scored since its last save are scored again
    # from the journal (no event came of them: an event saves its node), with the same risks.
    again = len(before) + len(after) - len(steady)
    assert (replayed, again) == (0, 0) if ending == "stopped" else 0 < again < CONFIG.checkpoint_steps
    assert [step for step, _ in before[: len(before) - again] + after] == [step for step, _ in steady]
    scored = dict(steady)
    for step, risk in before + after:
        np.testing.assert_array_equal(risk, scored[step])


def _saved(state: Path) -> list[SavedState]:
    store = StateStore.in_dir(state)
    try:
        return store.scoring.load()
    finally:
        store.close()


def _replace_state(state: Path, blob: bytes | None = None, *, features: str | None = None) -> None:
    store = StateStore.in_dir(state)
    try:
        (saved,) = store.scoring.load()
        store.scoring.save([replace(saved, state=blob or saved.state, features=features or saved.features)])
    finally:
        store.close()


class _Planted:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, ("/tmp/faultcast-planted",))


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (FORMAT + zlib.compress(pickle.dumps(_Planted())), "names pathlib"),
        (FORMAT + b"not zlib at all", "damaged"),
        (b"PICKLE??" + pickle.dumps(1), "not a saved scoring state"),
    ],
)
def test_a_state_that_cannot_be_trusted_is_refused_and_the_node_starts_over(
    service_model: Path,
    tmp_path: Path,
    samples: list[NodeSnapshot],
    blob: bytes,
    says: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    Path("/tmp/faultcast-planted").unlink(missing_ok=True)
    with pytest.raises(StateRefused, match=says):
        decode(blob)
    state = tmp_path / "state"
    first = _service(service_model, state)
    _feed(first, samples[:30])
    first.stop()
    _replace_state(state, blob)

    second = _service(service_model, state)
    with caplog.at_level(logging.ERROR):
        replayed = second.recover()
    second.store.close()

    assert not Path("/tmp/faultcast-planted").exists()
    assert f"the saved scoring state of node {NAME} is not taken back" in caplog.text
    assert replayed == 30  # it starts over from the samples its journal still holds


def test_a_state_saved_under_other_features_is_left_and_the_node_starts_over(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]
) -> None:
    state = tmp_path / "state"
    first = _service(service_model, state)
    _feed(first, samples[:30])
    first.stop()
    _replace_state(state, features="another model's features")

    second = _service(service_model, state)
    assert second.recover() == 30  # it starts over from the samples its journal still holds
    second.store.close()


def _events(service: Service) -> list[tuple[str, int, int, str]]:
    """The node's stored events: kind, GPU, event time, and which alert (by order of opening)."""
    opened: dict[int, int] = {}
    out = []
    for e in service.store.alerts.read_after(0, [NAME], 10_000):
        which = opened.setdefault(e.opened_id, len(opened))
        out.append((apb.EventKind.Name(e.kind), e.gpu, e.time_unix_nano, str(which)))
    return out


def test_a_kill_between_an_events_write_and_its_nodes_save_stores_no_event_twice(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]
) -> None:
    steady = _service(service_model, tmp_path / "steady")
    _feed(steady, samples)
    want = _events(steady)
    steady.store.close()
    assert [kind for kind, *_ in want][:1] == ["EVENT_KIND_OPENED"]

    state = tmp_path / "state"
    first = _service(service_model, state)
    rest = iter(samples)
    for sample in rest:  # scored and saved as the service does, until an event is stored ...
        first._ingest(sample)
        with first._scoring:
            scored = first.scorer.score_pending()
            stored = first.book.observe(scored, announce=False)
            if stored:
                break  # ... and killed right after its write, before its node is saved
            first._save_states(sorted(first.scorer.due_for_saving({s.node for s in scored}, 10)))
    (saved,) = _saved(state)
    assert saved.log_head < first.store.alerts.last_id  # the saved state is older than the event

    second = _service(service_model, state)
    second.recover()
    _score(second)
    _feed(second, list(rest))
    got = _events(second)
    second.store.close()
    assert got == want  # the replay derived the stored events again and stored none of them twice
