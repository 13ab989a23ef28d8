"""The model registry's log in the state database: every model added, promoted and rolled back, with
who did it and why, in order. Which model serves, and what a rollback returns to, follow from it
(service/model_registry.py); the log itself is only appended to."""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field

from faultcast.service.state.db import StateDatabase


class ModelEventKind(enum.StrEnum):
    """What happened to a model in the registry."""

    ADDED = "added"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


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
