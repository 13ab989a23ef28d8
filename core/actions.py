"""The actions an alert recommends: one table, the vocabulary the model, the service and the client
share (faultcast.v1 RecommendedAction).

A member's value is its number in the alert contract (alerts.proto), so an Alert's `action` field
reads as one (`Action.of(alert.action)`). The numbers do not order the actions (the proto lists the
strongest first): `rank` does, and an open alert's action only ever rises in it. `asks_snapshot`: the
job snapshots for it; `moves_node`: the node is then drained and the job moved (the service's
remediation). The functions below read an Alert's `action` number directly, and give a number this
faultcast does not know (UNSPECIFIED, a newer service's) rank 0 and nothing to do.

A shared leaf: it imports the standard library alone, so the client, which otherwise needs only the
generated stubs, reads the same table (tests/test_actions.py holds it to the proto).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class _Facts:
    rank: int
    asks_snapshot: bool
    moves_node: bool


class Action(Enum):
    """What the job on the node should do, by its faultcast.v1 RecommendedAction number."""

    SNAPSHOT_AND_MIGRATE = 1
    SNAPSHOT_ONLY = 2
    WATCH = 3

    @classmethod
    def of(cls, number: int) -> Action | None:
        """The action an Alert's `action` number names; None for UNSPECIFIED or an unknown one."""
        return _BY_NUMBER.get(number)

    @property
    def rank(self) -> int:
        """How much it asks of the job: watch 1 < snapshot only 2 < snapshot and migrate 3."""
        return _FACTS[self].rank

    @property
    def asks_snapshot(self) -> bool:
        """The job snapshots for it (at its next step boundary) and acknowledges SNAPSHOT_DONE."""
        return _FACTS[self].asks_snapshot

    @property
    def moves_node(self) -> bool:
        """The node is drained and the job moved, after SNAPSHOT_DONE or the grace period."""
        return _FACTS[self].moves_node

    @property
    def proto_name(self) -> str:
        """Its faultcast.v1 RecommendedAction value's name."""
        return f"RECOMMENDED_ACTION_{self.name}"


_FACTS: dict[Action, _Facts] = {
    # A mode without a precursor: no snapshot schedule can be aimed at it. Informational.
    Action.WATCH: _Facts(rank=1, asks_snapshot=False, moves_node=False),
    # Cheap insurance: the failure does not yet look near or likely enough to drain.
    Action.SNAPSHOT_ONLY: _Facts(rank=2, asks_snapshot=True, moves_node=False),
    Action.SNAPSHOT_AND_MIGRATE: _Facts(rank=3, asks_snapshot=True, moves_node=True),
}
_BY_NUMBER: dict[int, Action] = {a.value: a for a in Action}


def action_rank(number: int) -> int:
    """The rank of the action an Alert's `action` number names (see Action.rank); 0 for none known."""
    action = Action.of(number)
    return action.rank if action is not None else 0


def asks_snapshot(number: int) -> bool:
    """Whether an Alert's `action` number asks the job for a snapshot."""
    action = Action.of(number)
    return action is not None and action.asks_snapshot


def moves_node(number: int) -> bool:
    """Whether an Alert's `action` number takes its node out (snapshot and migrate)."""
    action = Action.of(number)
    return action is not None and action.moves_node
