"""The node-history features online: the fleet's label log as a `FailureHistory` for the scorer.

A model trained with node history (faultcast.model.features.history) reads each GPU's and node's past
failures. Online they come from the label log (service/state/labels.py), merged as the training export
merges them (service/training_labels.py: one fault seen by several sources counts once; a failure an
operator took back, or a silent node no other source confirms, counts not at all), so that a model
retrained on the service's archive reads the same history it was trained on. The log is read again only
when it changed: one cheap query for a newer failure or verdict per scoring tick.

A failure counts from its start, as soon as the log holds it: a failure harvested from a kernel log an
hour late counts from then on, at its own time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from faultcast.model.features.history import FailureHistory
from faultcast.service.state.store import StateStore
from faultcast.service.training_labels import training_labels

_NS = 1e9


class LabelHistory:
    """The scorer's source of node history (`Scorer(history=...)`), read from `store`'s label log."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._failure_id = 0  # the newest failure and verdict ids read
        self._verdict_id = 0
        self._nodes: dict[str, int] = {}
        self._history: FailureHistory | None = None
        self.rebuilds = 0  # how often the log was read again (it changed)

    def rows(self, nodes: Sequence[str], time_s: np.ndarray, gpus_per_node: int) -> np.ndarray:
        """(len(nodes) * gpus_per_node, len(HISTORY_NAMES)): each GPU of `nodes[i]` at `time_s[i]`, from
        the failures the log holds that started before it."""
        history = self._current(gpus_per_node)
        ids = np.array([self._nodes.get(n, len(self._nodes)) for n in nodes], dtype=np.int64)
        g = gpus_per_node
        return history.rows(
            np.repeat(np.asarray(time_s, dtype=np.float64), g),
            np.repeat(ids, g),
            np.tile(np.arange(g, dtype=np.int64), len(ids)),
        )

    def _current(self, gpus_per_node: int) -> FailureHistory:
        labels = self.store.labels
        # The rows stored since the last read (none, almost always): their ids first, so that a label
        # stored while the log is merged below is read again at the next tick, never lost.
        failures = labels.failures(after_id=self._failure_id)
        verdicts = labels.verdicts(after_id=self._verdict_id)
        history = self._history
        if history is not None and not failures and not verdicts and history.gpus_per_node == gpus_per_node:
            return history
        self._failure_id = max([self._failure_id, *(f.id for f in failures)])
        self._verdict_id = max([self._verdict_id, *(v.id for v in verdicts)])
        merged = [f for f, _ in training_labels(self.store, horizon_s=0.0).failures]
        self._nodes = {name: i for i, name in enumerate(sorted({f.node for f in merged}))}
        self._history = FailureHistory(
            np.array([f.time_ns / _NS for f in merged], dtype=np.float64),
            np.array([self._nodes[f.node] for f in merged], dtype=np.int64),
            np.array([f.gpu for f in merged], dtype=np.int64),
            gpus_per_node,
        )
        self.rebuilds += 1
        return self._history
