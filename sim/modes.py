"""The failure modes the twin simulates: rates, lead times, repair, and the sources of the numbers.

Base rates are per GPU-day (per node-day for node-level modes) before acceleration. They add up to
about 3.5e-4 hardware interruptions per GPU-day, 75% of the 4.7e-4 unexpected interruptions per
GPU-day of the Llama 3 report (16,384 H100 x 54 days, 419 unexpected, ~78% hardware), split as
its categories suggest: HBM3 72, faulty GPU 148 (split here among detachment, power, PCIe and
NVLink), network switch/cable + NIC 42, GSP + SRAM 36, thermal 6. docs/failure-modes.md explains
each mode's physics and what the twin cannot represent.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Llama 3: 16,384 GPUs x 54 days.
_LLAMA3_GPU_DAYS = 16_384 * 54


class Level(Enum):
    GPU = "gpu"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class ModeSpec:
    name: str
    level: Level
    rate_per_day: float  # per GPU-day (GPU level) or per node-day (node level), before acceleration
    lead_median_s: float  # precursor length: lognormal with this median
    lead_sigma: float
    downtime_median_s: float  # dark until repaired: lognormal, sigma 0.5
    replaced: bool  # the repair swaps the GPU (new UUID, counters from zero)
    xids: tuple[tuple[int, float], ...]  # Xid logged at the failure, with probabilities
    predictable: bool  # has precursors in the telemetry
    description: str


_H = 3600.0
_M = 60.0

MODES: tuple[ModeSpec, ...] = (
    ModeSpec("hbm_wear", Level.GPU, 72 / _LLAMA3_GPU_DAYS, 90 * _M, 0.6, 30 * _H, True,
             ((48, 0.5), (94, 0.3), (95, 0.2)), True,
             "HBM wear: rising correctable (SBE) error rate, correctable row remaps and a pending remap, "
             "Xid 63/92, then a double-bit error (Xid 48/94/95)"),
    ModeSpec("cooling", Level.GPU, 12 / _LLAMA3_GPU_DAYS, 60 * _M, 0.5, 18 * _H, True,
             ((79, 1.0),), True,
             "Cooling fault: temperature drifting above what power explains, thermal slowdown, falling "
             "clocks, then thermal shutdown (Xid 79)"),
    ModeSpec("power", Level.GPU, 35 / _LLAMA3_GPU_DAYS, 45 * _M, 0.6, 24 * _H, True,
             ((79, 1.0),), True,
             "Power delivery: power-brake slowdowns and power excursions growing more frequent, then the "
             "GPU falls off the bus (Xid 79)"),
    ModeSpec("nvlink", Level.GPU, 37 / _LLAMA3_GPU_DAYS, 60 * _M, 0.6, 20 * _H, True,
             ((74, 1.0),), True,
             "NVLink degradation: CRC flit/data errors, replays and recoveries rising on one link, then "
             "Xid 74"),
    ModeSpec("pcie", Level.GPU, 31 / _LLAMA3_GPU_DAYS, 50 * _M, 0.6, 24 * _H, True,
             ((79, 1.0),), True,
             "PCIe degradation: replay counter rising, link downtrained (width or generation), then "
             "Xid 79"),
    ModeSpec("infiniband", Level.NODE, 8 * 42 / _LLAMA3_GPU_DAYS, 40 * _M, 0.6, 8 * _H, False,
             ((0, 1.0),), True,
             "InfiniBand/RoCE link degradation (node level): symbol errors, link error recovery, receive "
             "errors, peer latency and loss, then the link goes down (NCCL timeout)"),
    ModeSpec("detachment", Level.GPU, 45 / _LLAMA3_GPU_DAYS, 20 * _M, 0.7, 24 * _H, True,
             ((79, 1.0),), True,
             "Detachment with only structural precursors: NVML calls slowing, failing, samples missing, "
             "then the GPU disappears (Xid 79)"),
    ModeSpec("firmware", Level.GPU, 36 / _LLAMA3_GPU_DAYS, 0.0, 0.0, 6 * _H, False,
             ((119, 0.5), (120, 0.5)), False,
             "Sudden GSP/firmware fault (Xid 119/120) with no precursor: no model can catch it"),
)  # fmt: skip

BY_NAME: dict[str, ModeSpec] = {m.name: m for m in MODES}


def mode(name: str) -> ModeSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown failure mode {name!r}; known: {', '.join(BY_NAME)}") from None
