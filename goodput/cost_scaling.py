"""The measured costs of a small job carried to a large one, as an estimate.

Each cost is a fixed part plus a bytes part. The fixed part is the measured time that the bytes do not
explain (measured bytes / measured bandwidth taken away), carried unchanged: process start, agreement,
framework overhead. The bytes part is what one node of the large job hands over (its share of the
training state) over that job's bandwidth. Restarts and migrations also pay an extra fixed
re-initialisation (communicators at thousands of GPUs) that a two-rank benchmark cannot show.
docs/goodput.md ("Measured costs") gives the sources of the defaults and what is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from faultcast.goodput.engine import JobCosts
from faultcast.goodput.measured_costs import PRESCHEDULED, MeasuredCosts
from faultcast.goodput.process import GPUS_PER_NODE

PARAMETERS = 70e9
"""The large job's size by default: a 70B-parameter model, Llama 3's middle one."""
BYTES_PER_PARAM = 16.0
"""Mixed-precision Adam's training state as ZeRO counts it: bf16 weights (2) + bf16 gradients (2) + fp32
master weights (4) + two fp32 moments (8). A checkpoint needs 14 of them (no gradients): 16 errs on the
side of more bytes."""
COPY_BYTES_PER_S_PER_GPU = 25e9
"""GPU to host memory, per GPU: PCIe Gen5 x16 carries 64 GB/s a direction on paper, 25-50 GB/s in
practice; the low end, since eight GPUs share the host's memory."""
NETWORK_BYTES_PER_S_PER_NODE = 25e9
"""A replacement node pulling a snapshot from a peer: one 200 Gb/s NIC (Llama 3's nodes had eight
400 Gb/s ones on the training fabric)."""
STORAGE_BYTES_PER_S = 2e12
"""Checkpoint storage for the whole cluster: Llama 3's Tectonic sustained 2 TB/s (7 TB/s peak)."""
REINIT_S = 150.0
"""Extra fixed cost of every restart and migration at scale: PyTorch reports about 2.5 minutes of NCCL
initialisation above some thousands of GPUs on the default path (NVIDIA/nccl#1156); tuned stacks
report far less."""


@dataclass(frozen=True, slots=True)
class LargeJob:
    """The job the costs are carried to; ValueError for a size that is not positive and finite, or a
    shard count outside 1..nodes."""

    parameters: float
    gpus: int
    bytes_per_param: float = BYTES_PER_PARAM
    shard_nodes: int | None = None  # nodes the state is split over (None: every node, full sharding)
    gpus_per_node: int = GPUS_PER_NODE

    def __post_init__(self) -> None:
        for name in ("parameters", "bytes_per_param"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"gpus and gpus_per_node must be at least 1, got {self.gpus}, {self.gpus_per_node}"
            )
        if self.shard_nodes is not None and not 1 <= self.shard_nodes <= self.nodes:
            raise ValueError(
                f"shard_nodes must be between 1 and the job's {self.nodes} nodes, got {self.shard_nodes}"
            )

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def state_bytes(self) -> float:
        """The training state a checkpoint holds."""
        return self.parameters * self.bytes_per_param

    @property
    def shards(self) -> int:
        return self.shard_nodes if self.shard_nodes is not None else self.nodes

    @property
    def bytes_per_node(self) -> float:
        """What one node holds and hands over: its shard (with fewer shards than nodes, groups of nodes
        hold replicas of the same shard)."""
        return self.state_bytes / self.shards


@dataclass(frozen=True, slots=True)
class Bandwidths:
    """The large job's bandwidths in bytes per second (assumptions: see the module constants);
    ValueError for one that is not positive and finite."""

    copy_per_gpu: float = COPY_BYTES_PER_S_PER_GPU
    network_per_node: float = NETWORK_BYTES_PER_S_PER_NODE
    storage_total: float = STORAGE_BYTES_PER_S

    def __post_init__(self) -> None:
        for name in ("copy_per_gpu", "network_per_node", "storage_total"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive and finite (bytes/s), got {value}")


@dataclass(frozen=True, slots=True)
class Assumptions:
    """Everything the estimate assumes beyond the measurement; ValueError for a negative re-init."""

    job: LargeJob
    bandwidths: Bandwidths = Bandwidths()
    reinit_s: float = REINIT_S

    def __post_init__(self) -> None:
        if not (self.reinit_s >= 0 and math.isfinite(self.reinit_s)):
            raise ValueError(f"reinit_s must be a finite number of seconds >= 0, got {self.reinit_s}")

    @property
    def copy_per_node(self) -> float:
        """GPU to host memory for a whole node: its GPUs copy side by side."""
        return self.bandwidths.copy_per_gpu * self.job.gpus_per_node

    @property
    def storage_per_node(self) -> float:
        """A node's read or write to checkpoint storage while every node does the same: its share of the
        storage, at most its NIC."""
        return min(self.bandwidths.network_per_node, self.bandwidths.storage_total / self.job.nodes)

    def to_json(self) -> dict[str, object]:
        j = self.job
        return {
            "parameters": j.parameters,
            "bytes_per_param": j.bytes_per_param,
            "gpus": j.gpus,
            "nodes": j.nodes,
            "shards": j.shards,
            "state_bytes": j.state_bytes,
            "bytes_per_node": j.bytes_per_node,
            "copy_bytes_per_s_per_gpu": self.bandwidths.copy_per_gpu,
            "network_bytes_per_s_per_node": self.bandwidths.network_per_node,
            "storage_bytes_per_s": self.bandwidths.storage_total,
            "reinit_s": self.reinit_s,
        }


@dataclass(frozen=True, slots=True)
class ScaledCost:
    """One cost: measured on the small job, split into fixed and bytes parts, carried to the large one."""

    name: str  # the JobCosts field
    what: str
    measured_s: float
    measured_bytes: float
    measured_bandwidth: float  # bytes/s; the bytes part is 0 where nothing is moved
    bytes: float  # the large job's, per node
    bandwidth: float  # the large job's, bytes/s per node
    extra_s: float = 0.0  # re-initialisation at scale
    write_s: float = 0.0  # a migration's snapshot is written whole before it is acknowledged
    measured_write_s: float = 0.0  # that write in the measurement (not part of the fixed part)

    @property
    def fixed_s(self) -> float:
        """The measured time the bytes do not explain (0 when they explain all of it)."""
        return max(
            0.0, self.measured_s - self.measured_bytes / self.measured_bandwidth - self.measured_write_s
        )

    @property
    def bytes_s(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def total_s(self) -> float:
        return self.fixed_s + self.bytes_s + self.extra_s + self.write_s

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "what": self.what,
            "measured_s": self.measured_s,
            "fixed_s": self.fixed_s,
            "bytes_per_node": self.bytes,
            "bandwidth_bytes_per_s": self.bandwidth,
            "bytes_s": self.bytes_s,
            "extra_s": self.extra_s,
            "write_s": self.write_s,
            "total_s": self.total_s,
        }


def scale(measured: MeasuredCosts, assumptions: Assumptions) -> tuple[ScaledCost, ...]:
    """The measured costs carried to the large job, one per cost the engine takes from the file."""
    per_node = assumptions.job.bytes_per_node
    copy, storage = assumptions.copy_per_node, assumptions.storage_per_node
    path = measured.path
    # A prescheduled replacement pulls the doomed node's snapshot from it; after a requeue every node
    # loads from checkpoint storage at once.
    move = assumptions.bandwidths.network_per_node if path.name == PRESCHEDULED else storage
    return (
        ScaledCost(
            "checkpoint_s",
            "periodic checkpoint (its blocking host copy)",
            measured.checkpoint_blocking_s,
            measured.state_bytes,
            measured.copy_bytes_per_s,
            per_node,
            copy,
        ),
        ScaledCost(
            "snapshot_s",
            "snapshot (its blocking host copy)",
            path.snapshot_blocking_s,
            measured.state_bytes,
            measured.copy_bytes_per_s,
            per_node,
            copy,
        ),
        ScaledCost(
            "migrate_s",
            f"migration after the snapshot ({path.name})",
            path.after_snapshot_s,
            path.bytes_moved,
            measured.load_bytes_per_s,
            per_node,
            move,
            assumptions.reinit_s,
            # Only then is the standby told to go (or the job requeued): the write is on the path.
            write_s=background_write_s(assumptions),
            measured_write_s=path.snapshot_write_s,
        ),
        ScaledCost(
            "restart_s",
            "crash restart once noticed (requeue, checkpoint from storage)",
            measured.restart_s,
            measured.requeue.bytes_moved,
            measured.load_bytes_per_s,
            per_node,
            storage,
            assumptions.reinit_s,
        ),
        ScaledCost("react_s", "alert to snapshot start", measured.react_s, 0.0, 1.0, 0.0, 1.0),
    )


def job_costs(
    scaled: Sequence[ScaledCost], detect_s: float, drain_s: float, evident_detect_s: float | None = None
) -> JobCosts:
    """The engine's costs from the scaled estimate; crash detection and drain from the caller."""
    by_name = {c.name: c.total_s for c in scaled}
    return JobCosts(
        checkpoint_s=by_name["checkpoint_s"],
        snapshot_s=by_name["snapshot_s"],
        detect_s=detect_s,
        restart_s=by_name["restart_s"],
        migrate_s=by_name["migrate_s"],
        react_s=by_name["react_s"],
        drain_s=drain_s,
        evident_detect_s=evident_detect_s,
    )


def background_write_s(assumptions: Assumptions) -> float:
    """How long a checkpoint's background write to storage takes once its host copy is done: one copy
    of each shard, every shard at once, limited by the storage and by each writer's NIC. It must end
    before the next checkpoint starts, which the engine does not check."""
    j, b = assumptions.job, assumptions.bandwidths
    return max(j.state_bytes / b.storage_total, j.bytes_per_node / b.network_per_node)
