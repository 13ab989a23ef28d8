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
from faultcast.service import scoring_state
from faultcast.service.config import ServiceConfig
from faultcast.service.rpc.validation import Limits
from faultcast.service.scoring import Scorer
from faultcast.service.scoring_state import FORMAT, NodeState, StateRefused, decode, encode
from faultcast.service.server import Service
from faultcast.service.state.scoring import SavedState
from faultcast.service.state.store import StateStore
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


def test_a_node_that_stops_sending_pins_no_journal_segment(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]
) -> None:
    # A dead node is saved once more (its last steps) and then needs nothing of the journal: the
    # segments go as the live nodes are saved. (Before: it pinned the segment of its last save.)
    service = _service(service_model, tmp_path / "state")
    service.journal.segment_bytes = 40_000  # about two samples a segment
    dead = [replace(s, node="dead-node") for s in samples[:20]]
    _feed(service, dead)
    with service._scoring:
        service._save_states(["dead-node"])
    _feed(service, samples[:60])  # the live node goes on, saved every 10 steps
    segments = service.journal.segments()
    service.store.close()
    assert service.journal.segment > 30  # many segments were written ...
    assert len(segments) <= 12  # ... and only those since the live node's last save are kept
    assert min(segments) > 20  # none of the dead node's


def _one_saved_state(service_model: Path, state: Path, samples: list[NodeSnapshot]) -> SavedState:
    """The state a service saves of its one node after 30 samples and a stop."""
    first = _service(service_model, state)
    _feed(first, samples[:30])
    first.stop()
    (saved,) = _saved(state)
    return saved


def test_a_state_that_decodes_but_is_not_made_of_a_nodes_parts_is_refused(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot], caplog: pytest.LogCaptureFixture
) -> None:
    # Planted in the state database: a blob whose alert part is a scorer's state. It stopped every
    # start with an AttributeError; now the node starts over and the service starts.
    state = tmp_path / "state"
    good = decode(_one_saved_state(service_model, state, samples).state)
    _replace_state(state, encode(NodeState(good.scoring, good.scoring)))  # type: ignore[arg-type]

    second = _service(service_model, state)
    with caplog.at_level(logging.ERROR):
        second.recover()
    second.store.close()
    assert "not made of a node's states" in caplog.text


def _as_saved_before_the_move(state: NodeState) -> bytes:
    """`state` as a service from before the model's subpackages saved it: the same pickle, its
    classes named by their old modules (protocol 3 names each as text, `c<module>\\n<name>\\n`)."""
    raw = pickle.dumps(state, protocol=3)
    for old, new in scoring_state._MOVED.items():
        raw = raw.replace(f"c{new}\n".encode(), f"c{old}\n".encode())
    assert b"cfaultcast.model.online\n" in raw
    assert b"cfaultcast.model.features\n" in raw
    assert b"faultcast.model.features." not in raw  # no class left under its new module
    return FORMAT + zlib.compress(raw)


def test_a_state_saved_before_the_model_subpackages_is_taken_back(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service upgraded across the move of the feature modules (model/features.py and its parts into
    # model/features/) goes on from its nodes' saved states instead of warming every node up again.
    saved = _one_saved_state(service_model, tmp_path / "state", samples)
    today = decode(saved.state)
    before = _as_saved_before_the_move(today)
    # The same state, in today's classes (compared as protocol-3 pickles: protocol 5's own bytes are
    # not stable across a round trip even for today's blob).
    assert pickle.dumps(decode(before), protocol=3) == pickle.dumps(today, protocol=3)
    monkeypatch.setattr(scoring_state, "_MOVED", {})
    with pytest.raises(StateRefused, match=r"names faultcast\.model\."):
        decode(before)  # without the map of moved modules it was refused


class _Clock:
    """The service's clock, moved by the test (silence is judged on it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _two_nodes(service_model: Path, state: Path) -> tuple[Service, _Clock]:
    service = _service(service_model, state)
    clock = _Clock()
    service.book.clock = clock
    return service, clock


def _calm(count: int) -> list[NodeSnapshot]:
    """A healthy node beside the warned one (so that the warned one's silence is its own)."""
    return [replace(s, spool_id=9) for s in twin_snapshots(TwinSource(FLEET, 0), FLEET.node_name(0), count)]


def test_a_kill_between_a_silences_clear_and_the_nodes_save_leaves_no_alert_open(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]
) -> None:
    # The review's repro: the alert came back to life in the book (the log had it CLEARED), the
    # active gauge stayed at 1, and when the node spoke again a second CLEARED was stored.
    state = tmp_path / "state"
    first, clock = _two_nodes(service_model, state)
    calm = _calm(len(samples))
    i = 0
    for i, (node, other) in enumerate(zip(samples, calm, strict=True)):  # noqa: B007 (i read after)
        clock.now += 60.0
        first._ingest(node)
        first._ingest(other)
        if any(e.kind == apb.EVENT_KIND_OPENED for e in _score_events(first)):
            break
    for other in calm[i + 1 : i + 10]:  # the warned node stops; the silence clear is stored ...
        clock.now += 60.0
        first._ingest(other)
        _score_events(first)
        if first.book.check_silence(announce=False):
            break  # ... and the service is killed before the node is saved
    assert first.store.alerts.open_now() == []

    second, clock = _two_nodes(service_model, state)
    second.recover()
    assert second.book.active() == []
    assert NAME in second.book.silent_nodes()
    later = [replace(s, spool_id=7) for s in _later(samples[i].time_unix_nano)]
    for node in later:  # it speaks again
        clock.now += 60.0
        second._ingest(node)
        _score_events(second)
    kinds = [(e.opened_id, e.kind) for e in second.store.alerts.read_after(0, [NAME], 1000)]
    second.store.close()
    assert len(kinds) == len(set(kinds))  # no event of an alert stored twice
    assert sum(kind == apb.EVENT_KIND_CLEARED for _, kind in kinds) == len({o for o, _ in kinds})


def test_a_journal_tail_lost_after_an_event_leaves_the_logs_alert_held_not_opened_twice(
    service_model: Path, tmp_path: Path, samples: list[NodeSnapshot]
) -> None:
    # A power cut: the log (fsynced) keeps an OPENED event, the journal (not fsynced) loses its last
    # samples, and the node was not saved after the event. Its open alert must be held and judged
    # by the next scores, not left open for ever while a second one opens.
    state = tmp_path / "state"
    first = _service(service_model, state)
    segment = first.journal.directory / f"{first.journal.segment:012d}.log"
    sizes = []
    i = 0
    for i, node in enumerate(samples):  # noqa: B007 (i read after)
        first._ingest(node)
        sizes.append(segment.stat().st_size)
        with first._scoring:
            scored = first.scorer.score_pending()
            stored = first.book.observe(scored, announce=False)
            if any(e.kind == apb.EVENT_KIND_OPENED for e in stored):
                break  # the power goes before the node is saved
            first._save_states(sorted(first.scorer.due_for_saving({s.node for s in scored}, 10)))
    first.store.close()
    with segment.open("r+b") as journal:
        journal.truncate(sizes[i - 3])  # the last three samples lost with the power
    second = _service(service_model, state)
    second.recover()
    _score(second)
    (opened,) = second.store.alerts.open_now()
    _feed(second, samples[i + 1 : i + 2])  # its next sample: the lost alert is held again
    assert [a.opened_id for a in second.book.active()] == [opened.opened_id]
    _feed(second, samples[i + 2 : i + 20])
    events = second.store.alerts.read_after(0, [NAME], 1000)
    second.store.close()
    assert [e.opened_id for e in events if e.kind == apb.EVENT_KIND_OPENED] == [opened.opened_id]


def _score_events(service: Service) -> list[apb.Alert]:
    with service._scoring:
        scored = service.scorer.score_pending()
        stored = service.book.observe(scored, announce=False)
        due = service.scorer.due_for_saving({s.node for s in scored}, CONFIG.checkpoint_steps)
        service._save_states(sorted({e.node for e in stored} | due))
    return stored


def _later(after_nano: int) -> list[NodeSnapshot]:
    """The warned node's healthy samples twenty minutes and more after `after_nano`."""
    source = TwinSource(FLEET, NODE)
    return [
        s
        for s in twin_snapshots(source, NAME, int(FAIL_S / 60) + 40)
        if s.time_unix_nano > after_nano + 20 * 60e9
    ][:15]


def test_a_state_that_does_not_fit_the_model_is_refused_and_other_nodes_keep_their_steps(
    stub_model: Path, tmp_path: Path, samples: list[NodeSnapshot], caplog: pytest.LogCaptureFixture
) -> None:
    # Tampered: a queued step with features of another shape was taken back silently, and the first
    # scoring tick failed on it, losing the other nodes' restored steps with it.
    state = tmp_path / "state"
    first = _service(stub_model, state)
    calm = _calm(11)
    for node, other in zip(samples[:10], calm[:10], strict=True):
        first._ingest(node)
        first._ingest(other)
        _score(first)
    first._ingest(samples[10])  # each completes a step, saved in its queue (killed before scoring)
    first._ingest(calm[10])
    with first._scoring:
        first._save_states(first.scorer.nodes())
    first.store.close()
    store = StateStore.in_dir(state)
    (saved,) = [s for s in store.scoring.load() if s.node == NAME]
    tampered = decode(saved.state)
    (step,) = tampered.scoring.queued
    step.features = np.zeros((step.features.shape[0], step.features.shape[1] + 3))
    store.scoring.save([replace(saved, state=encode(tampered))])
    store.close()

    second = _service(stub_model, state)
    with caplog.at_level(logging.ERROR):
        second.recover()
    scored = second.scorer.score_pending()
    second.store.close()
    (refusal,) = [r.getMessage() for r in caplog.records if "is not taken back" in r.getMessage()]
    assert refusal.startswith(f"the saved scoring state of node {NAME} is not taken back: its queued step")
    assert FLEET.node_name(0) in {s.node for s in scored}  # the other node's restored step is scored
    assert NAME in {s.node for s in scored}  # the refused node warmed up again from its journal


def test_a_step_the_model_cannot_score_is_dropped_alone_and_the_others_are_scored(
    stub_model: Path, samples: list[NodeSnapshot]
) -> None:
    # Whatever lets such a step through (a bug, a state the checks missed): the whole tick failed
    # on it, and every node's steps of that tick were lost with it.
    scorer = Scorer(load(stub_model))
    for node, other in zip(samples[:11], _calm(11), strict=True):
        scorer.add(node, 0.0)
        scorer.add(other, 0.0)
    queued = scorer.backlog()
    bad = next(s for s in scorer._queue if s.node == NAME)
    bad.features = np.zeros((bad.features.shape[0], bad.features.shape[1] + 3))
    scored = scorer.score_pending()
    assert scorer.unscorable == 1
    assert len(scored) == queued - 1
    assert bad not in scored
    assert FLEET.node_name(0) in {s.node for s in scored}
    assert all(s.risk.shape == (s.present.shape[0],) for s in scored)
