"""The independent twin's configuration and its world: the parameters a seed draws from our priors.

A *world* is one draw of every free parameter below; the family of worlds is what the priors span.
Each number says where it comes from: a source, or "prior" (a judgement, deliberately wide).

Sources cited by short name:

- Llama3: Meta, "The Llama 3 Herd of Models" (2024), table of 419 unexpected interruptions over 54 days
  on 16,384 H100 GPUs (about 4.7e-4 interruptions per GPU-day); the cause shares below are its table.
- Titan: Tiwari et al., HPCA 2015 / Ostrouchov et al. (ORNL Titan GPU life): single-bit errors are
  concentrated on a small share of cards, most of which keep working; failure rates depend on the
  location in the machine (cooling).
- Delta: NCSA Delta GPU resilience study (A40/A100/H100): GSP the most vulnerable component, NVLink
  errors mostly survived thanks to retries, memory far more reliable than the rest of the GPU.
- GWDG: "fallen off the bus" detachments show only structural precursors (NVML latency, lost samples).
- NVML: NVIDIA Management Library reference (clock event reason bits, row remapping on A100 and later
  replacing page retirement, NOT_SUPPORTED fan speed on SXM boards).
- Spec: NVIDIA H100 SXM5 / A100 SXM4 data sheets (700 W / 400 W, HBM3 / HBM2e, PCIe Gen5 / Gen4 x16,
  18 / 12 NVLinks, max boost 1980 / 1410 MHz).
- ASHRAE: data-centre inlet recommended envelope 18-27 C (class A1).
- NVSentinel: InfiniBand counter thresholds (symbol errors per hour, link error recovery per minute),
  used here only as the scale of "bad".
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultcast.modes import FailureMode, Level

START_UNIX_S = 1_767_571_200  # 2026-01-05 00:00:00 UTC, a Monday


@dataclass(frozen=True)
class IndependentConfig:
    """What a run is asked for; everything else about the world is drawn from `world_seed` (by
    default `seed`), and the fleet's own draws (jobs, failures, noise, cards) from `seed`: two seeds
    under one world seed are two fleets of the same world (an in-world reference's training data).

    `acceleration` multiplies the failure rates and, with them, the near-miss degradations (the same
    processes stopping short of a failure), so accelerated data keeps its share of look-alikes; the
    background look-alikes (SBE-prone cards, flaps, hot racks) are not accelerated."""

    nodes: int = 16
    gpus_per_node: int = 8
    days: float = 3.0
    cadence_s: float = 60.0
    seed: int = 0
    acceleration: float = 1.0
    start_unix_s: int = START_UNIX_S
    rows_per_group: int = 131_072  # telemetry rows per chunk (one Parquet row group); memory bound
    world_seed: int | None = None  # None: the world of `seed` (the family's behaviour before world seeds)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be at least 1")
        if self.days <= 0 or self.cadence_s <= 0:
            raise ValueError("days and cadence_s must be positive")
        if self.acceleration <= 0:
            raise ValueError("acceleration must be positive")

    @property
    def drawn_world_seed(self) -> int:
        """The seed the world is drawn from."""
        return self.seed if self.world_seed is None else self.world_seed

    @property
    def steps(self) -> int:
        """Grid steps in the run."""
        return math.ceil(self.days * 86_400.0 / self.cadence_s)

    def as_dict(self) -> dict[str, Any]:
        """The manifest's "config" block."""
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "days": self.days,
            "cadence_s": self.cadence_s,
            "seed": self.seed,
            "acceleration": self.acceleration,
            "start_unix_s": self.start_unix_s,
            "rows_per_group": self.rows_per_group,
            # Written only when given, so a run without one keeps its manifest byte for byte.
            **({} if self.world_seed is None else {"world_seed": self.world_seed}),
        }


# --- GPU generations (Spec, NVML; thermal numbers are priors) -------------------------------------


@dataclass(frozen=True)
class GpuModel:
    name: str  # what nvmlDeviceGetName returns
    tdp_w: float  # Spec
    idle_w: float  # prior: H100 SXM idles near 70 W, A100 SXM near 55 W
    max_sm_mhz: float  # Spec
    base_sm_mhz: float  # Spec (clock under a sustained power cap)
    idle_sm_mhz: float  # prior: NVML shows the idle clock
    mem_mhz: float  # Spec (HBM3 2619, HBM2e 1593)
    fb_mib: float  # 80 GB parts
    pcie_gen: int  # Spec
    nvlinks: int  # Spec
    ib_gbps: float  # Spec: ConnectX-7 NDR 400 with H100, ConnectX-6 HDR 200 with A100
    sw_thermal_c: float  # prior: software thermal slowdown threshold
    hw_thermal_c: float  # prior: hardware thermal slowdown threshold


H100 = GpuModel("NVIDIA H100 80GB HBM3", 700, 70, 1980, 1590, 345, 2619, 81559, 5, 18, 400, 87, 92)
A100 = GpuModel("NVIDIA A100-SXM4-80GB", 400, 55, 1410, 1095, 210, 1593, 81920, 4, 12, 200, 85, 90)
MODELS = (A100, H100)


# --- Causes of unexpected interruptions (Llama3 table) ---------------------------------------------


@dataclass(frozen=True)
class Cause:
    """One row of the interruption mix: its Llama3 share, the failure-log modes it may be written as
    (the first one core/modes.py knows wins; none known: the interruption happens but is not logged),
    its level when not logged, the precursor it can have, the prior chance it has one, the prior
    median precursor length, the Xids it raises and how often the repair swaps the GPU."""

    name: str
    share: float  # percent of unexpected interruptions (Llama3)
    modes: tuple[str, ...]
    level: str  # "gpu" or "node" (used when no mode is known)
    precursor: str  # "", "hbm", "cooling", "power", "nvlink", "pcie", "structural", "ib"
    p_precursor: float  # prior
    precursor_median_s: float  # prior (docs/failure-modes.md: minutes to hours)
    xids: tuple[int, ...]
    p_replace: float  # prior
    repair: bool = True  # False: no hardware goes dark (a software crash: the job restarts)


# "Faulty GPU" (30.1%) is split by a prior over how a bad GPU shows itself; the shares are drawn per world.
FAULTY_GPU_SPLIT = {"detach": 0.40, "nvlink": 0.20, "power": 0.15, "pcie": 0.15, "gpu_fw": 0.10}  # prior

CAUSES: tuple[Cause, ...] = (
    Cause("detach", 30.1, ("detachment",), "gpu", "structural", 0.25, 1_200, (79,), 0.5),
    Cause("nvlink", 0.0, ("nvlink",), "gpu", "nvlink", 0.5, 7_200, (74,), 0.3),
    Cause("power", 0.0, ("power",), "gpu", "power", 0.4, 3_600, (79,), 0.5),
    Cause("pcie", 0.0, ("pcie",), "gpu", "pcie", 0.5, 10_800, (79,), 0.4),
    Cause("gpu_fw", 0.0, ("firmware",), "gpu", "", 0.0, 0, (119, 120), 0.1),
    Cause("hbm", 17.2, ("hbm_wear",), "gpu", "hbm", 0.5, 10_800, (48, 95, 64), 0.8),
    Cause("software", 12.9, ("software",), "node", "", 0.0, 0, (13, 43), 0.0, repair=False),
    Cause("network", 8.4, ("infiniband",), "node", "ib", 0.4, 5_400, (), 0.0),
    Cause("host", 7.6, ("host",), "node", "", 0.0, 0, (), 0.0),
    Cause("gpu_sram", 4.5, ("gpu_sram", "hbm_wear"), "gpu", "hbm", 0.05, 1_800, (94, 95), 0.7),
    Cause("gsp", 4.1, ("firmware",), "gpu", "", 0.0, 0, (119, 120), 0.1),
    Cause("nic", 1.7, ("infiniband",), "node", "ib", 0.4, 3_600, (), 0.0),
    Cause("nccl", 1.7, ("nccl_timeout", "infiniband"), "node", "ib", 0.1, 1_800, (), 0.0, repair=False),
    Cause("sdc", 1.4, ("silent_data_corruption",), "gpu", "", 0.0, 0, (), 0.5),
    Cause("thermal", 1.4, ("cooling",), "gpu", "cooling", 0.7, 2_400, (79,), 0.3),
    # SSD 0.7, power supply 0.7, chassis 0.5, IO board 0.5, dependency 0.5, CPU 0.5, memory 0.5 (Llama3)
    Cause("other_host", 3.9, ("host",), "node", "structural", 0.05, 1_800, (), 0.0),
)
CAUSE_INDEX = {c.name: i for i, c in enumerate(CAUSES)}


def logged_mode(cause: Cause) -> str | None:
    """The failure-log mode this cause is written as, or None when core/modes.py knows none of them."""
    known = {m.value for m in FailureMode}
    return next((m for m in cause.modes if m in known), None)


def cause_level(cause: Cause) -> str:
    """'gpu' or 'node': the mode's level when it is logged, else the cause's own."""
    mode = logged_mode(cause)
    if mode is None:
        return cause.level
    return "node" if FailureMode(mode).level is Level.NODE else "gpu"


# --- The world --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """One draw of the priors; `parameters` is what the manifest records and the id hashes."""

    seed: int
    parameters: dict[str, Any] = field(hash=False)

    @property
    def id(self) -> str:
        text = json.dumps(self.parameters, sort_keys=True, default=float)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def __getitem__(self, key: str) -> Any:
        return self.parameters[key]


def _r(x: float) -> float:
    return float(round(x, 6))


def draw_world(seed: int) -> World:
    """The world of `seed`: every free parameter drawn from its prior (independent of the fleet size)."""
    rng = np.random.default_rng([seed, 0x5EED, 1])
    u = rng.uniform

    def logu(lo: float, hi: float) -> float:
        return float(math.exp(u(math.log(lo), math.log(hi))))

    generation = str(rng.choice(["h100", "a100", "mixed"], p=[0.5, 0.25, 0.25]))  # prior
    split = rng.dirichlet(np.array(list(FAULTY_GPU_SPLIT.values())) * 20.0)  # prior around FAULTY_GPU_SPLIT
    shares = {c.name: c.share for c in CAUSES}
    for (name, _), s in zip(FAULTY_GPU_SPLIT.items(), split, strict=True):
        shares[name] = 30.1 * float(s)
    raw = np.array([shares[c.name] for c in CAUSES])
    mix = rng.dirichlet(raw / raw.sum() * 300.0 + 1e-3)  # Llama3 shares, with a world's own spread (prior)
    p_pre = {
        c.name: _r(
            float(rng.beta(1 + 20 * c.p_precursor, 1 + 20 * (1 - c.p_precursor))) if c.p_precursor else 0.0
        )
        for c in CAUSES
    }
    pre_len = {c.name: _r(c.precursor_median_s * logu(0.5, 2.0)) for c in CAUSES if c.precursor}
    p: dict[str, Any] = {
        "generation": generation,  # prior: one or two generations per fleet
        "nodes_per_rack": int(rng.choice([2, 4])),  # prior: 4 DGX-class nodes per 40 kW rack
        "nodes_per_pod": int(rng.choice([1, 2, 4, 8])),  # prior: nodes a job spans (share phases)
        "inlet_c": _r(u(20.0, 26.0)),  # ASHRAE A1 envelope
        "hot_rack_share": _r(u(0.05, 0.2)),  # prior; Titan: location matters
        "hot_rack_delta_c": _r(u(3.0, 8.0)),  # prior
        "daily_amplitude_c": _r(u(0.5, 3.0)),  # prior: afternoon peak at 15:00 UTC
        "tau_s_h100": _r(u(30.0, 120.0)),  # prior: tens of seconds to minutes
        "tau_s_a100": _r(u(45.0, 180.0)),  # prior
        "rth_h100": _r(u(0.055, 0.075)),  # prior: ~45 C over inlet at 700 W
        "rth_a100": _r(u(0.09, 0.12)),  # prior: ~40 C over inlet at 400 W
        "gpu_offset_sd_c": _r(u(1.0, 3.0)),  # prior: manufacturing and slot spread
        "hbm_offset_c": _r(u(-2.0, 6.0)),  # prior: HBM relative to the core
        "power_capped_node_share": _r(u(0.0, 0.15)),  # prior: admins lower some limits
        "idle_pstate": int(rng.choice([0, 8], p=[0.7, 0.3])),  # prior: persistence mode keeps P0
        "pcie_idle_downshift": bool(rng.random() < 0.6),  # prior: link drops to Gen1 when idle (ASPM)
        "pcie_downtrained_share": _r(u(0.002, 0.01)),  # prior: healthy cards stuck at x8
        "retired_pages_supported": bool(rng.random() < 0.2),  # NVML: A100+ use row remapping instead
        "sbe_prone_share": _r(u(0.01, 0.05)),  # Titan: SBEs concentrated on a few cards
        "sbe_prone_rate_per_day": _r(logu(0.5, 30.0)),  # prior: median rate of a prone card
        "sbe_background_per_gpu_day": _r(logu(1e-3, 1e-2)),  # prior: isolated SBEs elsewhere
        "benign_remap_per_gpu_day": _r(logu(2e-4, 2e-3)),  # prior: remapping is a repair, not death
        "benign_contained_dbe_per_gpu_day": _r(logu(5e-5, 5e-4)),  # prior: Xid 94, the GPU keeps going
        "pcie_replay_per_gpu_day": _r(logu(0.1, 5.0)),  # prior: background trickle
        "pcie_burst_per_gpu_day": _r(logu(0.005, 0.05)),  # prior: bursts after reseats, firmware
        "nvlink_crc_per_gpu_day": _r(logu(0.05, 3.0)),  # prior; Delta: retried, survived
        "nvlink_burst_per_gpu_day": _r(logu(0.005, 0.05)),  # prior
        "benign_xid74_per_gpu_day": _r(logu(1e-4, 1e-3)),  # prior; Delta: NVLink errors often survived
        "benign_xid119_per_gpu_day": _r(logu(2e-5, 2e-4)),  # prior: GSP timeouts that recover
        "app_xid31_per_gpu_day": _r(logu(0.002, 0.02)),  # prior: page faults in user code
        "app_crash_share": _r(u(0.05, 0.3)),  # prior: jobs that end in Xid 13/43
        "job_median_h": _r(logu(2.0, 24.0)),  # prior
        "idle_gap_mean_min": _r(logu(5.0, 90.0)),  # prior
        "bursty_job_share": _r(u(0.02, 0.2)),  # prior: power swings 60 W <-> full
        "inference_job_share": _r(u(0.05, 0.25)),  # prior: partial load
        "checkpoint_period_min": _r(logu(20.0, 120.0)),  # prior
        "checkpoint_pause_min": _r(u(1.0, 6.0)),  # prior
        "eval_period_h": _r(logu(1.0, 6.0)),  # prior
        "eval_min": _r(u(5.0, 20.0)),  # prior
        "dataload_dip_p": _r(u(0.01, 0.08)),  # prior: per-step chance of a loader stall
        "scrape_loss_p": _r(logu(5e-4, 5e-3)),  # prior: lost scrapes per node-step
        "gpu_sample_loss_p": _r(logu(1e-5, 5e-4)),  # prior
        "exporter_outage_per_node_day": _r(logu(0.01, 0.1)),  # prior: outage 10 min-3 h
        "frozen_exporter_per_node_day": _r(logu(0.005, 0.05)),  # prior: stale constants 1-6 h
        "driver_reload_per_node_day": _r(logu(0.005, 0.05)),  # prior: resets volatile counters
        "nvml_call_s": _r(logu(0.01, 0.05)),  # prior: sum of one GPU's NVML calls per scrape
        "nvml_fail_p": _r(logu(1e-5, 1e-3)),  # prior: background failed calls per GPU-step
        "ib_ports": 8,  # Spec: one HCA port per GPU in DGX-class nodes
        "peers": 4,  # prior: probed peers per node
        "ib_symbol_per_port_day": _r(logu(0.1, 20.0)),  # prior (NVSentinel fatal above 120/hour)
        "ib_flap_per_port_day": _r(logu(0.002, 0.03)),  # prior: flaps that heal
        "ib_congestion_discards": _r(logu(1e-12, 1e-10)),  # prior: discards per octet sent
        "rtt_p50_s": _r(logu(4e-5, 2e-4)),  # prior: TCP connect inside a data centre
        "tcp_retrans_ratio": _r(logu(1e-5, 5e-4)),  # prior
        "failure_rate_per_gpu_day": _r(4.7e-4 * u(0.8, 1.25)),  # Llama3, +-25% per world (prior)
        "cause_mix": {c.name: _r(float(m)) for c, m in zip(CAUSES, mix, strict=True)},  # Llama3
        "p_precursor": p_pre,  # priors per cause (docs/failure-modes.md: a minority have any)
        "precursor_median_s": pre_len,  # priors per cause
        "precursor_sigma": _r(u(0.7, 1.2)),  # prior: lognormal spread of lengths
        "precursor_strength_sigma": _r(u(0.5, 1.0)),  # prior: lognormal spread of strengths
        "channel_drop_p": _r(u(0.15, 0.4)),  # prior: partial precursors
        "near_miss_ratio": _r(u(0.5, 3.0)),  # prior: degradations that never fail, per precursor
        "repair_median_h": _r(logu(3.0, 12.0)),  # prior: "hours"
        "restart_gap_min": _r(u(5.0, 30.0)),  # prior: a job's restart after an interruption
        "hot_rack_failure_factor": _r(u(1.2, 2.5)),  # Titan: cooling location raises failure rates
        "reseat_burst_p": _r(u(0.3, 0.7)),  # prior: error burst after a repair
    }
    return World(seed, p)
