"""Static facts about each node: hardware generation, rack, and each GPU's manufacturing spread."""

from __future__ import annotations

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
    temp_offset_c: np.ndarray  # (G,) position in the chassis (pre-warmed air) and manufacturing spread
    power_offset_w: np.ndarray  # (G,)
    # Look-alikes that stay with the hardware (sim/world.py says how common): a few healthy GPUs show
    # a steady correctable-error rate (and now and then a benign row remap) and never fail of it,
    # some have a PCIe replay trickle, a marginal NVLink or IB port, a link trained below its maximum.
    steady_sbe_per_min: np.ndarray  # (G,)
    remap_per_day: np.ndarray  # (G,)
    pcie_trickle_per_min: np.ndarray  # (G,)
    pcie_downtrained: np.ndarray  # (G,) 0 no, 1 width x8, 2 one generation down
    nvlink_marginal_per_min: np.ndarray  # (G,)
    ib_marginal_per_min: np.ndarray  # (P,)
    ib_ports: tuple[str, ...]
    peers: tuple[str, ...]


def _rack_inlet(config: FleetConfig, rack: int) -> float:
    r = rng(config.seed, Stream.TRAITS, 1_000_000 + rack)
    world = config.world
    hot = world.hot_rack_c if r.random() < world.hot_rack_share else 0.0  # a few racks sit in a hot aisle
    return 22.0 + r.normal(0.0, 1.5) + hot


def _some(r: np.random.Generator, share: float, median: float, sigma: float, n: int) -> np.ndarray:
    """A rate for a `share` of n items (lognormal around `median`), zero for the rest."""
    return np.where(r.random(n) < share, median * np.exp(sigma * r.standard_normal(n)), 0.0)


def node_frailty(config: FleetConfig, node: int) -> float:
    """How much more (or less) often node `node` fails than the fleet's average: gamma with mean 1 and the
    world's `frailty_shape` (the trace's servers differ this much, docs/fault-trace.md), 1 when it has none.
    Drawn from a stream of its own, so that worlds without it draw everything else exactly as before."""
    shape = config.world.frailty_shape
    if shape is None:
        return 1.0
    return float(rng(config.seed, Stream.HISTORY, node, 0).gamma(shape, 1.0 / shape))


def node_traits(config: FleetConfig, node: int) -> NodeTraits:
    """Node `node`'s traits, drawn from its own stream: the same for a seed whatever the fleet's size."""
    r = rng(config.seed, Stream.TRAITS, node)
    g = config.gpus_per_node
    generation = H100 if r.random() < config.h100_fraction else A100
    rack = node // config.nodes_per_rack
    peer_count = config.peers
    # Downstream slots breathe air the others warmed (0-8 C), plus manufacturing spread.
    temp_offset = r.uniform(0.0, 8.0, g) + r.normal(0.0, 1.5, g)
    power_offset = r.normal(0.0, 0.012 * generation.tdp_w, g)
    w, on = config.world, float(config.confounders)
    steady = on * _some(r, w.sbe_heavy_share, w.sbe_heavy_rate_per_min, 1.0, g)
    remaps = on * np.where(steady > 0, w.benign_remap_per_day, 0.01 * w.benign_remap_per_day)
    trickle = on * _some(r, w.pcie_trickle_share, w.pcie_trickle_per_min, 1.0, g)
    down = np.where(r.random(g) < on * w.pcie_downtrained_share, r.integers(1, 3, g), 0)
    marginal = on * _some(r, w.nvlink_marginal_share, w.nvlink_marginal_per_min, 1.5, g)
    ib_marginal = on * _some(r, w.ib_marginal_port_share, w.ib_marginal_per_min, 1.0, config.ib_ports)
    return NodeTraits(
        index=node,
        name=config.node_name(node),
        generation=generation,
        rack=rack,
        rack_inlet_c=_rack_inlet(config, rack),
        temp_offset_c=temp_offset,
        power_offset_w=power_offset,
        steady_sbe_per_min=steady,
        remap_per_day=remaps,
        pcie_trickle_per_min=trickle,
        pcie_downtrained=down,
        nvlink_marginal_per_min=marginal,
        ib_marginal_per_min=ib_marginal,
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
