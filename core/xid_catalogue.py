"""NVIDIA's Xid catalogue as faultcast reads it: which Xids end a job on broken hardware, and as which mode.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog", Ampere and newer GPUs
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): each Xid's mnemonic and its
"Resolution Bucket (Immediate Action)" (RESTART_APP, RESET_GPU, RESTART_BM, IGNORE, WORKFLOW_*); the same
table ships as data in NVIDIA's NVSentinel (xiderrorsmapping.csv, which also marks each code FATAL or
NONFATAL). The modes come from docs/failure-modes.md ("Xid codes that matter") and faultcast.modes.

What faultcast makes of an Xid (`XidKind`):
- FAILURE: the catalogue asks for a GPU reset, a reboot or a hardware workflow (the job on it is lost and
  the GPU must be serviced); the mode says which failure.
- APPLICATION: the catalogue's answer is to restart the application (or to check it): user code, not
  hardware (docs/failure-modes.md: 13, 31, 43 follow user code). Skipped, counted.
- INFORMATIONAL: the catalogue says IGNORE, or the Xid reports on another one (45 cleans up after an
  earlier error, 154 restates the recovery action another Xid needs): precursors and echoes, not failures
  (63 and 92 are memory wear a model should learn to see coming). Skipped, counted.
- UNMAPPED: fatal in the catalogue, but nothing in its name says which faultcast mode broke (a GPU
  timeout, a context-switch timeout): counted and reported, not guessed; `--keep-unexplained` writes them
  with mode "unknown".
A code that is not in this table is unknown to faultcast: counted and reported, never guessed.

Choices worth knowing:
- Xid 94 (contained ECC error) is RESTART_APP in the catalogue, but the application it names was killed by
  an uncorrectable memory error: for a training job that is a hardware failure (docs/failure-modes.md lists
  94/95 with 48 as memory), written to the failure log. The GPU keeps working, which is why the catalogue
  only restarts the app: the service's FAILED event for it does not drain the node (`Xid.drains_node`).
- Xid 94/95 are written as hbm_wear, never gpu_sram: the line names the unit that consumed the poisoned
  data ("Contained: SM (0x1)"), not where the error arose, so HBM and SRAM cannot be told apart from it.
- Xid 79 (fallen off the bus) is written as `detachment`: the line does not say whether PCIe, power,
  cooling or the board took the GPU away (all four end in Xid 79), and a GPU that vanishes is what
  faultcast's detachment mode describes (the GWDG study: structural precursors only).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from faultcast.modes import FailureMode


class XidKind(StrEnum):
    """What an Xid means for the failure log (see the module docstring)."""

    FAILURE = "failure"
    APPLICATION = "application"
    INFORMATIONAL = "informational"
    UNMAPPED = "unmapped"


@dataclass(frozen=True, slots=True)
class Xid:
    """One catalogue entry: the code, NVIDIA's mnemonic and immediate action, and faultcast's reading."""

    code: int
    mnemonic: str
    action: str  # the catalogue's Resolution Bucket (Immediate Action)
    kind: XidKind
    mode: FailureMode | None = None  # set for FAILURE only

    @property
    def drains_node(self) -> bool:
        """Whether the node must be taken out of service: not when the catalogue asks only for the
        application to be restarted (Xid 94: the error was contained, the GPU keeps working)."""
        return self.action != "RESTART_APP"


_F, _A, _I, _U = XidKind.FAILURE, XidKind.APPLICATION, XidKind.INFORMATIONAL, XidKind.UNMAPPED
_HBM, _NVL, _FW, _DET = FailureMode.HBM_WEAR, FailureMode.NVLINK, FailureMode.FIRMWARE, FailureMode.DETACHMENT

CATALOGUE: dict[int, Xid] = {
    x.code: x
    for x in (
        # Memory: double-bit errors, row-remap failures, contained/uncontained and escaped ECC errors.
        Xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", _F, _HBM),
        Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", _F, _HBM),
        Xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", _F, _HBM),
        Xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", _F, _HBM),
        Xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", _F, _HBM),
        # NVLink (74 up to Hopper; 144-150 are NVLink5's per-unit errors on Blackwell).
        Xid(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", _F, _NVL),
        Xid(136, "ALI_TRAINING_FAIL", "RESET_GPU", _F, _NVL),
        Xid(144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", _F, _NVL),
        Xid(155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", _F, _NVL),
        # The GPU is gone from the bus.
        Xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", _F, _DET),
        # GPU System Processor and PMU firmware.
        Xid(62, "PMU_HALT_ERROR", "RESET_GPU", _F, _FW),
        Xid(119, "GSP_RPC_TIMEOUT", "RESET_GPU", _F, _FW),
        Xid(120, "GSP_ERROR", "RESET_GPU", _F, _FW),
        # Fatal, but the name does not say which part broke.
        Xid(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", _U),
        Xid(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", _U),
        Xid(110, "SEC_FAULT_ERROR", "RESET_GPU", _U),
        Xid(143, "GPU_INIT_ERROR", "RESET_GPU", _U),
        Xid(156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", _U),
        Xid(158, "GPU_FATAL_TIMEOUT", "RESET_GPU", _U),
        # The application's own faults.
        Xid(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", _A),
        Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", _A),
        Xid(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", _A),
        Xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", _A),
        Xid(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", _A),
        # Warnings, precursors and echoes of another Xid.
        Xid(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", _I),
        Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", _I),
        Xid(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", _I),
        Xid(121, "C2C_ERROR", "IGNORE", _I),
        Xid(137, "NVLINK_FLA_PRIV_ERR", "IGNORE", _I),
        Xid(154, "GPU_RECOVERY_ACTION_CHANGED", "follow the Xid it accompanies", _I),
    )
}
"""The Xids faultcast reads, by code."""


def lookup(code: int) -> Xid | None:
    """The catalogue entry of Xid `code`; None when faultcast does not know it (count it, do not guess)."""
    return CATALOGUE.get(code)
