"""Telemetry of the independent twin, generated chunk by chunk of time from a Schedule.

Per step and GPU (numbers: world.py parameters, or the prior stated here):

- Workload per pod of nodes: training (utilization ~97%, data-loading dips, checkpoint pauses near
  idle power, evaluation phases at half power), bursty jobs (power 60 W <-> full in 30 s blocks, the
  temperature sees the mean), inference (partial load), idle gaps between jobs and after interruptions.
- Power: idle + load x (TDP - idle) x card efficiency; above the enforced limit it is held at the limit
  (SW power cap bit 0x04, clocks between base and boost). NVML reason bits: 0x01 idle, 0x04 SW power cap,
  0x08 HW slowdown (with 0x40 or 0x80), 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake (NVML).
- Temperature: first-order lag (tau, world) towards inlet + offset + R_th x mean power; the inlet has
  a daily cycle and hot racks; NVML reports whole degrees.
- Counters are cumulative per card and driver load; volatile ones reset on a driver reload or GPU reset,
  aggregate ECC and remap counters only with a new card. Fan speed is NOT_SUPPORTED (SXM boards), page
  retirement too unless the world says otherwise (row remapping replaces it on A100 and later, NVML).
- The collector: NVML call latency (slower during checkpoints), failed and timed-out calls, lost samples,
  whole scrapes lost, exporter outages (no rows) and frozen exporters (rows repeating stale values).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from faultcast.catalogue import TRACKED_XIDS, Scope, metrics_for
from faultcast.rollup import rollup_network
from faultcast.schemas import GPU_COLUMNS
from faultcast.sim.independent.events import DAY, Schedule
from faultcast.sim.independent.world import MODELS, IndependentConfig, World

IB_NAMES = [m.name.removeprefix("ib_") for m in metrics_for(Scope.IB_PORT)]
IF_NAMES = [m.name.removeprefix("net_") for m in metrics_for(Scope.INTERFACE)]
PEER_NAMES = [m.name.removeprefix("peer_") for m in metrics_for(Scope.PEER)]
HOST_NAMES = [m.name for m in metrics_for(Scope.HOST)]
_IB_GAUGES = {"port_state", "port_phys_state", "port_rate_gbps"}
_GPU_COUNTERS_VOLATILE = (
    "total_energy",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "pcie_replay",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_flit_errors_worst_link",
    "nvlink_crc_data_errors_worst_link",
    "nvlink_replay_errors_worst_link",
    "nvlink_recovery_errors_worst_link",
    "nvml_failed_calls",
    "nvml_timed_out_calls",
    *(f"xid_{x}_events" for x in TRACKED_XIDS),
    "xid_other_events",
)
_COLLECTOR_COLUMNS = frozenset(
    {"nvml_call_seconds", "nvml_slowest_call_seconds", "nvml_failed_calls", "nvml_timed_out_calls",
     "nvml_unsupported_fields", "gpu_lost", "xid_last", "xid_other_events",
     *(f"xid_{x}_events" for x in TRACKED_XIDS)}
)  # fmt: skip


def accumulate(
    carry: np.ndarray, inc: np.ndarray, reset: np.ndarray, start: np.ndarray | float = 0.0
) -> np.ndarray:
    """Cumulative values along axis 0 from `carry`, restarting at `start` where `reset` (before that
    step's increment). Shapes: carry (X...), inc and reset (T, X...)."""
    steps = inc.shape[0]
    cum = np.cumsum(inc, axis=0)
    before = cum - inc
    index = np.arange(steps).reshape((steps,) + (1,) * (inc.ndim - 1))
    last = np.maximum.accumulate(np.where(reset, index, -1), axis=0)
    safe = np.maximum(last, 0)
    offset = np.take_along_axis(before, safe, axis=0)
    base = np.take_along_axis(np.broadcast_to(start, inc.shape), safe, axis=0)
    values: np.ndarray = np.where(last >= 0, base + cum - offset, carry + cum)
    return values


def hold(carry: np.ndarray, event: np.ndarray, value: np.ndarray | float) -> np.ndarray:
    """A gauge that keeps the value of its last event (`event` true; `value` there), from `carry`."""
    steps = event.shape[0]
    index = np.arange(steps).reshape((steps,) + (1,) * (event.ndim - 1))
    last = np.maximum.accumulate(np.where(event, index, -1), axis=0)
    values = np.take_along_axis(np.broadcast_to(value, event.shape), np.maximum(last, 0), axis=0)
    return np.where(last >= 0, values, carry)


def _steps_of(times_s: float, cadence: float) -> int:
    """The first grid step at or after `times_s` (a sample there sees the event)."""
    return math.ceil(times_s / cadence - 1e-9)


@dataclass
class Chunk:
    """One chunk's output: GPU columns (T, U), network columns (T, N) and which rows exist."""

    first_step: int
    gpu: dict[str, np.ndarray]
    gpu_present: np.ndarray
    card: np.ndarray  # (T, U) card ids
    network: dict[str, np.ndarray]
    network_present: np.ndarray


class Fleet:
    """Generates chunks in time order, carrying state (temperatures, counters) between them."""

    def __init__(self, config: IndependentConfig, world: World, schedule: Schedule) -> None:
        self.c, self.w, self.s = config, world, schedule
        n, g = config.nodes, config.gpus_per_node
        self.n, self.g, self.u = n, g, n * g
        self.node_of = np.arange(self.u) // g
        self.pod_of = schedule.node_pod[self.node_of]
        self.pods = int(schedule.node_pod.max()) + 1
        m = schedule.node_model[self.node_of]
        self.model_of = m
        self.tdp = np.array([MODELS[i].tdp_w for i in m])
        self.idle_w = np.array([MODELS[i].idle_w for i in m])
        self.max_mhz = np.array([MODELS[i].max_sm_mhz for i in m])
        self.base_mhz = np.array([MODELS[i].base_sm_mhz for i in m])
        self.idle_mhz = np.array([MODELS[i].idle_sm_mhz for i in m])
        self.mem_mhz = np.array([MODELS[i].mem_mhz for i in m])
        self.fb = np.array([MODELS[i].fb_mib for i in m])
        self.gen_max = np.array([MODELS[i].pcie_gen for i in m], dtype=np.float64)
        self.nvlinks = np.array([MODELS[i].nvlinks for i in m], dtype=np.float64)
        self.sw_c = np.array([MODELS[i].sw_thermal_c for i in m])
        self.hw_c = np.array([MODELS[i].hw_thermal_c for i in m])
        self.is_h100 = np.array([MODELS[i].name.find("H100") >= 0 for i in m])
        self.rth = np.where(self.is_h100, world["rth_h100"], world["rth_a100"])
        tau = np.where(self.is_h100, world["tau_s_h100"], world["tau_s_a100"])
        self.alpha = np.exp(-config.cadence_s / tau)
        self.limit = schedule.power_limit[self.node_of]
        self.gbps = np.array([MODELS[i].ib_gbps for i in schedule.node_model])
        cards = schedule
        self.card_offset = np.array(cards.card_offset_c)
        self.card_eff = np.array(cards.card_efficiency)
        self.card_sbe = np.array(cards.card_sbe_rate)
        self.card_nvl = np.array(cards.card_nvlink_rate)
        self.card_dom = np.array(cards.card_nvlink_dominant)
        self.card_pcie = np.array(cards.card_pcie_rate)
        self.card_down = np.array(cards.card_downtrained)
        self.card_nvml = np.array(cards.card_nvml_s)
        self.card_init = {
            "ecc_sbe_aggregate": np.array(cards.card_agg_sbe),
            "ecc_dbe_aggregate": np.array(cards.card_agg_dbe),
            "remapped_rows_correctable": np.array(cards.card_remapped),
            "remapped_rows_uncorrectable": np.zeros(len(cards.card_unit)),
        }
        rng = np.random.default_rng([config.seed, 0x5EED, 3])
        ports = world["ib_ports"]
        self.ports = ports
        self.port_symbol = world["ib_symbol_per_port_day"] * rng.lognormal(0.0, 1.5, (n, ports))
        self.node_rtt = world["rtt_p50_s"] * rng.lognormal(0.0, 0.2, n)
        # state carried between chunks
        start_cards = np.array([sc[0][1] for sc in schedule.slot_cards])
        self.temp = world["inlet_c"] + self.card_offset[start_cards] + self.rth * self.idle_w
        self.gpu_carry: dict[str, np.ndarray] = {name: np.zeros(self.u) for name in _GPU_COUNTERS_VOLATILE}
        for name, init in self.card_init.items():
            self.gpu_carry[name] = init[start_cards].copy()
        self.pending = np.zeros(self.u)
        self.xid_last = np.zeros(self.u)
        self.last_row: dict[str, np.ndarray] | None = None
        self.net_carry: dict[str, np.ndarray] = {}
        self.last_card = start_cards
        self.failure_steps = [(_steps_of(f.time_s, config.cadence_s), f) for f in schedule.failures]

    # --- public -------------------------------------------------------------------------------------

    def chunks(self) -> Iterator[Chunk]:
        per = max(1, self.c.rows_per_group // self.u)
        for index, s0 in enumerate(range(0, self.c.steps, per)):
            s1 = min(self.c.steps, s0 + per)
            rng = np.random.default_rng([self.c.seed, 0x5EED, 4, index])
            yield self._chunk(s0, s1, rng)

    # --- one chunk ---------------------------------------------------------------------------------------

    def _mask_intervals(
        self, shape: tuple[int, int], intervals: list[tuple[int, float, float]], k0: int, *, inclusive: bool
    ) -> np.ndarray:
        """(T, X) mask of steps within [from, until) per entity; `inclusive`: steps after the from-step
        up to the step before the until-step (dark after a failure's last sample)."""
        mask = np.zeros(shape, dtype=bool)
        cad = self.c.cadence_s
        for x, a, b in intervals:
            if inclusive:
                lo, hi = _steps_of(a, cad) + 1, _steps_of(b, cad)
            else:
                lo, hi = _steps_of(a, cad), _steps_of(b, cad)
            lo, hi = max(lo - k0, 0), min(hi - k0, shape[0])
            if lo < hi:
                mask[lo:hi, x] = True
        return mask

    def _events(self, shape: tuple[int, int], events: list[tuple[int, float]], k0: int) -> np.ndarray:
        mask = np.zeros(shape, dtype=bool)
        for x, t in events:
            k = _steps_of(t, self.c.cadence_s) - k0
            if 0 <= k < shape[0]:
                mask[k, x] = True
        return mask

    def _workload(self, t: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Per pod (T, P): utilization, power fraction (sampled and mean), memory and traffic shares."""
        w, steps, pods = self.w, len(t), self.pods
        active = np.zeros((steps, pods), dtype=bool)
        kind = np.zeros((steps, pods))
        intensity = np.zeros((steps, pods))
        since = np.zeros((steps, pods))
        phase = np.zeros((steps, pods))
        for p in range(pods):
            jobs = self.s.jobs[p]
            idx = np.searchsorted(jobs[:, 0], t, side="right") - 1
            safe = np.maximum(idx, 0)
            inside = (idx >= 0) & (t < jobs[safe, 1])
            for a, b in self.s.pod_gaps[p]:
                inside &= ~((t >= a) & (t < b))
            active[:, p] = inside
            kind[:, p] = jobs[safe, 2]
            intensity[:, p] = jobs[safe, 3]
            since[:, p] = t - jobs[safe, 0]
            phase[:, p] = jobs[safe, 4]
        ck_period = w["checkpoint_period_min"] * 60
        checkpoint = (
            active & (kind != 1) & ((since % ck_period) >= ck_period - w["checkpoint_pause_min"] * 60)
        )
        evaluation = (
            active
            & (kind == 0)
            & ~checkpoint
            & (((since + phase) % (w["eval_period_h"] * 3600)) < w["eval_min"] * 60)
        )
        dip = active & (kind == 0) & (rng.random((steps, pods)) < w["dataload_dip_p"])
        block = np.floor((t + self.c.start_unix_s) / 30.0).astype(np.int64)
        draws = rng.random((int(block[-1] - block[0]) + 1, pods))
        burst_on = draws[block - block[0]] < 0.5

        util = np.where(kind == 0, 97.0 + rng.normal(0, 1.5, (steps, pods)), 0.0)
        frac = np.where(kind == 0, intensity, 0.0)
        frac_mean = frac.copy()
        bursty = kind == 1
        util = np.where(bursty, np.where(burst_on, 99.0, 3.0), util)
        frac = np.where(bursty, np.where(burst_on, intensity, 0.0), frac)
        frac_mean = np.where(bursty, 0.5 * intensity, frac_mean)
        infer = kind == 2
        load = rng.uniform(0.2, 0.6, (steps, pods))
        util = np.where(infer, 100 * load, util)
        frac = np.where(infer, load * intensity * 0.8, frac)
        frac_mean = np.where(infer, frac, frac_mean)
        util = np.where(evaluation, 60.0 + rng.normal(0, 5, (steps, pods)), util)
        frac = np.where(evaluation, 0.5 * intensity, frac)
        frac_mean = np.where(evaluation, frac, frac_mean)
        util = np.where(dip, util * rng.uniform(0.3, 0.7, (steps, pods)), util)
        frac = np.where(dip, frac * 0.6, frac)
        frac_mean = np.where(dip, frac, frac_mean)
        util = np.where(checkpoint, 2.0, util)
        frac = np.where(checkpoint, 0.05, frac)
        frac_mean = np.where(checkpoint, 0.05, frac_mean)
        util = np.where(active, np.clip(util, 0, 100), 0.0)
        frac = np.where(active, frac, 0.0)
        frac_mean = np.where(active, frac_mean, 0.0)
        net = np.where(active, np.where(kind == 0, 0.3 * intensity, 0.05), 0.0005)
        net = np.where(evaluation, 0.1, np.where(checkpoint, 0.02, net))
        return {
            "active": active,
            "util": util,
            "frac": frac,
            "frac_mean": frac_mean,
            "checkpoint": checkpoint,
            "net": net,
            "memutil": np.where(active, np.clip(util * 0.4 + rng.normal(0, 3, (steps, pods)), 0, 100), 0.0),
            "fb": np.where(active, np.where(kind == 2, 0.5, 0.85) * intensity, 0.0),
        }

    def _intensity(self, t: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Per channel "kind.signal": (T, U) GPU intensities, or (T, N) for "ib.*"; the bad port of the
        node's network episode in "ib.port"."""
        steps = len(t)
        out: dict[str, np.ndarray] = {}
        block_s = 600.0
        for e in self.s.episodes:
            if e.t1 <= t[0] - self.c.cadence_s or e.t0 > t[-1]:
                continue
            inside = (t > e.t0) & (t <= e.t1)
            if not inside.any():
                continue
            span = max(e.t1 - e.t0, 1.0)
            x = np.clip((t[inside] - e.t0) / span, 0.0, 1.0)
            blocks = np.floor((t[inside] - e.t0) / block_s).astype(np.int64)
            on = rng.random(int(blocks.max() - blocks.min()) + 1)[blocks - blocks.min()] < e.on_fraction
            value = e.strength * (x**e.shape if e.shape > 0 else np.ones_like(x)) * on
            if e.kind == "ib":
                targets = [e.node]
            else:
                targets = (
                    [e.node * self.g + e.gpu]
                    if e.gpu >= 0
                    else list(range(e.node * self.g, e.node * self.g + self.g))
                )
            for channel in e.channels:
                key = f"{e.kind}.{channel}"
                if key not in out:
                    out[key] = np.zeros((steps, self.n if e.kind == "ib" else self.u))
                arr = out[key]
                sub = arr[inside][:, targets]
                arr[np.flatnonzero(inside)[:, None], np.array(targets)[None, :]] = np.maximum(
                    sub, value[:, None]
                )
            if e.kind == "ib":
                if "ib.port" not in out:
                    out["ib.port"] = np.zeros((steps, self.n))
                out["ib.port"][inside, e.node] = e.port
        return out

    def _chunk(self, k0: int, k1: int, rng: np.random.Generator) -> Chunk:
        c, w, s = self.c, self.w, self.s
        steps, units, n, g = k1 - k0, self.u, self.n, self.g
        cad = c.cadence_s
        t = (np.arange(k0, k1) * cad).astype(np.float64)
        shape = (steps, units)
        node = self.node_of

        # Identity and availability ----------------------------------------------------------------
        card = np.broadcast_to(np.array([sc[0][1] for sc in s.slot_cards]), shape).copy()
        for u, entries in enumerate(s.slot_cards):
            for at, cid in entries[1:]:
                card[t >= at, u] = cid
        prev_card = np.vstack([self.last_card[None, :], card[:-1]])
        new_card = card != prev_card
        node_dark = self._mask_intervals((steps, n), s.node_dark, k0, inclusive=True)
        gpu_dark = self._mask_intervals(shape, s.gpu_dark, k0, inclusive=True) | node_dark[:, node]
        outage = self._mask_intervals((steps, n), s.exporter_outages, k0, inclusive=False)
        frozen_node = self._mask_intervals((steps, n), s.frozen, k0, inclusive=False)
        node_reset = self._events((steps, n), s.node_resets, k0)
        reset = (
            self._events(shape, s.gpu_resets, k0)
            | node_reset[:, node]
            | self._events((steps, n), s.driver_reloads, k0)[:, node]
            | new_card
        )
        lost_scrape = (rng.random((steps, n)) < w["scrape_loss_p"]) | outage
        fail_xid = np.zeros(shape)
        fail_row = np.zeros(shape, dtype=bool)
        fail_lost = np.zeros(shape, dtype=bool)
        fail_dbe = np.zeros(shape)
        fail_remap_failure = np.zeros(shape)
        node_fail_row = np.zeros((steps, n), dtype=bool)
        for k, f in self.failure_steps:
            if not k0 <= k < k1:
                continue
            r = k - k0
            hit = [f.node * g + f.gpu] if f.gpu >= 0 else list(range(f.node * g, f.node * g + g))
            if f.gpu < 0:
                node_fail_row[r, f.node] = f.cause.repair
            if f.xid:
                fail_xid[r, hit] = f.xid
            fail_row[r, hit] = True
            if f.xid == 79:
                fail_lost[r, hit] = True
            if f.cause.precursor == "hbm" and f.gpu >= 0:
                fail_dbe[r, hit] = 1.0
                fail_remap_failure[r, hit] = float(f.xid == 64)

        # Workload, power, clocks ------------------------------------------------------------------
        wl = self._workload(t, rng)
        pod = self.pod_of
        active = wl["active"][:, pod]
        util = np.where(active, np.clip(wl["util"][:, pod] + rng.normal(0, 1.0, shape), 0, 100), 0.0)
        eff = self.card_eff[card]
        span = (self.tdp - self.idle_w) * eff
        noise = rng.normal(0, 0.01, shape) * self.tdp
        demand = self.idle_w + wl["frac"][:, pod] * span + noise
        mean_power = self.idle_w + wl["frac_mean"][:, pod] * span
        ch = self._intensity(t, rng)
        zero = np.zeros(shape)

        def gch(key: str) -> np.ndarray:
            return ch.get(key, zero)

        capped = demand > self.limit
        power = np.where(capped, self.limit - np.abs(rng.normal(0, 0.004, shape)) * self.tdp, demand)
        mean_power = np.minimum(mean_power, self.limit)
        headroom = np.clip(1.0 - 3.0 * (demand - self.limit) / self.limit, 0.0, 1.0)
        clock = np.where(capped, self.base_mhz + (self.max_mhz - self.base_mhz) * headroom, self.max_mhz)
        clock = np.where(util > 5, clock - np.abs(rng.normal(0, 10, shape)), self.idle_mhz)
        brake = rng.random(shape) < 0.15 * gch("power.brake")
        rack_brake = rng.random((steps, int(s.node_rack.max()) + 1)) < 0.02 * cad / DAY  # prior: PDU events
        brake |= rack_brake[:, s.node_rack[node]]
        excursion = rng.random(shape) < 0.2 * gch("power.excursion")
        power = np.where(excursion, power * rng.uniform(1.05, 1.3, shape), power)
        power = np.where(brake, power * 0.55, power)
        clock = np.where(brake, clock * 0.45, clock)
        clock = np.where(util > 5, clock - 150 * gch("power.clock"), clock)

        # Temperature -------------------------------------------------------------------------------
        hour = ((t + c.start_unix_s) % DAY) / 3600.0
        rack = s.node_rack
        inlet = (
            w["inlet_c"]
            + w["hot_rack_delta_c"] * s.hot_rack[rack][None, :]
            + w["daily_amplitude_c"] * np.sin(2 * np.pi * (hour[:, None] - 9.0) / 24.0)
            + rng.normal(0, 0.2, (steps, n))
        )
        cool = 1.0 + 0.8 * gch("cooling.temp")
        target = inlet[:, node] + self.card_offset[card] + self.rth * mean_power * cool
        temp = np.empty(shape)
        current = self.temp
        for k in range(steps):
            current = self.alpha * current + (1 - self.alpha) * target[k]
            temp[k] = current
        self.temp = current
        sw_thermal = temp > self.sw_c
        hw_thermal = temp > self.hw_c
        clock = np.where(sw_thermal, clock - (temp - self.sw_c) * 40, clock)
        clock = np.where(hw_thermal, clock * 0.5, clock)
        clock = np.maximum(np.round(clock / 15) * 15, self.idle_mhz)
        idle = util < 1
        reasons = (
            idle * 0x01 + capped * 0x04 + (hw_thermal | brake) * 0x08 + sw_thermal * 0x20
            + hw_thermal * 0x40 + brake * 0x80
        )  # fmt: skip
        mem_temp = temp + w["hbm_offset_c"] + 3.0 * wl["memutil"][:, pod] / 100 + 10 * gch("cooling.hbm_temp")

        # ECC, remaps -------------------------------------------------------------------------------
        day = np.floor((t + c.start_unix_s) / DAY).astype(np.int64)
        day_factor = np.ones(shape)
        for d in np.unique(day):
            draws = np.random.default_rng([c.seed, 0x5EED, 5, int(d)]).lognormal(0.0, 1.0, len(self.card_sbe))
            day_factor[day == d] = draws[card[day == d]]
        sbe_rate = self.card_sbe[card] * day_factor * np.exp(0.03 * (temp - 65)) + 3000 * gch("hbm.sbe")
        sbe = rng.poisson(sbe_rate * cad / DAY).astype(np.float64)
        remap = rng.random(shape) < (w["benign_remap_per_gpu_day"] + 24 * gch("hbm.remap")) * cad / DAY
        contained = rng.random(shape) < w["benign_contained_dbe_per_gpu_day"] * cad / DAY
        dbe = contained + fail_dbe

        # PCIe, NVLink -------------------------------------------------------------------------------
        pcie_burst = rng.random(shape) < w["pcie_burst_per_gpu_day"] * cad / DAY
        replay = rng.poisson(self.card_pcie[card] * cad / DAY + 30 * gch("pcie.replay") * cad / 60)
        replay = replay + pcie_burst * rng.geometric(0.01, shape)
        gen = np.where(idle & w["pcie_idle_downshift"], 1.0, self.gen_max)
        width = np.where(self.card_down[card], 8.0, 16.0)
        down = rng.random(shape) < 0.5 * gch("pcie.downtrain") ** 2
        halve = rng.random(shape) < 0.5
        width = np.where(down & halve, 8.0, width)
        gen = np.where(down & ~halve, np.maximum(self.gen_max - 1, 1), gen)
        nvl_burst = rng.random(shape) < w["nvlink_burst_per_gpu_day"] * cad / DAY
        flit_bg = rng.poisson(self.card_nvl[card] * cad / DAY) + nvl_burst * rng.geometric(0.02, shape)
        flit_pre = rng.poisson(40 * gch("nvlink.crc") * cad / 60)
        data_bg = rng.poisson(0.2 * flit_bg)
        data_pre = rng.poisson(10 * gch("nvlink.crc") * cad / 60)
        replay_bg = rng.poisson(0.5 * flit_bg)
        replay_pre = rng.poisson(20 * gch("nvlink.replay") * cad / 60)
        recov_bg = rng.poisson(0.01 * flit_bg)
        recov_pre = rng.poisson(0.2 * gch("nvlink.replay") * cad / 60)
        dom = self.card_dom[card]
        links = self.nvlinks - (rng.random(shape) < 0.3 * gch("nvlink.link_drop") ** 2)

        # Xids: later sources win a step (one code per GPU and step) ---------------------------------
        xid = np.zeros(shape)
        xid[rng.random(shape) < w["app_xid31_per_gpu_day"] * cad / DAY * active] = 31
        ends = self._job_ends(t, k0)
        xid[ends[:, pod] & (rng.random(shape) < 0.3)] = 45  # prior: teardown Xid 45 ("other")
        crash = self._events((steps, self.pods), s.app_crashes, k0)[:, pod]
        xid[crash] = np.where(rng.random() < 0.5, 13, 43)
        xid[rng.random(shape) < w["benign_xid74_per_gpu_day"] * cad / DAY] = 74
        xid[rng.random(shape) < w["benign_xid119_per_gpu_day"] * cad / DAY] = 119
        xid[contained] = 94
        xid[remap] = 63
        xid[(sbe >= 10 * cad / 60) & (rng.random(shape) < 0.5)] = 92  # the driver flags a high SBE rate
        xid[rng.random(shape) < 0.02 * gch("nvlink.xid74") * cad / 60] = 74
        xid = np.where(fail_xid > 0, fail_xid, xid)

        # Collector ------------------------------------------------------------------------------------
        slow = 1 + 30 * gch("structural.latency") + wl["checkpoint"][:, pod]
        call = self.card_nvml[card] * rng.lognormal(0, 0.25, shape) * slow
        slowest = call * rng.uniform(0.15, 0.5, shape)
        failed = rng.poisson(w["nvml_fail_p"] + 0.5 * gch("structural.failed"))
        timed_out = rng.poisson(0.1 * gch("structural.failed"))
        missing = rng.random(shape) < w["gpu_sample_loss_p"] + 0.4 * gch("structural.missing")

        # Assemble ------------------------------------------------------------------------------------
        inc: dict[str, np.ndarray] = {
            "total_energy": mean_power * cad * 1000.0,
            "ecc_sbe_volatile": sbe,
            "ecc_dbe_volatile": dbe,
            "pcie_replay": replay,
            "nvlink_crc_flit_errors": flit_bg + flit_pre,
            "nvlink_crc_data_errors": data_bg + data_pre,
            "nvlink_replay_errors": replay_bg + replay_pre,
            "nvlink_recovery_errors": recov_bg + recov_pre,
            "nvlink_crc_flit_errors_worst_link": rng.binomial(flit_bg, dom) + flit_pre,
            "nvlink_crc_data_errors_worst_link": rng.binomial(data_bg, dom) + data_pre,
            "nvlink_replay_errors_worst_link": rng.binomial(replay_bg, dom) + replay_pre,
            "nvlink_recovery_errors_worst_link": rng.binomial(recov_bg, dom) + recov_pre,
            "nvml_failed_calls": failed + fail_lost * 5,
            "nvml_timed_out_calls": timed_out,
        }
        for code in TRACKED_XIDS:
            inc[f"xid_{code}_events"] = (xid == code).astype(np.float64)
        inc["xid_other_events"] = ((xid > 0) & ~np.isin(xid, TRACKED_XIDS)).astype(np.float64)
        cols: dict[str, np.ndarray] = {}
        for name, values in inc.items():
            cols[name] = accumulate(self.gpu_carry[name], values.astype(np.float64), reset)
        agg_inc = {
            "ecc_sbe_aggregate": sbe,
            "ecc_dbe_aggregate": dbe,
            "remapped_rows_correctable": remap.astype(np.float64),
            "remapped_rows_uncorrectable": dbe,
        }
        for name, values in agg_inc.items():
            cols[name] = accumulate(self.gpu_carry[name], values, new_card, self.card_init[name][card])
        for name in (*inc, *agg_inc):
            self.gpu_carry[name] = cols[name][-1].copy()
        pending = hold(self.pending, reset | remap | contained, (remap | contained).astype(np.float64))
        self.pending = pending[-1].copy()
        xid_last = hold(self.xid_last, reset | (xid > 0), xid)
        self.xid_last = xid_last[-1].copy()

        fb_used = np.where(active, wl["fb"][:, pod] * self.fb + rng.normal(0, 50, shape), 1.0 + 0 * util)
        fb_used = np.clip(fb_used, 0, self.fb - 600)
        pstate = np.where(active | ~idle, 0.0, float(w["idle_pstate"]))
        rx = np.where(active, rng.lognormal(np.log(8e8), 0.5, shape), 2e5)
        tx = np.where(wl["checkpoint"][:, pod], rng.lognormal(np.log(1e10), 0.3, shape), rx * 0.3)
        cols.update(
            {
                "gpu_temp": np.round(temp + rng.normal(0, 0.4, shape)),
                "memory_temp": np.round(mem_temp + rng.normal(0, 0.5, shape)),
                "power_usage": np.round(np.maximum(power, 0.5 * self.idle_w), 3),
                "power_limit": np.broadcast_to(self.limit, shape).astype(np.float64),
                "sm_clock": clock,
                "mem_clock": np.where(pstate > 0, 810.0, self.mem_mhz),  # prior: P8 memory clock
                "gpu_util": np.round(util),
                "mem_copy_util": np.round(wl["memutil"][:, pod] * active),
                "fb_used": np.round(fb_used),
                "fb_free": np.round(self.fb - 530 - fb_used),
                "fan_speed": np.full(shape, np.nan),
                "pstate": pstate,
                "clock_event_reasons": reasons.astype(np.float64),
                "throttle_sw_power_cap": capped.astype(np.float64),
                "throttle_hw_slowdown": (hw_thermal | brake).astype(np.float64),
                "throttle_sw_thermal": sw_thermal.astype(np.float64),
                "throttle_hw_thermal": hw_thermal.astype(np.float64),
                "throttle_hw_power_brake": brake.astype(np.float64),
                "row_remap_pending": pending,
                "row_remap_failure": fail_remap_failure,
                "pcie_link_gen": gen,
                "pcie_link_width": width,
                "pcie_link_gen_max": np.broadcast_to(self.gen_max, shape).astype(np.float64),
                "pcie_link_width_max": np.full(shape, 16.0),
                "pcie_tx_bytes_per_second": np.round(tx, -3),
                "pcie_rx_bytes_per_second": np.round(rx, -3),
                "nvlink_links_active": links,
                "xid_last": xid_last,
                "nvml_call_seconds": call,
                "nvml_slowest_call_seconds": slowest,
                "nvml_unsupported_fields": np.full(shape, 1.0 if w["retired_pages_supported"] else 4.0),
                "gpu_lost": fail_lost.astype(np.float64),
            }
        )
        if w["retired_pages_supported"]:
            cols["retired_pages_sbe"] = cols["remapped_rows_correctable"].copy()
            cols["retired_pages_dbe"] = cols["remapped_rows_uncorrectable"].copy()
            cols["retired_pages_pending"] = pending.copy()
        else:
            for name in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
                cols[name] = np.full(shape, np.nan)
        missing_names = set(GPU_COLUMNS) - set(cols)
        if missing_names:
            raise AssertionError(f"columns not generated: {sorted(missing_names)}")
        # A GPU that fell off the bus answers nothing but the collector's own fields.
        for name in GPU_COLUMNS:
            if name not in _COLLECTOR_COLUMNS:
                cols[name] = np.where(fail_lost, np.nan, cols[name])
        # Frozen exporters repeat the last values they read (the failure row breaks through).
        frozen = frozen_node[:, node] & ~fail_row
        if frozen.any():
            index = np.arange(steps)[:, None]
            last = np.maximum.accumulate(np.where(frozen, -1, index), axis=0)
            for name in GPU_COLUMNS:
                held = np.take_along_axis(cols[name], np.maximum(last, 0), axis=0)
                carry = self.last_row[name] if self.last_row is not None else cols[name][0]
                cols[name] = np.where(frozen, np.where(last >= 0, held, carry), cols[name])
        self.last_row = {name: cols[name][-1].copy() for name in GPU_COLUMNS}
        self.last_card = card[-1].copy()
        present = (~gpu_dark & ~lost_scrape[:, node] & ~missing) | fail_row

        network = self._network(t, k0, wl, ch, rng, node_reset, node_fail_row)
        net_present = (~node_dark & ~lost_scrape) | node_fail_row
        return Chunk(k0, cols, present, card, network, net_present)

    def _job_ends(self, t: np.ndarray, k0: int) -> np.ndarray:
        events = [(p, float(end)) for p, jobs in enumerate(self.s.jobs) for end in jobs[:, 1]]
        lo, hi = t[0] - self.c.cadence_s, t[-1]
        return self._events((len(t), self.pods), [(p, e) for p, e in events if lo < e <= hi], k0)

    # --- network ------------------------------------------------------------------------------------------

    def _network(
        self,
        t: np.ndarray,
        k0: int,
        wl: dict[str, np.ndarray],
        ch: dict[str, np.ndarray],
        rng: np.random.Generator,
        reboot: np.ndarray,
        fail_row: np.ndarray,
    ) -> dict[str, np.ndarray]:
        w, cad = self.w, self.c.cadence_s
        steps, n, ports = len(t), self.n, self.ports
        zero = np.zeros((steps, n))

        def nch(key: str) -> np.ndarray:
            return ch.get(key, zero)

        net = wl["net"][:, self.s.node_pod]  # (T, N)
        bad = (nch("ib.port")[:, :, None] == np.arange(ports)[None, None, :]) & (
            sum((nch(f"ib.{k}") for k in ("symbol", "ler", "rcv", "flap", "rtt", "ack")), zero) > 0
        )[:, :, None]

        def on_bad(key: str) -> np.ndarray:
            signal: np.ndarray = nch(key)[:, :, None] * bad
            return signal

        shape3 = (steps, n, ports)
        octets = net[:, :, None] * (self.gbps[None, :, None] / 8 * 1e9) * cad * rng.lognormal(0, 0.1, shape3)
        flap = rng.random(shape3) < w["ib_flap_per_port_day"] * cad / DAY + 0.02 * on_bad("ib.flap")
        flap |= fail_row[:, :, None] & (np.arange(ports)[None, None, :] == nch("ib.port")[:, :, None])
        symbol = rng.poisson(self.port_symbol[None] * cad / DAY + 3 * on_bad("ib.symbol") * cad / 60)
        symbol = symbol + flap * rng.geometric(0.05, shape3)
        inc = {
            "symbol_error": symbol,
            "link_downed": flap.astype(np.float64),
            "link_error_recovery": rng.poisson(0.3 * on_bad("ib.ler") * cad / 60) + flap,
            "port_rcv_errors": rng.poisson(0.2 * symbol + 0.5 * on_bad("ib.rcv") * cad / 60),
            "port_xmit_discards": rng.poisson(octets * w["ib_congestion_discards"])
            + flap * rng.geometric(0.002, shape3),
            "local_link_integrity_errors": rng.poisson(0.05 * on_bad("ib.symbol") * cad / 60),
            "excessive_buffer_overrun_errors": rng.poisson(np.full(shape3, 1e-7)),
            "port_rcv_data": np.round(octets * rng.uniform(0.95, 1.05, shape3)),
            "port_xmit_data": np.round(octets),
            "rnr_nak_retry_err": rng.poisson(np.full(shape3, 1e-6)),
            "local_ack_timeout_err": rng.poisson(1e-4 + 0.5 * on_bad("ib.ack") * cad / 60) + flap * 5,
            "out_of_sequence": rng.poisson(octets * 1e-13),
            "packet_seq_err": rng.poisson(1e-5 + 0.1 * on_bad("ib.ack") * cad / 60),
        }
        reset3 = np.broadcast_to(reboot[:, :, None], shape3)
        ib = np.zeros((*shape3, len(IB_NAMES)))
        for i, name in enumerate(IB_NAMES):
            if name in _IB_GAUGES:
                continue
            carry = self.net_carry.get(f"ib.{name}", np.zeros((n, ports)))
            ib[..., i] = accumulate(carry, inc[name].astype(np.float64), reset3)
            self.net_carry[f"ib.{name}"] = ib[-1, ..., i].copy()
        caught = flap & (rng.random(shape3) < 0.5)
        ib[..., IB_NAMES.index("port_state")] = np.where(caught, 1.0, 4.0)
        ib[..., IB_NAMES.index("port_phys_state")] = np.where(caught, 2.0, 5.0)
        slow_link = rng.random(shape3) < 0.2 * on_bad("ib.flap") ** 2
        ib[..., IB_NAMES.index("port_rate_gbps")] = np.where(slow_link, 0.5, 1.0) * self.gbps[None, :, None]

        eth_bytes = (1e6 + net * 2e8) * rng.lognormal(0, 0.3, (steps, n)) * cad
        iface_inc = {
            "rx_bytes": np.round(eth_bytes),
            "tx_bytes": np.round(eth_bytes * 0.6),
            "rx_packets": np.round(eth_bytes / 1200),
            "tx_packets": np.round(eth_bytes * 0.6 / 1200),
            "rx_errors": rng.poisson(np.full((steps, n), 1e-6)),
            "tx_errors": rng.poisson(np.full((steps, n), 1e-6)),
            "rx_dropped": rng.poisson(np.full((steps, n), 1e-3 * cad)),
            "tx_dropped": rng.poisson(np.full((steps, n), 1e-5)),
        }
        iface = np.zeros((steps, n, 1, len(IF_NAMES)))
        for i, name in enumerate(IF_NAMES):
            carry = self.net_carry.get(f"if.{name}", np.zeros(n))
            iface[:, :, 0, i] = accumulate(carry, iface_inc[name].astype(np.float64), reboot)
            self.net_carry[f"if.{name}"] = iface[-1, :, 0, i].copy()

        rtt_pre = nch("ib.rtt")
        out_segs = (2000 + net * 2e4) * cad * rng.lognormal(0, 0.2, (steps, n))
        host_inc = {
            "tcp_retrans_segs": rng.poisson(out_segs * w["tcp_retrans_ratio"] * (1 + 50 * rtt_pre)),
            "tcp_out_segs": np.round(out_segs),
            "tcp_in_errs": rng.poisson(np.full((steps, n), 1e-4)),
        }
        host = np.zeros((steps, n, len(HOST_NAMES)))
        for i, name in enumerate(HOST_NAMES):
            carry = self.net_carry.get(f"host.{name}", np.zeros(n))
            host[:, :, i] = accumulate(carry, host_inc[name].astype(np.float64), reboot)
            self.net_carry[f"host.{name}"] = host[-1, :, i].copy()

        k = w["peers"]
        shape_p = (steps, n, k)
        first_peer = (np.arange(k) == 0)[None, None, :]
        any_flap = flap.any(axis=2)[:, :, None]
        p50 = self.node_rtt[None, :, None] * (1 + 0.3 * net[:, :, None]) * rng.lognormal(0, 0.1, shape_p)
        p50 = p50 * (1 + 3 * rtt_pre[:, :, None] * first_peer)
        p99 = p50 * rng.uniform(2, 5, shape_p) * (1 + 5 * rtt_pre[:, :, None] * first_peer)
        loss = (
            (rng.random(shape_p) < 0.3 * rtt_pre[:, :, None]) * rng.uniform(0.01, 0.2, shape_p) * first_peer
        )
        loss = np.where(any_flap & first_peer, np.maximum(loss, 0.2), loss)
        peers = np.zeros((*shape_p, len(PEER_NAMES)))
        peers[..., PEER_NAMES.index("rtt_p50_seconds")] = p50
        peers[..., PEER_NAMES.index("rtt_p99_seconds")] = p99
        peers[..., PEER_NAMES.index("loss_ratio")] = loss
        carry = self.net_carry.get("peer.probes", np.zeros((n, k)))
        probes = accumulate(carry, np.full(shape_p, cad / 5.0), np.broadcast_to(reboot[:, :, None], shape_p))
        self.net_carry["peer.probes"] = probes[-1].copy()
        peers[..., PEER_NAMES.index("probes")] = probes
        return rollup_network(ib, iface, peers, host)
