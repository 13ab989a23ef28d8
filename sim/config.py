"""The twin's configuration and the generations of hardware it knows."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from faultcast.sim.modes import MODES
from faultcast.sim.world import World

# 2026-01-05 00:00 UTC, a Monday: the default start of simulated time.
DEFAULT_START_UNIX_S = 1_767_571_200


@dataclass(frozen=True, slots=True)
class Generation:
    """Thermal and power envelope of one GPU generation (public datasheet figures, rounded)."""

    model_name: str
    tdp_w: float
    idle_w: float
    sm_boost_mhz: float
    mem_clock_mhz: float
    fb_total_mib: float
    pcie_gen: int
    nvlinks: int
    slowdown_temp_c: float  # SW thermal slowdown starts
    shutdown_temp_c: float  # HW thermal slowdown / shutdown region
    # Temperature rise over the inlet per watt, at steady state (sim/thermal.py splits it in two stages):
    # about 0.1 C/W for an air-cooled A100 and 0.04-0.07 for an H100 (loaded temperatures in Latif et
    # al. 2025 and NVIDIA's datasheets; docs/failure-modes.md).
    thermal_c_per_w: float


A100 = Generation("NVIDIA A100-SXM4-80GB", 400.0, 55.0, 1410.0, 1593.0, 81_920.0, 4, 12, 85.0, 92.0, 0.10)
"""The A100 SXM4 80 GB."""
H100 = Generation("NVIDIA H100 80GB HBM3", 700.0, 70.0, 1980.0, 2619.0, 81_559.0, 5, 18, 87.0, 92.0, 0.06)
"""The H100 SXM 80 GB; a node is one with probability FleetConfig.h100_fraction, else an A100."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Everything that decides a twin's output: the same config gives the same data. Raises ValueError
    naming every bad field. Times in seconds, `days` in days of simulated time."""

    nodes: int = 8
    gpus_per_node: int = 8
    days: float = 2.0
    cadence_s: float = 60.0
    seed: int = 0
    # Multiplies every failure rate, so a small fleet yields enough failures to learn from.
    acceleration: float = 1.0
    # Further multiplies the rates of some modes, as (mode, factor) pairs: training data with rare modes
    # weighted up (`faultcast train` weights their rows back down). Look-alikes are not multiplied.
    mode_acceleration: tuple[tuple[str, float], ...] = ()
    start_unix_s: int = DEFAULT_START_UNIX_S
    nodes_per_rack: int = 4
    nodes_per_job_pod: int = 2  # multi-node jobs run on pods of this many consecutive nodes
    h100_fraction: float = 0.5
    ib_ports: int = 4
    peers: int = 2
    chunk_steps: int = 1440  # generation unit; a day at 60 s
    failures: bool = True
    confounders: bool = True  # look-alikes on healthy hardware (the world says how often)
    notes: tuple[str, ...] = field(default=())
    world: World = field(default_factory=World)  # the median world unless drawn or read from a file

    def __post_init__(self) -> None:
        if isinstance(self.world, dict):  # FleetConfig(**config.to_json()) rebuilds the world too
            object.__setattr__(self, "world", World.from_json(self.world))
        problems = []
        if self.nodes < 1 or self.gpus_per_node < 1:
            problems.append("nodes and gpus_per_node must be at least 1")
        if not (self.days > 0 and math.isfinite(self.days)):
            problems.append(f"days must be positive, got {self.days}")
        if not self.cadence_s > 0:
            problems.append(f"cadence_s must be positive, got {self.cadence_s}")
        if self.acceleration < 0:
            problems.append(f"acceleration must be >= 0, got {self.acceleration}")
        # As pairs, whatever was given (a JSON manifest gives lists): hashable and in one order.
        pairs = tuple(sorted((str(m), float(f)) for m, f in self.mode_acceleration))
        object.__setattr__(self, "mode_acceleration", pairs)
        known = {m.name for m in MODES}
        for mode, factor in pairs:
            if mode not in known:
                problems.append(f"mode_acceleration: no mode {mode!r} (modes: {', '.join(sorted(known))})")
            if not (factor > 0 and math.isfinite(factor)):
                problems.append(f"mode_acceleration: {mode}'s factor must be positive, got {factor}")
        if len({m for m, _ in pairs}) < len(pairs):
            problems.append("mode_acceleration: a mode given twice")
        if not 0.0 <= self.h100_fraction <= 1.0:
            problems.append(f"h100_fraction must be within [0, 1], got {self.h100_fraction}")
        try:
            self.world.check()
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def horizon_s(self) -> float:
        """Simulated seconds from the start to the end of the run."""
        return self.days * 86_400.0

    @property
    def steps(self) -> int:
        """Samples per GPU over the horizon (whole intervals only)."""
        return int(self.horizon_s // self.cadence_s)

    @property
    def chunks(self) -> int:
        """Chunks of chunk_steps steps the horizon takes, the last one possibly short."""
        return -(-self.steps // self.chunk_steps)

    def node_name(self, node: int) -> str:
        """The name of node index `node` in every output ("node-0007"); does not check the index."""
        return f"node-{node:04d}"

    def to_json(self) -> dict[str, Any]:
        """Every field by name, JSON-ready; FleetConfig(**config.to_json()) rebuilds the config.
        (dict[str, Any], not a TypedDict, so callers can override fields in that call.) Without mode
        factors the key is left out: such a config's JSON is what it was before they existed."""
        out = asdict(self)
        if not self.mode_acceleration:
            del out["mode_acceleration"]
        return out

    def mode_factor(self, mode: str) -> float:
        """How much more than `acceleration` the rate of `mode` is multiplied (1 unless given)."""
        return dict(self.mode_acceleration).get(mode, 1.0)
