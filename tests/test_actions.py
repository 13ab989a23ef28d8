"""The recommended actions' table (faultcast.actions) against the contract: one entry per
RecommendedAction value, by its number and name, ranked as the proto orders them (strongest first);
which snapshot and which move the node; and what an Alert carrying a number this faultcast does not
know (UNSPECIFIED, a newer service's) asks: nothing.
"""

from __future__ import annotations

import pytest

from faultcast.actions import Action, action_rank, asks_snapshot, moves_node
from faultcast.v1 import alerts_pb2 as apb

PROTO = {number: name for name, number in apb.RecommendedAction.items()}
KNOWN = sorted(set(PROTO) - {apb.RECOMMENDED_ACTION_UNSPECIFIED})
UNKNOWN = [apb.RECOMMENDED_ACTION_UNSPECIFIED, max(PROTO) + 1, -1]


def test_every_action_of_the_proto_is_in_the_table_by_its_number_and_name() -> None:
    assert {a.value: a.proto_name for a in Action} == {n: PROTO[n] for n in KNOWN}
    for number in KNOWN:
        action = Action.of(number)
        assert action is not None
        assert action.proto_name == PROTO[number]


def test_the_ranks_follow_the_proto_strongest_first() -> None:
    """The proto numbers its actions strongest first (snapshot and migrate, snapshot only, watch);
    the ranks count up the other way, above the 0 of no action known."""
    strongest_first = sorted(Action, key=lambda a: a.rank, reverse=True)
    assert [a.value for a in strongest_first] == KNOWN
    assert [a.rank for a in strongest_first] == list(range(len(KNOWN), 0, -1))
    assert [action_rank(n) for n in KNOWN] == [Action(n).rank for n in KNOWN]


def test_snapshot_only_and_migrate_ask_for_a_snapshot_and_only_migrate_moves_the_node() -> None:
    snapshot = {a for a in Action if a.asks_snapshot}
    assert snapshot == {Action.SNAPSHOT_ONLY, Action.SNAPSHOT_AND_MIGRATE}
    assert {a for a in Action if a.moves_node} == {Action.SNAPSHOT_AND_MIGRATE}
    # What moves the node asks for a snapshot first, and outranks every action that asks for less.
    for a in Action:
        assert asks_snapshot(a.value) == a.asks_snapshot
        assert moves_node(a.value) == a.moves_node
        if not a.asks_snapshot:
            assert all(a.rank < b.rank for b in snapshot)
    assert {a.value for a in Action if a.moves_node} == {apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE}


@pytest.mark.parametrize("number", UNKNOWN)
def test_a_number_the_table_lacks_asks_for_nothing(number: int) -> None:
    assert Action.of(number) is None
    assert (action_rank(number), asks_snapshot(number), moves_node(number)) == (0, False, False)
