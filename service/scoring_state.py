"""A node's saved scoring state: what a restart goes on from, so that a restart mid-incident gives
the same alert events as no restart.

A node's state is its features (the windows, baselines, and the step being filled: the scorer's
`NodeScoringState`) and its alert state (each GPU's runs toward opening and clearing, and the open
alerts with their shown mode and band: the alert book's `BookNodeState`). The service saves a node's
state when its alerts change (right after the events are stored), every `checkpoint_steps` scored
steps, when it falls silent, and at a clean stop; the samples it takes in between are in the sample
journal (service/state/sample_journal.py). At start, each node's state is taken back and its journalled
samples after it replayed: the node goes on exactly where it was.

A saved state is taken back only under what it was computed with: the features' signature (names
and settings) for the scorer's part, and the alert policy's (model version, threshold, policy,
actions) for the alert part; a state whose alert part does not match keeps its features, and its
open alerts are restored from the log as before (`AlertBook`'s restore). A node is saved after its
events are stored and before anyone hears of them; a kill between the two leaves a state older
than the node's newest events: the replay from it derives them again and each is matched to the one
stored (`AlertBook.expect`), none stored twice.

The blob is zlib-compressed pickle, read back by an unpickler that admits only the classes a state
is made of (numpy arrays and the model's and scorer's own classes): the state database is the
service's own, but a damaged or planted blob must not run code; it is refused and logged, and the
node starts over. So is one whose parts do not fit the model (a queued step's features of another
shape, runs for another number of GPUs): taken back, it would fail the first scoring tick, and with
it the restored steps of every other node.
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import zlib
from dataclasses import dataclass

import numpy as np

from faultcast.model.alert_content import ActionPolicy
from faultcast.model.artifact import FaultModel
from faultcast.service.alert_book import BookNodeState
from faultcast.service.scoring import NodeScoringState, ScoredStep, model_version

log = logging.getLogger(__name__)

FORMAT = b"FCSTATE1"
# The classes a saved state is made of (module, name), and the numpy functions its arrays need:
# nothing else is admitted, not even another class of the same modules.
_STATE_CLASSES = frozenset(
    {
        ("faultcast.catalogue", "Scope"),
        ("faultcast.readings", "DeviceReading"),
        ("faultcast.readings", "GpuReading"),
        ("faultcast.readings", "NodeSnapshot"),
        ("faultcast.step_summary", "StepSummary"),
        ("faultcast.model.features.engine", "FeatureConfig"),
        ("faultcast.model.features.engine", "FeatureEngine"),
        ("faultcast.model.features.engine", "_Rates"),
        ("faultcast.model.features.inputs", "InputConditioner"),
        ("faultcast.model.features.relative", "OwnBaseline"),
        ("faultcast.model.features.relative", "RateBaseline"),
        ("faultcast.model.features.steps", "StepFeatures"),
        ("faultcast.model.features.online", "OnlineFeatures"),
        ("faultcast.model.features.online", "_StepSummaries"),
        ("faultcast.model.features.windows", "Ring"),
        ("faultcast.model.features.windows", "Windowed"),
        ("faultcast.service.scoring", "NodeScoringState"),
        ("faultcast.service.scoring", "ScoredStep"),
        ("faultcast.service.alert_book", "BookNodeState"),
        ("faultcast.service.alert_book", "SavedIncident"),
        ("faultcast.service.scoring_state", "NodeState"),
    }
)
_NUMPY = frozenset(
    {
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "scalar"),
    }
)


class StateRefused(ValueError):  # noqa: N818 (a refusal with its reason, not a bug)
    """A saved state that cannot be taken back (damaged, from another format, or naming a class
    outside the allowed ones)."""


@dataclass
class NodeState:
    """Both parts of a node's state; `book` is None when the node had no alert state of its own yet
    (its open alerts, if any, were still the ones restored from the log)."""

    scoring: NodeScoringState
    book: BookNodeState | None


def features_signature(model: FaultModel) -> str:
    """What a saved feature state depends on: the feature names and settings."""
    text = repr((tuple(model.feature_names), model.feature_config))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def book_signature(model: FaultModel, actions: ActionPolicy, top_features: int) -> str:
    """What a saved alert state depends on: the model (its version names its threshold), the alert
    policy, and what the events carry."""
    text = repr((model_version(model), model.threshold, model.policy, actions, top_features))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode(state: NodeState) -> bytes:
    """The blob a node's state is saved as."""
    return FORMAT + zlib.compress(pickle.dumps(state, protocol=5), 1)


# Modules the state's classes lived in before the model's subpackages (the classes themselves are
# unchanged): a service upgraded across the move takes its nodes' saved states back, as after any
# restart, instead of refusing them and warming every node up again.
_MOVED = {
    "faultcast.model.features": "faultcast.model.features.engine",
    "faultcast.model.feature_inputs": "faultcast.model.features.inputs",
    "faultcast.model.feature_relative": "faultcast.model.features.relative",
    "faultcast.model.feature_steps": "faultcast.model.features.steps",
    "faultcast.model.online": "faultcast.model.features.online",
    "faultcast.model.windows": "faultcast.model.features.windows",
}


class _Admitted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        module = _MOVED.get(module, module)
        if (module, name) in _NUMPY:
            return super().find_class(module, name)
        if (module, name) in _STATE_CLASSES:
            return super().find_class(module, name)
        raise StateRefused(f"a saved state names {module}.{name}, which no saved state holds")


def decode(blob: bytes, model: FaultModel | None = None) -> NodeState:
    """The state a blob holds; StateRefused when it is damaged or not a state, or (given the model
    it is to be taken back under) when its parts do not fit that model (`check_fits`)."""
    if not blob.startswith(FORMAT):
        raise StateRefused("not a saved scoring state of this format")
    try:
        raw = zlib.decompress(blob[len(FORMAT) :])
        state = _Admitted(io.BytesIO(raw)).load()
    except StateRefused:
        raise
    except Exception as exc:  # anything a damaged blob makes pickle or zlib raise
        raise StateRefused(f"damaged ({type(exc).__name__}: {exc})") from exc
    if (
        not isinstance(state, NodeState)
        or not isinstance(state.scoring, NodeScoringState)
        or not (state.book is None or isinstance(state.book, BookNodeState))
    ):
        raise StateRefused(f"holds a {type(state).__name__} not made of a node's states")
    if model is not None:
        check_fits(state, model)
    return state


def check_fits(state: NodeState, model: FaultModel) -> None:
    """StateRefused unless every part of `state` has the shape `model` scores: its features' settings,
    its GPUs, each queued step's features and presence, and its alert runs."""
    g = model.feature_config.gpus_per_node
    features = (g, len(model.feature_names))
    scoring = state.scoring
    if scoring.online.config != model.feature_config:
        raise StateRefused("its features were computed under other settings")
    if len(scoring.uuids) != g:
        raise StateRefused(f"it holds {len(scoring.uuids)} GPUs' UUIDs, the model {g} GPUs")
    for step in scoring.queued:
        if not isinstance(step, ScoredStep):
            raise StateRefused(f"its queue holds a {type(step).__name__}, not a scored step")
        if not (_shaped(step.features, features) and _shaped(step.present, (g,)) and len(step.uuids) == g):
            raise StateRefused(f"its queued step {step.step} does not have the model's shape {features}")
    if state.book is not None and not _shaped(state.book.runs, (4, g)):
        raise StateRefused(f"its alert runs do not have the shape (4, {g})")


def _shaped(array: object, shape: tuple[int, ...]) -> bool:
    return isinstance(array, np.ndarray) and array.shape == shape
