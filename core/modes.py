"""The failure modes faultcast knows: one enum, the vocabulary every part shares.

Each mode says whether it takes a GPU or a whole node (`level`), whether telemetry shows it coming
(`has_precursor`: the model can only catch those), and its name in the alert contract
(`proto_name`, a value of faultcast.v1 FailureMode). The member's value is the string written in
failure logs, manifests and metric labels ("hbm_wear"); a `FailureMode` compares equal to it.
How often each mode strikes and how its precursor looks are the twin's business (faultcast.sim.modes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum


class Level(Enum):
    """What a failure takes out: one GPU, or the whole node (its network, say)."""

    GPU = "gpu"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class _Facts:
    level: Level
    has_precursor: bool
    proto_name: str
    description: str


class FailureMode(StrEnum):
    """A failure mode, by the name failure logs use."""

    HBM_WEAR = "hbm_wear"
    COOLING = "cooling"
    POWER = "power"
    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    DETACHMENT = "detachment"
    FIRMWARE = "firmware"
    GPU_SRAM = "gpu_sram"
    SILENT_DATA_CORRUPTION = "silent_data_corruption"
    HOST = "host"
    SOFTWARE = "software"
    NCCL_TIMEOUT = "nccl_timeout"

    @property
    def level(self) -> Level:
        """What it takes out: one GPU, or the whole node (then every GPU of it is down)."""
        return _FACTS[self].level

    @property
    def has_precursor(self) -> bool:
        """Telemetry can show it coming (some failures of the mode carry a precursor a model could
        catch; whether one did is drawn per failure and recorded in the failure log's `precursor_s`).
        False: always sudden, no model can."""
        return _FACTS[self].has_precursor

    @property
    def proto_name(self) -> str:
        """Its faultcast.v1 FailureMode value's name."""
        return _FACTS[self].proto_name

    @property
    def description(self) -> str:
        """One human sentence on how it unfolds, for help texts and reports."""
        return _FACTS[self].description


_FACTS: dict[FailureMode, _Facts] = {
    FailureMode.HBM_WEAR: _Facts(
        Level.GPU, True, "FAILURE_MODE_HBM_WEAR",
        "HBM wear: rising correctable (SBE) error rate, correctable row remaps and a pending remap, "
        "Xid 63/92, then a double-bit error (Xid 48/94/95)",
    ),
    FailureMode.COOLING: _Facts(
        Level.GPU, True, "FAILURE_MODE_COOLING",
        "Cooling fault: temperature drifting above what power explains, thermal slowdown, falling "
        "clocks, then thermal shutdown (Xid 79)",
    ),
    FailureMode.POWER: _Facts(
        Level.GPU, True, "FAILURE_MODE_POWER",
        "Power delivery: power-brake slowdowns and power excursions growing more frequent, then the "
        "GPU falls off the bus (Xid 79)",
    ),
    FailureMode.NVLINK: _Facts(
        Level.GPU, True, "FAILURE_MODE_NVLINK",
        "NVLink degradation: CRC flit/data errors, replays and recoveries rising on one link, then Xid 74",
    ),
    FailureMode.PCIE: _Facts(
        Level.GPU, True, "FAILURE_MODE_PCIE",
        "PCIe degradation: replay counter rising, link downtrained (width or generation), then Xid 79",
    ),
    FailureMode.INFINIBAND: _Facts(
        Level.NODE, True, "FAILURE_MODE_NETWORK",
        "InfiniBand/RoCE link degradation (node level): symbol errors, link error recovery, receive "
        "errors, peer latency and loss, then the link goes down (NCCL timeout)",
    ),
    FailureMode.DETACHMENT: _Facts(
        Level.GPU, True, "FAILURE_MODE_DETACHMENT",
        "Detachment with only structural precursors: NVML calls slowing, failing, samples missing, "
        "then the GPU disappears (Xid 79)",
    ),
    FailureMode.FIRMWARE: _Facts(
        Level.GPU, False, "FAILURE_MODE_FIRMWARE",
        "Sudden GSP/firmware fault (Xid 119/120) with no precursor: no model can catch it",
    ),
    FailureMode.GPU_SRAM: _Facts(
        Level.GPU, True, "FAILURE_MODE_GPU_SRAM",
        "GPU SRAM (L2 cache, register file) uncorrectable error (Xid 94/95); now and then preceded by "
        "correctable errors, mostly sudden",
    ),
    FailureMode.SILENT_DATA_CORRUPTION: _Facts(
        Level.GPU, False, "FAILURE_MODE_SILENT_DATA_CORRUPTION",
        "Silent data corruption: the GPU computes wrong results (loss spikes, NaN) with no telemetry "
        "precursor; found after the fact and the GPU pulled",
    ),
    FailureMode.HOST: _Facts(
        Level.NODE, True, "FAILURE_MODE_HOST",
        "Host hardware or maintenance (CPU, system memory, SSD, power supply, chassis, IO board): the "
        "node goes down, seldom with a GPU-visible precursor",
    ),
    FailureMode.SOFTWARE: _Facts(
        Level.NODE, False, "FAILURE_MODE_SOFTWARE",
        "A software bug ends the job (often with an application Xid 13/31/43); the hardware is fine "
        "and no hardware telemetry can foresee it",
    ),
    FailureMode.NCCL_TIMEOUT: _Facts(
        Level.NODE, True, "FAILURE_MODE_NCCL_TIMEOUT",
        "NCCL watchdog timeout with no hardware cause found; sometimes preceded by network latency "
        "or retransmits, mostly sudden",
    ),
}  # fmt: skip  # one mode per block: level, precursor, proto name, then its description

NODE_LEVEL_MODES = frozenset(m for m in FailureMode if m.level is Level.NODE)
"""The modes whose `level` is NODE."""
MODES_WITH_PRECURSOR = frozenset(m for m in FailureMode if m.has_precursor)
"""The modes a model can sometimes catch: those whose `has_precursor` is True."""
