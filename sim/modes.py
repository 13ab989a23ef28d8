"""How the twin makes each failure mode (faultcast.modes) happen: rates, lead times, repair, Xids, and
the sources of the numbers.

Base rates are per GPU-day (per node-day for node-level modes) before acceleration and before the
world's scales (sim/world.py). They follow the Llama 3 report's table of the 419 unexpected
interruptions of 16,384 H100 x 54 days (about 4.7e-4 per GPU-day in all): faulty GPU 148 (split here
among detachment 45, power 35, NVLink 37 and PCIe 31: a prior, the report does not split it), HBM3 72,
software bug 54, network switch/cable 35 + NIC 7 (InfiniBand), host maintenance 32 + SSD, power
supply, chassis, IO board, CPU, system memory and dependency 16 (host), GPU SRAM 19, GPU system
processor 17 (firmware), NCCL watchdog 7, silent data corruption 6, thermal interface and sensor 6
(cooling). Node-level modes count per node-day: 8 GPUs per node.

Whether a failure carries a usable precursor is drawn per failure: `precursor_p` (a prior per mode,
times the world's `precursor_scale`, at most 0.95). docs/failure-modes.md explains each mode's physics,
cites the sources and says what the twin cannot represent.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultcast.modes import FailureMode, Level
from faultcast.sim.world import World

# Llama 3: 16,384 GPUs x 54 days.
_LLAMA3_GPU_DAYS = 16_384 * 54


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """The twin's physics for one failure mode."""

    mode: FailureMode
    rate_per_day: float  # per GPU-day (GPU level) or per node-day (node level), before acceleration
    lead_median_s: float  # precursor length: lognormal with this median
    lead_sigma: float
    downtime_median_s: float  # dark until repaired: lognormal, sigma World.downtime_sigma (0.5)
    replaced: bool  # the repair swaps the GPU (new UUID, counters from zero)
    xids: tuple[tuple[int, float], ...]  # Xid logged at the failure, with probabilities
    precursor_p: float = 0.0  # chance a failure carries a usable precursor (a prior; world-scaled)

    @property
    def name(self) -> str:
        """The mode's failure-log name ("hbm_wear"), the key of BY_NAME."""
        return self.mode.value

    @property
    def level(self) -> Level:
        """GPU or node, from faultcast.modes: what the failure takes out and what rate_per_day counts per."""
        return self.mode.level

    @property
    def predictable(self) -> bool:
        """Some of its failures can carry a precursor (whether one does is drawn per failure)."""
        return self.mode.has_precursor and self.precursor_p > 0

    def precursor_probability(self, world: World) -> float:
        """The chance one of its failures carries a precursor in `world` (at most 0.95: no mode's
        failures all announce themselves)."""
        return min(0.95, self.precursor_p * world.precursor_scale) if self.predictable else 0.0

    @property
    def description(self) -> str:
        """The mode's sentence from faultcast.modes (the failure log's description column)."""
        return self.mode.description


_H = 3600.0
_M = 60.0

_N = 8.0  # GPUs per node: node-level counts per node-day

MODES: tuple[ModeSpec, ...] = (
    ModeSpec(FailureMode.HBM_WEAR, 72 / _LLAMA3_GPU_DAYS, 90 * _M, 0.8, 30 * _H, True,
             ((48, 0.5), (94, 0.3), (95, 0.2)), 0.7),
    ModeSpec(FailureMode.COOLING, 6 / _LLAMA3_GPU_DAYS, 60 * _M, 0.6, 18 * _H, True, ((79, 1.0),), 0.7),
    ModeSpec(FailureMode.POWER, 35 / _LLAMA3_GPU_DAYS, 45 * _M, 0.8, 24 * _H, True, ((79, 1.0),), 0.45),
    ModeSpec(FailureMode.NVLINK, 37 / _LLAMA3_GPU_DAYS, 60 * _M, 0.8, 20 * _H, True, ((74, 1.0),), 0.55),
    ModeSpec(FailureMode.PCIE, 31 / _LLAMA3_GPU_DAYS, 50 * _M, 0.8, 24 * _H, True, ((79, 1.0),), 0.55),
    ModeSpec(FailureMode.INFINIBAND, _N * 42 / _LLAMA3_GPU_DAYS, 40 * _M, 0.8, 8 * _H, False, ((0, 1.0),),
             0.5),
    ModeSpec(FailureMode.DETACHMENT, 45 / _LLAMA3_GPU_DAYS, 20 * _M, 0.8, 24 * _H, True, ((79, 1.0),),
             0.15),
    ModeSpec(FailureMode.FIRMWARE, 17 / _LLAMA3_GPU_DAYS, 0.0, 0.0, 6 * _H, False, ((119, 0.5), (120, 0.5))),
    ModeSpec(FailureMode.GPU_SRAM, 19 / _LLAMA3_GPU_DAYS, 30 * _M, 0.8, 24 * _H, True,
             ((94, 0.5), (95, 0.5)), 0.15),
    ModeSpec(FailureMode.SILENT_DATA_CORRUPTION, 6 / _LLAMA3_GPU_DAYS, 0.0, 0.0, 48 * _H, True, ((0, 1.0),)),
    ModeSpec(FailureMode.HOST, _N * 48 / _LLAMA3_GPU_DAYS, 30 * _M, 0.8, 12 * _H, False, ((0, 1.0),), 0.1),
    ModeSpec(FailureMode.SOFTWARE, _N * 54 / _LLAMA3_GPU_DAYS, 0.0, 0.0, 0.0, False,
             ((0, 0.7), (13, 0.1), (31, 0.1), (43, 0.1))),
    ModeSpec(FailureMode.NCCL_TIMEOUT, _N * 7 / _LLAMA3_GPU_DAYS, 20 * _M, 0.8, 0.0, False, ((0, 1.0),),
             0.25),
)  # fmt: skip  # one mode per row: rate, lead median and sigma, downtime, replaced, Xids, precursor chance

"""Every failure mode's physics, in FailureMode order; the twin draws from these."""

BY_NAME: dict[str, ModeSpec] = {m.name: m for m in MODES}
"""MODES by failure-log name; every FailureMode has an entry (checked at import)."""
if set(BY_NAME) != set(FailureMode):
    raise RuntimeError("every failure mode needs its physics in MODES")
