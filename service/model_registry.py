"""The model registry: the models a service may serve, kept in its state directory, and a log of who
added, promoted and rolled back which, and why.

Each model added is copied into `<state_dir>/models/<id>/`, where `id` is the first 16 hex digits of
its content digest (model/digest.py): the same model added twice is one entry, and the copy the
service serves cannot change under it when the source directory is retrained over. The log is a
table of the state database (service/state/models.py); which model serves follows from it:

- a promotion puts a model on top of a stack of the models that served, a rollback takes the top off,
  and the model on top serves (the stack is the log replayed: nothing else is stored);
- the first promotion of a service that serves a model from outside the registry (`--model`, the
  shipped model) adds that one first, under the promoter's name, so that a rollback can return to it.

Promotion and rollback swap the serving model without a restart (`reload`, Service.reload): a reload
that refuses the model records nothing and the refusal says why. At start the service serves the
registry's model, whatever `--model` says (Service.open logs which and why).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from faultcast.model.artifact import FaultModel, ModelError, load
from faultcast.model.digest import DigestError, content_digest
from faultcast.service.scoring import model_version
from faultcast.service.state.models import ModelEvent, ModelEventKind, ModelEvents
from faultcast.service.state.store import StateStore

log = logging.getLogger(__name__)

MODELS_DIR = "models"  # beside the state database
ID_DIGITS = 16  # of the content digest: a model's id
_MIN_PREFIX = 6  # the shortest id prefix an admin may type
# Reload the model at a path: (loaded, the version serving now, why not).
Reload = Callable[[str], tuple[bool, str, str]]


class Refusal(Enum):
    """Why the registry said no, as the Admin API answers it."""

    NOT_FOUND = "not_found"  # no registered model has that id
    FAILED_PRECONDITION = "failed_precondition"  # not now: nothing to roll back to, a reload refused it
    INVALID_ARGUMENT = "invalid_argument"  # not a model (corrupt, unreadable), an ambiguous id


class RegistryRefusedError(Exception):
    """What the registry would not do, and why (`refusal`); nothing was recorded."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class RegisteredModel:
    """A model in the registry: its id, its full content digest, where its copy lies, the event that
    added it (who, why, source, card summary) and whether it serves now."""

    id: str
    digest: str
    path: Path
    added: ModelEvent
    serving: bool


class ModelRegistry:
    """The registry of one state directory; safe to call from any thread (one change at a time)."""

    def __init__(
        self, root: Path, events: ModelEvents, on_event: Callable[[ModelEvent], None] | None = None
    ) -> None:
        """`root`: where the copies lie (`<state_dir>/models`, created at the first addition);
        `on_event`: told of every event logged (the service's metrics)."""
        self.root = root
        self.events = events
        self.on_event = on_event
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------

    def stack(self) -> list[str]:
        """The ids of the models that served, in order; the last serves now (empty: none of the
        registry's serves, the service serves what it was started with)."""
        served: list[str] = []
        for event in self.events.all():
            if event.kind is ModelEventKind.PROMOTED:
                if not served and event.from_model_id:
                    served.append(event.from_model_id)
                served.append(event.model_id)
            elif event.kind is ModelEventKind.ROLLED_BACK and served:
                served.pop()
        return served

    def shadowing(self) -> str | None:
        """The id of the challenger shadowed now: the newest `shadowed` event's model, unless a later
        event stopped the shadow or promoted that model (None: no shadow)."""
        challenger: str | None = None
        for event in self.events.all():
            if event.kind is ModelEventKind.SHADOWED:
                challenger = event.model_id
            elif event.kind is ModelEventKind.SHADOW_STOPPED or (
                event.kind is ModelEventKind.PROMOTED and event.model_id == challenger
            ):
                challenger = None
        return challenger

    def serving(self) -> str | None:
        """The id of the registry's model that serves, or None when none does."""
        served = self.stack()
        return served[-1] if served else None

    def path_of(self, model_id: str) -> Path:
        """Where the registry keeps the copy of `model_id`."""
        return self.root / model_id

    def models(self) -> list[RegisteredModel]:
        """Every model added, oldest first."""
        serving = self.serving()
        added = [e for e in self.events.all() if e.kind is ModelEventKind.ADDED]
        return [
            RegisteredModel(e.model_id, e.detail.get("digest", ""), self.path_of(e.model_id), e,
                            e.model_id == serving)
            for e in added
        ]  # fmt: skip

    def find(self, text: str) -> RegisteredModel:
        """The model whose id or digest starts with `text`; RegistryRefusedError when none or several do."""
        text = text.strip().lower()
        if len(text) < _MIN_PREFIX:
            raise RegistryRefusedError(
                Refusal.INVALID_ARGUMENT, f"a model id has at least {_MIN_PREFIX} hex digits, got {text!r}"
            )
        found = [m for m in self.models() if m.digest.startswith(text) or m.id.startswith(text)]
        if not found:
            raise RegistryRefusedError(
                Refusal.NOT_FOUND, f"no registered model has id {text!r} (`faultcast models list`)"
            )
        if len(found) > 1:
            names = ", ".join(m.id for m in found)
            raise RegistryRefusedError(Refusal.INVALID_ARGUMENT, f"{text!r} names several models: {names}")
        return found[0]

    # -- changing -----------------------------------------------------------------------------

    def add(self, source: Path, by: str, why: str) -> tuple[RegisteredModel, bool]:
        """Copy the model at `source` into the registry and log it; (its entry, True when it was
        there already: then nothing is copied or logged). RegistryRefusedError (INVALID_ARGUMENT) for a
        directory that is no model that loads; StateWriteError when the log refused it."""
        with self._lock:
            return self._add(source, by, why)

    def _add(self, source: Path, by: str, why: str) -> tuple[RegisteredModel, bool]:
        if not source.is_dir():
            raise RegistryRefusedError(Refusal.INVALID_ARGUMENT, f"{source} is not a model directory")
        try:
            digest = content_digest(source)
        except DigestError as exc:
            raise RegistryRefusedError(Refusal.INVALID_ARGUMENT, str(exc)) from exc
        model_id = digest[:ID_DIGITS]
        for known in self.models():
            if known.id == model_id:
                return known, True
        self.root.mkdir(parents=True, exist_ok=True)
        copy = self.root / f".adding-{model_id}-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(copy, ignore_errors=True)
        try:
            # The copy is what is checked and served: a source rewritten meanwhile is caught here.
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns(".*"))
            copied = content_digest(copy)
            if copied != digest:
                raise RegistryRefusedError(
                    Refusal.FAILED_PRECONDITION, f"{source} changed while it was copied: add it again"
                )
            model = load(copy)
        except (ModelError, DigestError, OSError) as exc:
            shutil.rmtree(copy, ignore_errors=True)
            if isinstance(exc, ModelError | DigestError):
                raise RegistryRefusedError(
                    Refusal.INVALID_ARGUMENT, f"{source} is not a model the service can serve: {exc}"
                ) from exc
            raise
        except BaseException:
            shutil.rmtree(copy, ignore_errors=True)
            raise
        final = self.path_of(model_id)
        shutil.rmtree(final, ignore_errors=True)  # a copy an interrupted addition left, never logged
        copy.rename(final)
        event = self._record(
            ModelEvent(ModelEventKind.ADDED, model_id, by, why, detail=_card(source, digest, model))
        )
        log.info("model %s added to the registry by %s from %s: %s", model_id, by, source, why)
        return RegisteredModel(model_id, digest, final, event, False), False

    def promote(self, text: str, by: str, why: str, reload: Reload, serving_dir: Path) -> ModelEvent:
        """Serve the registered model `text` names (`reload`), then log it; `serving_dir`: where the
        model serving now came from (added first when the registry has none serving). A model that
        serves already, or that the reload refuses, is refused (FAILED_PRECONDITION), nothing logged."""
        with self._lock:
            target = self.find(text)
            served = self.stack()
            current = served[-1] if served else self._id_of(serving_dir)
            if current == target.id:
                raise RegistryRefusedError(Refusal.FAILED_PRECONDITION, f"model {target.id} serves already")
            self._check_copy(target)
            if not served and current is not None and current not in {m.id for m in self.models()}:
                # So that a rollback can return to what served before the registry's first promotion.
                try:
                    self._add(serving_dir, by, f"served before the first promotion (from {serving_dir})")
                except (RegistryRefusedError, OSError) as exc:
                    log.warning(
                        "%s cannot be added to the registry (%s): no rollback to it", serving_dir, exc
                    )
                    current = None
            self._reload(reload, target.id)
            return self._record(
                ModelEvent(ModelEventKind.PROMOTED, target.id, by, why, from_model_id=current or "")
            )

    def rollback(self, by: str, why: str, reload: Reload) -> ModelEvent:
        """Serve again the model that served before the one serving now (`reload`), then log it;
        FAILED_PRECONDITION when none did or the reload refuses it, nothing logged."""
        with self._lock:
            served = self.stack()
            if len(served) < 2:
                raise RegistryRefusedError(
                    Refusal.FAILED_PRECONDITION,
                    "nothing to roll back to: no promotion of the registry's is in force",
                )
            found = [m for m in self.models() if m.id == served[-2]]
            if not found:
                raise RegistryRefusedError(
                    Refusal.FAILED_PRECONDITION, f"model {served[-2]}, which served before, is not registered"
                )
            back_to = found[0]
            self._check_copy(back_to)
            self._reload(reload, back_to.id)
            return self._record(
                ModelEvent(ModelEventKind.ROLLED_BACK, back_to.id, by, why, from_model_id=served[-1])
            )

    def shadow(self, text: str, by: str, why: str, start: Callable[[RegisteredModel], None]) -> ModelEvent:
        """Make the registered model `text` names the challenger: `start` (the service's: loads it and
        scores it beside the serving model, raising RegistryRefusedError when it cannot), then log it.
        A model serving now cannot be its own challenger (FAILED_PRECONDITION)."""
        with self._lock:
            target = self.find(text)
            if target.id == self.serving():
                raise RegistryRefusedError(
                    Refusal.FAILED_PRECONDITION, f"model {target.id} serves: it cannot be its own challenger"
                )
            self._check_copy(target)
            start(target)
            return self._record(
                ModelEvent(ModelEventKind.SHADOWED, target.id, by, why, from_model_id=self.shadowing() or "")
            )

    def stop_shadow(self, by: str, why: str) -> ModelEvent:
        """End the shadow (FAILED_PRECONDITION when none runs) and log it."""
        with self._lock:
            challenger = self.shadowing()
            if challenger is None:
                raise RegistryRefusedError(Refusal.FAILED_PRECONDITION, "no challenger is shadowed")
            return self._record(ModelEvent(ModelEventKind.SHADOW_STOPPED, challenger, by, why))

    def _record(self, event: ModelEvent) -> ModelEvent:
        stored = self.events.record(event)
        if self.on_event is not None:
            self.on_event(stored)
        return stored

    def _check_copy(self, model: RegisteredModel) -> None:
        """The registry's copy is still the model that was added (not removed or edited since)."""
        try:
            digest = content_digest(model.path)
        except DigestError as exc:
            raise RegistryRefusedError(
                Refusal.FAILED_PRECONDITION, f"the registry's copy of model {model.id} is damaged: {exc}"
            ) from exc
        if digest != model.digest:
            raise RegistryRefusedError(
                Refusal.FAILED_PRECONDITION,
                f"the registry's copy of model {model.id} was changed since it was added "
                f"(digest {digest[:ID_DIGITS]}): add the model again",
            )

    def _reload(self, reload: Reload, model_id: str) -> None:
        loaded, _, error = reload(str(self.path_of(model_id)))
        if not loaded:
            raise RegistryRefusedError(
                Refusal.FAILED_PRECONDITION, f"the service refused model {model_id}: {error}"
            )

    def _id_of(self, model_dir: Path) -> str | None:
        """The registry id of a model directory (its copy's name, or its digest's head)."""
        if model_dir.parent == self.root:
            return model_dir.name
        try:
            return content_digest(model_dir)[:ID_DIGITS]
        except DigestError:
            return None


def of_store(store: StateStore, on_event: Callable[[ModelEvent], None] | None = None) -> ModelRegistry:
    """The registry of an open state store (its copies in `models/` beside the database). A command
    such as `faultcast retrain` may add to it while the service runs: the log is the database's (one
    transaction per event), each copy is made aside and renamed, and the service reads both afresh."""
    return ModelRegistry(store.path.parent / MODELS_DIR, store.models, on_event)


def _card(source: Path, digest: str, model: FaultModel) -> dict[str, str]:
    """What `list` shows of a model without loading it again: where it came from and its card."""
    card = model.card
    data = card.training_data
    return {
        "digest": digest,
        "source": str(source.resolve()),
        "version": model_version(model),
        "threshold": f"{model.threshold:.6g}",
        "trained_at": card.created_at or "",
        "training_data": data.path if data is not None else "",
    }


def choose_at_start(model_dir: Path, registry: ModelRegistry) -> Path:
    """The model directory a starting service serves: the registry's serving model when it has one
    whose copy is intact (a promotion outlives restarts and upgrades: an operator who promoted a model
    expects it to serve until they roll it back), else `model_dir`. Each choice is logged, with why."""
    model_id = registry.serving()
    if model_id is None:
        return model_dir
    chosen = registry.path_of(model_id)
    try:
        digest = content_digest(chosen)
    except DigestError as exc:
        log.error(
            "the registry's serving model %s is damaged (%s); serving %s instead: add and promote a model, "
            "or roll back",
            model_id,
            exc,
            model_dir,
        )
        return model_dir
    if digest[:ID_DIGITS] != model_id:
        log.error(
            "the registry's copy of serving model %s was changed since it was added; serving %s instead",
            model_id,
            model_dir,
        )
        return model_dir
    try:
        given = content_digest(model_dir)[:ID_DIGITS]
    except DigestError:
        given = "unreadable"
    if given != model_id:
        log.warning(
            "serving the registry's model %s (%s), not --model %s (%s): the registry's promotion holds "
            "until `faultcast models promote` or `rollback` changes it",
            model_id,
            chosen,
            model_dir,
            given,
        )
    else:
        log.info("serving the registry's model %s, the same as --model %s", model_id, model_dir)
    return chosen
