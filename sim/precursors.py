"""What a failure's precursor (or a degradation that stops without one) does to a node's signals.

Each precursor has a shape (ScheduledFailure.shape), drawn per failure:

- ramp: grows from nothing to its peak over the lead (what every precursor used to be);
- step: nothing, then at a random point of the lead it switches on at once;
- intermittent: grows, but comes and goes in episodes of minutes (it pauses);
- plateau: rises within the first quarter of the lead and stays at 60% of its peak.

It shows only some of its mode's signals (ScheduledFailure.signals, numbered per mode below; the
first always shows), its strength varies from step to step (lognormal, sigma 0.3), and an aborted
degradation reaches only `peak` of it and then stops. A scripted scenario keeps the plain ramp with
every signal, so a demo's failure looks the same on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from faultcast.sim.schedule import ScheduledFailure

_PAUSE_MEAN_S = 8 * 60.0  # mean length of an intermittent precursor's on/off episodes


@dataclass
class Effects:
    """What precursors and look-alikes do to a node over a chunk, before the counters integrate it.
    Per GPU arrays are (T, G); IB ports (T, P); node-wide (T,)."""

    t: np.ndarray
    g: int
    p: int  # IB ports
    temp_add: np.ndarray = field(init=False)
    clock: np.ndarray = field(init=False)
    power_noise: np.ndarray = field(init=False)
    sbe_per_min: np.ndarray = field(init=False)
    remap_p: np.ndarray = field(init=False)
    pending: np.ndarray = field(init=False)
    brake: np.ndarray = field(init=False)  # the step's last scrape is braked
    brake_s: np.ndarray = field(init=False)  # seconds of the step under a power brake (sim/substep.py)
    nvlink_per_min: np.ndarray = field(init=False)  # (4, T, G) on the worst link
    nvlink_burst: np.ndarray = field(init=False)
    pcie_per_min: np.ndarray = field(init=False)
    pcie_burst: np.ndarray = field(init=False)
    width_down: np.ndarray = field(init=False)
    gen_down: np.ndarray = field(init=False)
    nvml_slow: np.ndarray = field(init=False)
    nvml_fail_per_min: np.ndarray = field(init=False)
    missing: np.ndarray = field(init=False)
    xid92_p: np.ndarray = field(init=False)
    ib_symbol_per_min: np.ndarray = field(init=False)  # (T, P)
    ib_recovery_per_min: np.ndarray = field(init=False)
    ib_burst: np.ndarray = field(init=False)
    ib_ack_timeout_per_min: np.ndarray = field(init=False)
    ib_rcv_per_min: np.ndarray = field(init=False)
    ib_discard_per_min: np.ndarray = field(init=False)
    ib_flap: np.ndarray = field(init=False)  # (T, P) link downed and back within the step
    rtt: np.ndarray = field(init=False)  # (T,) multiplier of p50
    rtt_tail: np.ndarray = field(init=False)  # (T,) multiplier of p99
    loss: np.ndarray = field(init=False)
    retrans_per_min: np.ndarray = field(init=False)
    inlet_add: np.ndarray = field(init=False)  # (T,) a rack's or room's cooling trouble
    gap: np.ndarray = field(init=False)  # (T,) the node's collector sends nothing
    frozen: np.ndarray = field(init=False)  # (T,) the exporter repeats its last values

    def __post_init__(self) -> None:
        n, g, p = len(self.t), self.g, self.p
        self.temp_add, self.power_noise = np.zeros((n, g)), np.zeros((n, g))
        self.clock, self.nvml_slow = np.ones((n, g)), np.ones((n, g))
        self.sbe_per_min, self.remap_p, self.xid92_p = np.zeros((n, g)), np.zeros((n, g)), np.zeros((n, g))
        self.pending, self.brake = np.zeros((n, g), dtype=bool), np.zeros((n, g), dtype=bool)
        self.brake_s = np.zeros((n, g))
        self.nvlink_per_min, self.nvlink_burst = np.zeros((4, n, g)), np.zeros((n, g))
        self.pcie_per_min, self.pcie_burst = np.zeros((n, g)), np.zeros((n, g))
        self.width_down, self.gen_down = np.zeros((n, g), dtype=bool), np.zeros((n, g), dtype=bool)
        self.nvml_fail_per_min, self.missing = np.zeros((n, g)), np.zeros((n, g))
        self.ib_symbol_per_min, self.ib_recovery_per_min = np.zeros((n, p)), np.zeros((n, p))
        self.ib_burst, self.ib_ack_timeout_per_min = np.zeros((n, p)), np.zeros((n, p))
        self.ib_rcv_per_min, self.ib_flap = np.zeros((n, p)), np.zeros((n, p))
        self.ib_discard_per_min = np.zeros((n, p))
        self.rtt, self.rtt_tail, self.loss = np.ones(n), np.ones(n), np.zeros(n)
        self.retrans_per_min, self.inlet_add = np.zeros(n), np.zeros(n)
        self.gap, self.frozen = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)


def per_step(rate_per_min: np.ndarray | float, dt_min: float) -> np.ndarray:
    """Probability that an event of this rate happens within one step."""
    return -np.expm1(-np.asarray(rate_per_min, dtype=np.float64) * dt_min)


def _envelope(f: ScheduledFailure, p: np.ndarray, r: np.random.Generator, cadence_s: float) -> np.ndarray:
    """The precursor's level per step (0 to 1) from its progress `p` (0 to 1 over the lead)."""
    if f.scripted:
        return p
    n = len(p)
    if f.shape == "step":
        onset = 0.2 + 0.7 * f.draws[4]
        level = np.where(p >= onset, np.maximum(p, 0.6), 0.0)
    elif f.shape == "intermittent":
        starts = r.random(n) < min(1.0, cadence_s / _PAUSE_MEAN_S)
        segment = np.cumsum(starts) % n
        on = r.random(n)[segment] < 0.3 + 0.6 * p
        level = p * on
    elif f.shape == "plateau":
        level = 0.6 * np.minimum(1.0, p / 0.25)
    else:
        level = p
    jitter = np.exp(r.normal(0.0, 0.3, n))
    return np.clip(level * jitter * f.peak, 0.0, 1.5)


def add_brakes(
    fx: Effects, g: int | slice, events: np.ndarray, r: np.random.Generator, cadence_s: float
) -> None:
    """Power brakes of a few seconds (lognormal, median 3 s) in the steps of `events` ((T,) or (T, G)
    for GPU `g`, or a slice of GPUs): their seconds go to `brake_s`; the last scrape is braked with the
    chance that a brake placed anywhere in the step spans its end."""
    seconds = np.minimum(np.exp(r.normal(np.log(3.0), 0.7, events.shape)), cadence_s) * events
    fx.brake_s[:, g] = np.minimum(fx.brake_s[:, g] + seconds, cadence_s)
    fx.brake[:, g] |= r.random(events.shape) < seconds / cadence_s


def apply_precursor(fx: Effects, f: ScheduledFailure, r: np.random.Generator, cadence_s: float) -> None:
    """Add one failure's (or aborted degradation's) precursor to the effects."""
    t = fx.t
    window = (t >= f.precursor_start_s) & (t < f.fail_s)
    if f.lead_s <= 0 or not window.any():
        return
    progress = np.where(window, np.clip((t - f.precursor_start_s) / f.lead_s, 0.0, 1.0), 0.0)
    e = np.where(window, _envelope(f, progress, r, cadence_s), 0.0)
    s, g, on, dt_min = f.strength, f.gpu, f.signals, cadence_s / 60.0
    mode = f.mode
    if g is None:
        _node_precursor(fx, f, e, window, dt_min)
        return
    if mode == "hbm_wear":
        # 0 SBE rate, 1 row remaps, 2 a pending remap, 3 Xid 92 (high SBE rate).
        fx.sbe_per_min[:, g] += window * (0.3 + s * 25.0 * np.expm1(4.0 * e) / math.expm1(4.0))
        if on[1]:
            fx.remap_p[:, g] += window * per_step(s * (0.02 + 0.6 * e**2), dt_min)
        if on[2]:
            fx.pending[:, g] |= window & (e > 0.25 + 0.5 * f.draws[1])
        if on[3]:
            fx.xid92_p[:, g] += window * (fx.sbe_per_min[:, g] > 8.0) * per_step(0.1, dt_min)
    elif mode == "gpu_sram":
        fx.sbe_per_min[:, g] += window * s * (0.1 + 3.0 * e**2)  # SRAM correctable errors count as SBE
    elif mode == "cooling":
        fx.temp_add[:, g] += s * 26.0 * e**1.5
    elif mode == "power":
        # 0 power-brake slowdowns, 1 power excursions. A brake lasts seconds: the step's last scrape
        # sees it only when it spans the step's end; the step's summary always does.
        events = window & (r.random(len(t)) < per_step(s * (0.01 + 0.5 * e**2), dt_min))
        add_brakes(fx, g, events, r, cadence_s)
        if on[1]:
            fx.power_noise[:, g] += 4.0 * s * e
    elif mode == "nvlink":
        # 0 CRC flit and data errors (peaking near 50/s: DCGM flags around 100/s), 1 replays, 2 recoveries.
        flit = s * (0.3 * e + 3000.0 * e**2)
        for k, scale in enumerate((1.0, 0.35, 0.6 if on[1] else 0.0)):
            fx.nvlink_per_min[k, :, g] += flit * scale
        if on[2]:
            fx.nvlink_per_min[3, :, g] += s * 0.4 * e**3
    elif mode == "pcie":
        # 0 replays, 1 width lost, 2 generation lost.
        fx.pcie_per_min[:, g] += s * (0.2 * e + 25.0 * e**2)
        if on[1] and f.draws[2] < 0.7:
            fx.width_down[:, g] |= window & (e > 0.45 + 0.45 * f.draws[3])
        if on[2] and f.draws[4] < 0.35:
            fx.gen_down[:, g] |= window & (e > 0.5 + 0.45 * f.draws[5])
    elif mode == "detachment":
        # 0 NVML calls slowing, 1 failing, 2 samples missing.
        fx.nvml_slow[:, g] *= 1.0 + 40.0 * s * e**3
        if on[1]:
            fx.nvml_fail_per_min[:, g] += 3.0 * s * e**2
        if on[2]:
            fx.missing[:, g] += np.minimum(0.6, 0.5 * s * e**2)


def _node_precursor(
    fx: Effects, f: ScheduledFailure, e: np.ndarray, window: np.ndarray, dt_min: float
) -> None:
    s, on = f.strength, f.signals
    if f.mode == "infiniband":
        # 0 symbol errors (and receive errors), 1 link error recovery, 2 ACK timeouts, 3 peer latency,
        # 4 peer loss, 5 TCP retransmits.
        port = min(int(f.draws[0] * fx.p), fx.p - 1)
        fx.ib_symbol_per_min[:, port] += s * (2.0 * e + 150.0 * e**2)
        fx.ib_rcv_per_min[:, port] += 0.4 * s * (2.0 * e + 150.0 * e**2)
        fx.ib_discard_per_min[:, port] += 0.2 * s * (2.0 * e + 150.0 * e**2)
        if on[1]:
            fx.ib_recovery_per_min[:, port] += s * 0.4 * e**3
        if on[2]:
            fx.ib_ack_timeout_per_min[:, port] += s * 5.0 * e**2
        if on[3]:
            fx.rtt *= 1.0 + 3.0 * s * e**2
            fx.rtt_tail *= (1.0 + 15.0 * s * e**2) / (1.0 + 3.0 * s * e**2)  # p99 grows 16x, p50 4x
        if on[4]:
            fx.loss += np.minimum(0.5, 0.08 * s * e**3)
        if on[5]:
            fx.retrans_per_min += s * 50.0 * e**2
    elif f.mode == "host":
        # 0 every GPU's NVML calls slow (a struggling host), 1 TCP retransmits.
        fx.nvml_slow *= (1.0 + 8.0 * s * e**2)[:, None]
        if on[1]:
            fx.retrans_per_min += s * 30.0 * e**2
    elif f.mode == "nccl_timeout":
        # 0 peer latency, 1 TCP retransmits, 2 peer loss.
        fx.rtt_tail *= 1.0 + 6.0 * s * e**2
        if on[1]:
            fx.retrans_per_min += s * 20.0 * e**2
        if on[2]:
            fx.loss += np.minimum(0.2, 0.03 * s * e**2)
