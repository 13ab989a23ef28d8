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
    """One node of the twin, generated a chunk (config.chunk_steps steps) at a time from its own random
    streams: its data does not depend on the other nodes, nor on who asks for it. `scenarios` on
    other nodes are ignored."""

    def __init__(self, config: FleetConfig, node: int, scenarios: Iterable[Scenario] = ()) -> None:
        self.config = config
        self.node = node
        self.scenarios = tuple(s for s in scenarios if s.node == node)
        check_gpus(config, self.scenarios)
        self.traits = node_traits(config, node)
        self.schedule = node_schedule(config, node, self.scenarios)
        self.state = NodeState.initial(config, self.traits)
        self._state_at_chunk_start = copy.deepcopy(self.state)

    def next_chunk(self) -> NodeChunk:
        """The next chunk of telemetry, advancing the node's state; the first call gives steps from 0."""
        self._state_at_chunk_start = copy.deepcopy(self.state)
        return generate_chunk(self.config, self.traits, self.schedule, self.state, self.state.chunks_done)

    def redo_chunk(self, scenarios: Iterable[Scenario]) -> NodeChunk:
        """Regenerate the chunk last returned under a new schedule (a scenario injected mid-chunk)."""
        self.scenarios = tuple(s for s in scenarios if s.node == self.node)
        check_gpus(self.config, self.scenarios)
        self.schedule = node_schedule(self.config, self.node, self.scenarios)
        self.state = copy.deepcopy(self._state_at_chunk_start)
        return self.next_chunk()

    def uuid(self, gpu: int, replacements: int) -> str:
        """The UUID of slot `gpu` after `replacements` swaps (see faultcast.sim.fleet.gpu_uuid)."""
        return _uuid(self.config.seed, self.node, gpu, replacements)


def check_gpus(config: FleetConfig, scenarios: Iterable[Scenario]) -> None:
    """ValueError for a scenario on a GPU the node does not have."""
    for s in scenarios:
        if s.gpu is not None and not 0 <= s.gpu < config.gpus_per_node:
            raise ValueError(
                f"scenario {s.arg()}: GPU {s.gpu} does not exist (the node has GPUs 0..{config.gpus_per_node - 1})"
            )


@cache
def _uuid(seed: int, node: int, gpu: int, replacements: int) -> str:
    return gpu_uuid(seed, node, gpu, replacements)
