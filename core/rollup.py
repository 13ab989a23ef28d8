"""One node-level row of network values from a node's ports, interfaces, peers and host counters.

The twin's network.parquet and the service's online features both roll a node's devices up this
way, so a feature means the same offline and online. Port counters add up over ports; a port's
state, physical state and rate take the worst port (a single port down shows); peer round trips
and loss take the worst peer, probes add up; the first interface stands for the node's Ethernet.
"""

from __future__ import annotations

import numpy as np

from faultcast.catalogue import Kind, Metric, Scope, metrics_for

IB_METRICS = metrics_for(Scope.IB_PORT)
"""The InfiniBand port metrics, in the order of the last axis of rollup_network's `ib`."""
IF_METRICS = metrics_for(Scope.INTERFACE)
"""The interface metrics, in the order of the last axis of rollup_network's `iface`."""
PEER_METRICS = metrics_for(Scope.PEER)
"""The peer metrics, in the order of the last axis of rollup_network's `peers`."""
HOST_METRICS = metrics_for(Scope.HOST)
"""The host metrics, in the order of the last axis of rollup_network's `host`."""
NETWORK_COLUMNS: tuple[str, ...] = tuple(
    m.name for ms in (IF_METRICS, IB_METRICS, PEER_METRICS, HOST_METRICS) for m in ms
)
"""The columns rollup_network returns (interface, port, peer, then host metrics): network.parquet's
value columns."""
_WORST_PORT = frozenset({"ib_port_state", "ib_port_phys_state", "ib_port_rate_gbps"})


def is_wide(metric: Metric) -> bool:
    """Cumulative values are stored as float64 (a float32 counter of 1e10 moves in steps of 1,024,
    which would make per-second rates meaningless); gauges as float32."""
    return metric.kind is Kind.COUNTER or metric.name.endswith("_worst_link")


NETWORK_WIDE = frozenset(
    m.name for ms in (IB_METRICS, IF_METRICS, PEER_METRICS, HOST_METRICS) for m in ms if is_wide(m)
)
"""The network columns kept as float64 (see is_wide); the others are float32."""


def rollup_network(
    ib: np.ndarray, iface: np.ndarray, peers: np.ndarray, host: np.ndarray
) -> dict[str, np.ndarray]:
    """Node-level values from (..., ports, metrics), (..., interfaces, metrics), (..., peers, metrics)
    and (..., metrics) arrays in catalogue order; any leading shape (steps, nodes) is kept."""
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
