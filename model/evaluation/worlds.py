"""Which world a dataset came from, and whether the model was trained on it (leave-world-out).

The twin's data manifests carry `"world": {"family": str, "seed": int | null, "id": str}`, the id a
stable hash of the world's parameters; older data and imports carry none. The model's card records
its training data's manifest (`training_data.manifest`), so a model trained on one world and
evaluated on another can say so. A figure measured on the world the model was trained on flatters it,
even on held-out nodes and days: the same failure modes, precursors and noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class World:
    """A world as a data manifest names it; any part may be unknown."""

    id: str | None
    family: str | None
    seed: int | None

    def to_json(self) -> dict[str, Any]:
        """The world as the report writes it."""
        return {"id": self.id, "family": self.family, "seed": self.seed}


def world_of(manifest: Mapping[str, Any] | None) -> World | None:
    """The world a data manifest names under "world"; None when it names none."""
    section = manifest.get("world") if manifest is not None else None
    return _world(section)


def _world(section: object) -> World | None:
    if not isinstance(section, Mapping):
        return None
    ident, family, seed = section.get("id"), section.get("family"), section.get("seed")
    return World(
        ident if isinstance(ident, str) and ident else None,
        family if isinstance(family, str) else None,
        seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )


def training_world_ids(manifest: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ids of the worlds a model's training data came from: its "world", and each of "worlds"
    when data pooled from several worlds lists them."""
    if manifest is None:
        return ()
    sections = [manifest.get("world")]
    pooled = manifest.get("worlds")
    if isinstance(pooled, list):
        sections += pooled
    worlds = [_world(s) for s in sections]
    return tuple(dict.fromkeys(w.id for w in worlds if w is not None and w.id is not None))


def _parameters(manifest: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The world's parameters as the twin's config records them (what its id hashes), if it does."""
    config = manifest.get("config") if manifest is not None else None
    world = config.get("world") if isinstance(config, Mapping) else None
    return world if isinstance(world, Mapping) else None


@dataclass(frozen=True)
class WorldCheck:
    """The evaluated world against the training worlds."""

    evaluated: World | None
    training_ids: tuple[str, ...]
    held_out_from_training: bool  # the model's own training data: its held-out nodes and days
    unseen_world: bool | None  # None: the manifests do not say
    compared: str | None  # how it was told: "data", "id", "parameters", or None

    @property
    def title(self) -> str:
        """What the evaluation is, for the table's title."""
        if self.held_out_from_training:
            return "held-out nodes and days of the training world (flatters the model)"
        if self.unseen_world:
            return "leave-world-out (the model never saw this world)"
        if self.unseen_world is False:
            return "other data of the training world (flatters the model)"
        return "other data; the manifests do not say whether the model saw this world"

    def to_json(self) -> dict[str, Any]:
        """The report's "world" block."""
        evaluated = self.evaluated or World(None, None, None)
        return {
            **evaluated.to_json(),
            "training_ids": list(self.training_ids),
            "unseen_world": self.unseen_world,
            "compared_by": self.compared,
            "evaluation": self.title,
        }


def check_world(
    data_manifest: Mapping[str, Any], training_manifest: Mapping[str, Any] | None, same_data: bool
) -> WorldCheck:
    """Whether the model saw the world of the data. Seen when the data is the training data itself
    (`same_data`); else by the world ids when both sides have one; else by the world's parameters
    in both configs (a model card that kept the config but not the "world" block); else unknown."""
    evaluated = world_of(data_manifest)
    trained = training_world_ids(training_manifest)
    ours, theirs = _parameters(data_manifest), _parameters(training_manifest)
    if same_data:
        return WorldCheck(evaluated, trained, True, False, "data")
    if evaluated is not None and evaluated.id is not None and trained:
        return WorldCheck(evaluated, trained, False, evaluated.id not in trained, "id")
    if ours is not None and theirs is not None:
        return WorldCheck(evaluated, trained, False, dict(ours) != dict(theirs), "parameters")
    return WorldCheck(evaluated, trained, False, None, None)
