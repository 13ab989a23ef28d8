"""Static facts about each node: hardware generation, rack, and each GPU's manufacturing spread."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import numpy as np

from faultcast.sim.config import A100, H100, FleetConfig, Generation
from faultcast.sim.streams import Stream, rng


@dataclass(frozen=True)
class NodeTraits:
    """What a node is for its whole life: hardware, rack, each GPU's spread, its ports and probe targets.
    Per-GPU arrays have one entry per GPU slot."""

    index: int
    name: str
    generation: Generation
    rack: int
    rack_inlet_c: float  # the rack's mean inlet temperature
    temp_offset_c: np.ndarray  # (G,) manufacturing spread and position in the chassis
    power_offset_w: np.ndarray  # (G,)
    # Confounder: a few healthy GPUs show a steady low correctable-error rate and never fail of it.
    steady_sbe_per_min: np.ndarray  # (G,)
    ib_ports: tuple[str, ...]
    peers: tuple[str, ...]


def _rack_inlet(config: FleetConfig, rack: int) -> float:
    r = rng(config.seed, Stream.TRAITS, 1_000_000 + rack)
    hot = 4.0 if r.random() < 0.15 else 0.0  # a few racks sit in a hot aisle
    return 22.0 + r.normal(0.0, 1.5) + hot


def node_traits(config: FleetConfig, node: int) -> NodeTraits:
    """Node `node`'s traits, drawn from its own stream: the same for a seed whatever the fleet's size."""
    r = rng(config.seed, Stream.TRAITS, node)
    g = config.gpus_per_node
    generation = H100 if r.random() < config.h100_fraction else A100
    rack = node // config.nodes_per_rack
    steady = (
        np.where(r.random(g) < 0.03, r.uniform(0.01, 0.08, g), 0.0) if config.confounders else np.zeros(g)
    )
    peer_count = config.peers
    return NodeTraits(
        index=node,
        name=config.node_name(node),
        generation=generation,
        rack=rack,
        rack_inlet_c=_rack_inlet(config, rack),
        temp_offset_c=r.normal(0.0, 2.0, g),
        power_offset_w=r.normal(0.0, 0.012 * generation.tdp_w, g),
        steady_sbe_per_min=steady,
        ib_ports=tuple(f"mlx5_{p}:1" for p in range(config.ib_ports)),
        # Probe targets: the next nodes of the same rack (names do not depend on the fleet's size).
        peers=tuple(
            config.node_name(rack * config.nodes_per_rack + (node + k + 1) % config.nodes_per_rack) + ":22"
            for k in range(peer_count)
        ),
    )


def gpu_uuid(seed: int, node: int, gpu: int, replacement: int) -> str:
    """The UUID of the GPU in a slot after `replacement` swaps; a replaced GPU gets a new one."""
    data = rng(seed, Stream.UUID, node, gpu, replacement).bytes(16)
    return f"GPU-{uuid.UUID(bytes=data, version=4)}"


def ambient_c(t_unix_s: np.ndarray) -> np.ndarray:
    """Daily inlet cycle: +-2 C around the rack's mean, warmest mid-afternoon (UTC)."""
    hour = (t_unix_s % 86_400.0) / 3600.0
    return 2.0 * np.sin(2.0 * math.pi * (hour - 9.0) / 24.0)
