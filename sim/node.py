"""One node of the twin: its traits, its schedule, and its telemetry chunk after chunk."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import cache

from faultcast.sim.config import FleetConfig
from faultcast.sim.fleet import gpu_uuid, node_traits
from faultcast.sim.generate import NodeChunk, NodeState, generate_chunk
from faultcast.sim.schedule import Scenario, node_schedule


class NodeTwin:
    def __init__(self, config: FleetConfig, node: int, scenarios: Iterable[Scenario] = ()) -> None:
        self.config = config
        self.node = node
        self.scenarios = tuple(s for s in scenarios if s.node == node)
        self.traits = node_traits(config, node)
        self.schedule = node_schedule(config, node, self.scenarios)
        self.state = NodeState.initial(config, self.traits)
        self._state_at_chunk_start = copy.deepcopy(self.state)

    def next_chunk(self) -> NodeChunk:
        self._state_at_chunk_start = copy.deepcopy(self.state)
        return generate_chunk(self.config, self.traits, self.schedule, self.state, self.state.chunks_done)

    def redo_chunk(self, scenarios: Iterable[Scenario]) -> NodeChunk:
        """Regenerate the chunk last returned under a new schedule (a scenario injected mid-chunk)."""
        self.scenarios = tuple(s for s in scenarios if s.node == self.node)
        self.schedule = node_schedule(self.config, self.node, self.scenarios)
        self.state = copy.deepcopy(self._state_at_chunk_start)
        return self.next_chunk()

    def uuid(self, gpu: int, replacements: int) -> str:
        return _uuid(self.config.seed, self.node, gpu, replacements)


@cache
def _uuid(seed: int, node: int, gpu: int, replacements: int) -> str:
    return gpu_uuid(seed, node, gpu, replacements)
