"""An alert's content is computed once: the scorer reads the model's heads for the rows near an
alert, and the alert book words its events from what they said, running no head again; the events
are exactly those of describing each row afresh (model/alert_content.describe), as before."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from faultcast.demo.feed import twin_snapshots
from faultcast.model.alert_content import median_ttf_s, read_heads
from faultcast.model.artifact import FaultModel, load
from faultcast.service.alert_book import AlertBook
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.scoring import NEAR_THRESHOLD, ScoredStep, Scorer
from faultcast.service.state.store import StateStore
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb

FLEET = FleetConfig(nodes=2, days=1.0, seed=77, acceleration=1.0)
FAIL_S = 1.5 * 3600.0
STEPS = int((FAIL_S + 10 * 60) / FLEET.cadence_s)


@pytest.fixture(scope="module")
def model(service_model: Path) -> FaultModel:
    return load(service_model)


def _scored(model: FaultModel) -> Iterator[list[ScoredStep]]:
    """Each batch the scorer gives for a twin whose node 0's GPU 3 wears out (node 1 healthy)."""
    scenarios = {0: [Scenario("hbm_wear", 0, 3, FAIL_S, 40 * 60.0)], 1: []}
    scorer = Scorer(model)
    feeds = [twin_snapshots(TwinSource(FLEET, n, s), FLEET.node_name(n), STEPS) for n, s in scenarios.items()]
    for i, batch in enumerate(zip(*feeds, strict=False)):
        for snapshot in batch:
            scorer.add(snapshot, float(i))
        yield scorer.score_pending()


@pytest.fixture(scope="module")
def batches(model: FaultModel) -> list[list[ScoredStep]]:
    return list(_scored(model))


def _events(model: FaultModel, batches: list[list[ScoredStep]], tmp: Path, *, afresh: bool) -> list[bytes]:
    """The events the book stores for the batches (ids aside: they number by the clock); `afresh`:
    without the scorer's heads, so that the book describes each row itself."""
    store = StateStore.in_dir(tmp)
    book = AlertBook(model, store, ServiceMetrics())
    for batch in batches:
        book.observe([dataclasses.replace(s, heads={}) if afresh else s for s in batch])
    events = store.alerts.read_after(0, limit=100_000)
    store.close()
    for event in events:
        event.id, event.opened_id = 0, 0
    return [e.SerializeToString() for e in events]


def test_the_scorer_keeps_what_the_heads_said_of_every_row_near_an_alert(
    model: FaultModel, batches: list[list[ScoredStep]]
) -> None:
    near = [(s, gpu) for batch in batches for s in batch for gpu in s.heads]
    assert near, "the wearing GPU comes near an alert"
    for s, gpu in near[:: max(1, len(near) // 20)]:
        row = s.features[gpu][None, :]
        fresh = read_heads(model, row, np.asarray([s.risk[gpu]]))
        kept = s.heads[gpu]
        for name in ("risk", "within", "ttf_s", "mode_probabilities"):
            np.testing.assert_array_equal(getattr(kept, name), getattr(fresh, name), err_msg=name)
        # The step's median time to failure is the heads' own, as the scorer always gave it.
        assert s.ttf_s[gpu] == median_ttf_s(fresh.risk, fresh.within, model.horizon_s)[0]
    # Exactly the rows near an alert carry heads: the heads ran where they did before, and every
    # row the book may describe has them.
    wanted = {
        (id(s), int(gpu))
        for batch in batches
        for s in batch
        for gpu in np.nonzero(s.present & (s.risk >= NEAR_THRESHOLD * model.open_threshold))[0]
    }
    assert {(id(s), gpu) for s, gpu in near} == wanted


def test_the_book_words_events_from_the_scorers_heads_exactly_as_describing_afresh(
    model: FaultModel, batches: list[list[ScoredStep]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    for head in ("risk", "risk_within", "mode_probabilities"):
        original = getattr(FaultModel, head)

        def counted(self: FaultModel, *args: object, _head: str = head, _run: object = original) -> object:
            ran.append(_head)
            return _run(self, *args)  # type: ignore[operator]

        monkeypatch.setattr(FaultModel, head, counted)
    afresh = _events(model, batches, tmp_path / "afresh", afresh=True)
    kinds = [apb.Alert.FromString(e).kind for e in afresh]
    assert {apb.EVENT_KIND_OPENED, apb.EVENT_KIND_UPDATED} <= set(kinds), kinds
    assert {"risk_within", "mode_probabilities"} <= set(ran)  # describing afresh runs the heads
    ran.clear()
    assert _events(model, batches, tmp_path / "once", afresh=False) == afresh
    assert ran == []  # the book ran no head: every alert's content came from the scorer's
