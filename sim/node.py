"""One node of the twin: its traits, its schedule, and its telemetry chunk after chunk."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import cache

import numpy as np

from faultcast.sim.config import FleetConfig
from faultcast.sim.fleet import gpu_uuid, node_traits
from faultcast.sim.generate import (
    HOST_METRICS,
    HOST_WIDE,
    IB_METRICS,
    IB_WIDE,
    IF_METRICS,
    IF_WIDE,
    PEER_METRICS,
    PEER_WIDE,
    NodeChunk,
    NodeState,
    generate_chunk,
)
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


def aggregate_network(
    ib: np.ndarray, iface: np.ndarray, peers: np.ndarray, host: np.ndarray
) -> dict[str, np.ndarray]:
    """One node-level value per network metric (the network.parquet columns).

    Port counters add up over ports; a port's state, physical state and rate take the worst port
    (a single port down shows); peer round trips and loss take the worst peer, probes add up.
    Arrays carry any leading shape: (..., ports, metrics), (..., 1, metrics), (..., peers, metrics).
    """
    out: dict[str, np.ndarray] = {}
    for k, m in enumerate(IB_METRICS):
        column = ib[..., k]
        out[m.name] = column.min(axis=-1) if m.name in _WORST_PORT else column.sum(axis=-1, dtype=np.float64)
    for k, m in enumerate(IF_METRICS):
        out[m.name] = iface[..., 0, k].astype(np.float64)
    for k, m in enumerate(PEER_METRICS):
        column = peers[..., k]
        out[m.name] = (
            column.sum(axis=-1, dtype=np.float64) if m.name == "peer_probes" else column.max(axis=-1)
        )
    for k, m in enumerate(HOST_METRICS):
        out[m.name] = host[..., k].astype(np.float64)
    # Gauges as float32 (what the file stores); sums of counters stay exact in float64.
    return {
        name: values if name in NETWORK_WIDE else values.astype(np.float32) for name, values in out.items()
    }


NETWORK_WIDE = frozenset(
    m.name for ms, wide in ((IB_METRICS, IB_WIDE), (IF_METRICS, IF_WIDE), (PEER_METRICS, PEER_WIDE),
                            (HOST_METRICS, HOST_WIDE)) for m, w in zip(ms, wide, strict=True) if w
)  # fmt: skip


_WORST_PORT = frozenset({"ib_port_state", "ib_port_phys_state", "ib_port_rate_gbps"})
