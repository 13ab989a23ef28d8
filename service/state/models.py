"""The model registry's log in the state database: every model added, promoted, rolled back and
shadowed, with who did it and why, in order. Which model serves, what a rollback returns to and which
challenger is shadowed follow from it (service/model_registry.py); the log itself is only appended to.
Beside it, the shadow's scored steps (`ShadowSteps`): per node and step, each model's highest risk."""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from dataclasses import dataclass, field

from faultcast.service.state.db import StateDatabase


class ModelEventKind(enum.StrEnum):
    """What happened to a model in the registry."""

    ADDED = "added"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    SHADOWED = "shadowed"  # made the challenger, scored beside the serving model
    SHADOW_STOPPED = "shadow_stopped"


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """One entry of the log. `from_model_id`: the model that served before a promotion or a rollback
    ("" for an addition, or when none of the registry's served). `detail`: an addition's source path
    and card summary (threshold, trained_at, training data)."""

    kind: ModelEventKind
    model_id: str
    by: str
    why: str
    from_model_id: str = ""
    detail: dict[str, str] = field(default_factory=dict)
    id: int = 0  # given when stored
    recorded_ns: int = 0  # the service's clock when stored


class ModelEvents:
    """The registry's log: append one event, read them all."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def record(self, event: ModelEvent) -> ModelEvent:
        """Store `event` and return it with its id and time; StateWriteError when the database refused it."""
        now = time.time_ns()
        row = (event.kind.value, event.model_id, event.from_model_id, event.by, event.why,
               json.dumps(event.detail, sort_keys=True), now)  # fmt: skip
        stored = self._db.checked_write(
            "models",
            lambda db: (
                db.execute(
                    "INSERT INTO model_events (kind, model_id, from_model_id, recorded_by, why, detail, "
                    "recorded_ns) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    row,
                ).lastrowid
            ),
        )
        return ModelEvent(event.kind, event.model_id, event.by, event.why, event.from_model_id,
                          dict(event.detail), int(stored or 0), now)  # fmt: skip

    def all(self) -> list[ModelEvent]:
        """Every event, oldest first."""
        rows = self._db.read(
            "SELECT id, kind, model_id, from_model_id, recorded_by, why, detail, recorded_ns "
            "FROM model_events ORDER BY id"
        )
        return [
            ModelEvent(ModelEventKind(kind), str(model), str(by), str(why), str(source),
                       {str(k): str(v) for k, v in json.loads(detail).items()}, int(id_), int(ns))
            for id_, kind, model, source, by, why, detail, ns in rows
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ShadowStep:
    """One node's grid step under both models: the highest GPU risk of each (None: that model has not
    scored the step, or scored no GPU of it)."""

    node: str
    time_ns: int
    serving_risk: float | None
    challenger_risk: float | None


class ShadowSteps:
    """The shadow window's steps, per challenger; each model's risk is written when it scores the step."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    def record(self, challenger: str, column: str, risks: list[tuple[str, int, float]], keep_ns: int) -> None:
        """Store each (node, time_ns, risk) as `column` ("serving" or "challenger") of `challenger`'s
        steps, and forget steps older than `keep_ns` before the newest; StateWriteError when refused."""
        if column not in {"serving", "challenger"}:
            raise ValueError(f"no such column: {column}")
        if not risks:
            return
        name = f"{column}_risk"  # one of two fixed names, never from outside
        newest = max(t for _, t, _ in risks)

        def write(_: sqlite3.Connection) -> None:
            with self._db.transaction() as db:
                db.executemany(
                    f"INSERT INTO shadow_steps (challenger, node, time_ns, {name}) VALUES (?, ?, ?, ?) "  # noqa: S608
                    f"ON CONFLICT (challenger, node, time_ns) DO UPDATE SET {name} = excluded.{name}",
                    [(challenger, node, t, risk) for node, t, risk in risks],
                )
                db.execute("DELETE FROM shadow_steps WHERE time_ns < ?", (newest - keep_ns,))

        self._db.checked_write("models", write)

    def steps(self, challenger: str) -> list[ShadowStep]:
        """`challenger`'s steps, by node and time."""
        rows = self._db.read(
            "SELECT node, time_ns, serving_risk, challenger_risk FROM shadow_steps WHERE challenger = ? "
            "ORDER BY node, time_ns",
            (challenger,),
        )
        return [
            ShadowStep(str(node), int(t), None if s is None else float(s), None if c is None else float(c))
            for node, t, s, c in rows
        ]
