"""How the twin makes each failure mode (faultcast.modes) happen: rates, lead times, repair, Xids, and
the sources of the numbers.

Base rates are per GPU-day (per node-day for node-level modes) before acceleration. They add up to
about 3.5e-4 hardware interruptions per GPU-day, 75% of the 4.7e-4 unexpected interruptions per
GPU-day of the Llama 3 report (16,384 H100 x 54 days, 419 unexpected, ~78% hardware), split as
its categories suggest: HBM3 72, faulty GPU 148 (split here among detachment, power, PCIe and
NVLink), network switch/cable + NIC 42, GSP + SRAM 36, thermal 6. docs/failure-modes.md explains
each mode's physics and what the twin cannot represent.
"""

from __future__ import annotations

from dataclasses import dataclass

from faultcast.modes import FailureMode, Level

# Llama 3: 16,384 GPUs x 54 days.
_LLAMA3_GPU_DAYS = 16_384 * 54


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """The twin's physics for one failure mode."""

    mode: FailureMode
    rate_per_day: float  # per GPU-day (GPU level) or per node-day (node level), before acceleration
    lead_median_s: float  # precursor length: lognormal with this median
    lead_sigma: float
    downtime_median_s: float  # dark until repaired: lognormal, sigma 0.5
    replaced: bool  # the repair swaps the GPU (new UUID, counters from zero)
    xids: tuple[tuple[int, float], ...]  # Xid logged at the failure, with probabilities

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
        """The twin draws a precursor for it."""
        return self.mode.has_precursor

    @property
    def description(self) -> str:
        """The mode's sentence from faultcast.modes (the failure log's description column)."""
        return self.mode.description


_H = 3600.0
_M = 60.0

MODES: tuple[ModeSpec, ...] = (
    ModeSpec(FailureMode.HBM_WEAR, 72 / _LLAMA3_GPU_DAYS, 90 * _M, 0.6, 30 * _H, True,
             ((48, 0.5), (94, 0.3), (95, 0.2))),
    ModeSpec(FailureMode.COOLING, 12 / _LLAMA3_GPU_DAYS, 60 * _M, 0.5, 18 * _H, True, ((79, 1.0),)),
    ModeSpec(FailureMode.POWER, 35 / _LLAMA3_GPU_DAYS, 45 * _M, 0.6, 24 * _H, True, ((79, 1.0),)),
    ModeSpec(FailureMode.NVLINK, 37 / _LLAMA3_GPU_DAYS, 60 * _M, 0.6, 20 * _H, True, ((74, 1.0),)),
    ModeSpec(FailureMode.PCIE, 31 / _LLAMA3_GPU_DAYS, 50 * _M, 0.6, 24 * _H, True, ((79, 1.0),)),
    ModeSpec(FailureMode.INFINIBAND, 8 * 42 / _LLAMA3_GPU_DAYS, 40 * _M, 0.6, 8 * _H, False, ((0, 1.0),)),
    ModeSpec(FailureMode.DETACHMENT, 45 / _LLAMA3_GPU_DAYS, 20 * _M, 0.7, 24 * _H, True, ((79, 1.0),)),
    ModeSpec(FailureMode.FIRMWARE, 36 / _LLAMA3_GPU_DAYS, 0.0, 0.0, 6 * _H, False, ((119, 0.5), (120, 0.5))),
)  # fmt: skip  # one mode per row: rate, lead median and sigma, downtime, replaced, Xids

"""Every failure mode's physics, in FailureMode order; the twin draws from these."""

BY_NAME: dict[str, ModeSpec] = {m.name: m for m in MODES}
"""MODES by failure-log name; every FailureMode has an entry (checked at import)."""
if set(BY_NAME) != set(FailureMode):
    raise RuntimeError("every failure mode needs its physics in MODES")
