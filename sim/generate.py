"""Telemetry of one node over one chunk of time steps, from its traits, schedule and carried state.

The unit of generation is (node, chunk): its random streams are keyed by both, and the only thing
carried from one chunk to the next is `NodeState` (counter values). The offline writer and the
live source call the same function, so they produce the same numbers.

Vectorised over time and GPUs: each signal is a (T, G) array. The physics, per failure mode and per
confounder, is described in docs/failure-modes.md; the constants below are the knobs it names.
"""

from __future__ import annotations

import enum
import math
import zlib
from dataclasses import dataclass

import numpy as np

from faultcast.catalogue import TRACKED_XIDS, Kind, Scope, index_of, metrics_for
from faultcast.rollup import is_wide
from faultcast.sim.config import FleetConfig
from faultcast.sim.episodes import episodes, spilled
from faultcast.sim.fleet import NodeTraits
from faultcast.sim.lookalikes import apply_lookalikes
from faultcast.sim.precursors import Effects, apply_precursor
from faultcast.sim.schedule import NodeSchedule, in_windows
from faultcast.sim.streams import Stream, rng
from faultcast.sim.substep import summarise
from faultcast.sim.thermal import daily_cycle_c, stage_rises, weather_c
from faultcast.step_summary import SUMMARISED

NAN = math.nan
GPU_INDEX = index_of(Scope.GPU)
N_GPU_METRICS = len(metrics_for(Scope.GPU))
IB_METRICS = metrics_for(Scope.IB_PORT)
IF_METRICS = metrics_for(Scope.INTERFACE)
PEER_METRICS = metrics_for(Scope.PEER)
HOST_METRICS = metrics_for(Scope.HOST)


GPU_WIDE, IB_WIDE, IF_WIDE, PEER_WIDE, HOST_WIDE = (
    np.array([is_wide(m) for m in metrics_for(s)])
    for s in (Scope.GPU, Scope.IB_PORT, Scope.INTERFACE, Scope.PEER, Scope.HOST)
)


def narrow_gauges(values: np.ndarray, wide: np.ndarray) -> np.ndarray:
    """Round the gauge columns (last axis) through float32, in place; counters keep float64."""
    values[..., ~wide] = values[..., ~wide].astype(np.float32)
    return values


_NVLINK_KINDS = ("crc_flit", "crc_data", "replay", "recovery")

# How long the collector reports a GPU that fell off the bus before the node is drained.
_LOST_REPORTED_S = 600.0
_KEPT_WHEN_LOST = np.array(
    [
        m.name.startswith("xid_")
        or m.name
        in (
            "nvml_call_seconds",
            "nvml_slowest_call_seconds",
            "nvml_failed_calls",
            "nvml_timed_out_calls",
            "nvml_unsupported_fields",
            "gpu_lost",
        )
        for m in metrics_for(Scope.GPU)
    ]
)

# Healthy-noise knobs.
_NVML_CALL_S = 0.0022  # NVML time per GPU per scrape on a healthy node
_GPU_ROW_MISSING = 5e-4  # a lost scrape of one GPU
_NODE_ROW_MISSING = 2e-4  # a lost scrape of the whole node
_IB_PORT_BYTES_S = 12e9


class _Key(enum.IntEnum):
    NOISE = 1
    SBE = 2
    REMAP = 3
    MISSING = 6
    NETWORK = 7
    XID = 8


@dataclass
class NodeState:
    """Counter values at the end of the previous chunk, per GPU (G,) or per port (P,)."""

    gpu: dict[str, np.ndarray]
    xid_last: np.ndarray
    ib: dict[str, np.ndarray]
    iface: dict[str, np.ndarray]
    peers_probes: np.ndarray
    host: dict[str, np.ndarray]
    # The thermal stages' rise at the end of the chunk (sim/thermal.py): die over cold plate, cold
    # plate over inlet, per GPU; they carry the GPU's heat into the next chunk.
    die_rise: np.ndarray
    sink_rise: np.ndarray
    chunks_done: int = 0

    @staticmethod
    def initial(config: FleetConfig, traits: NodeTraits) -> NodeState:
        """A node's counters at the twin's start: zero, but for some energy and ECC history."""
        r = rng(config.seed, Stream.TRAITS, traits.index, 1)
        g = config.gpus_per_node
        gpu = {m.name: np.zeros(g) for m in metrics_for(Scope.GPU) if m.kind is Kind.COUNTER}
        gpu["total_energy"] = r.uniform(1e9, 5e9, g)  # the driver has been up a while
        gpu["ecc_sbe_aggregate"] = np.floor(r.exponential(1.5, g))  # some history from earlier life
        for kind in _NVLINK_KINDS:
            gpu[f"nvlink_{kind}_errors_worst_link"] = np.zeros(g)
            gpu[f"_nvlink_{kind}_others"] = np.zeros(g)
        return NodeState(
            gpu=gpu,
            xid_last=np.zeros(g),
            ib={m.name: np.zeros(config.ib_ports) for m in IB_METRICS if m.kind is Kind.COUNTER},
            iface={m.name: np.zeros(1) for m in IF_METRICS},
            peers_probes=np.zeros(config.peers),
            host={m.name: np.zeros(1) for m in HOST_METRICS},
            # At work when the clock starts (the fleet is busy then): near its load's steady state.
            die_rise=0.4 * traits.generation.thermal_c_per_w * 0.8 * traits.generation.tdp_w * np.ones(g),
            sink_rise=0.6 * traits.generation.thermal_c_per_w * 0.8 * traits.generation.tdp_w * np.ones(g),
        )


@dataclass
class NodeChunk:
    """One node's generated rows for one chunk of steps, ready for the writer."""

    node: int
    first_step: int
    times_s: np.ndarray  # (T,) seconds since the start
    gpu_values: np.ndarray  # (T, G, metrics) float64 (gauges rounded to float32), catalogue order
    gpu_present: np.ndarray  # (T, G) bool: a row exists (not dark, not a lost scrape)
    replacements: np.ndarray  # (T, G) int: how many times each slot's GPU was swapped so far
    ib_values: np.ndarray  # (T, P, metrics), like gpu_values
    iface_values: np.ndarray  # (T, 1, metrics)
    peer_values: np.ndarray  # (T, Q, metrics)
    host_values: np.ndarray  # (T, metrics)
    node_present: np.ndarray  # (T,) bool
    gpu_lost: np.ndarray  # (T, G) bool: the row reports a GPU that fell off the bus
    gpu_summary: np.ndarray  # (T, G, 1 + len(SUMMARY_COLUMNS)): scrapes, then each step's summary


class _Streams:
    """A chunk's random streams. A signal whose rate depends on the schedule (a Poisson count) gets
    a stream of its own, so injecting a failure mid-chunk cannot shift any other signal's draws,
    and draws always have the full chunk's shape, so a shorter last chunk is a prefix of a longer."""

    def __init__(self, seed: int, node: int, chunk: int) -> None:
        self.seed, self.node, self.chunk = seed, node, chunk

    def __call__(self, key: int | str) -> np.random.Generator:
        if isinstance(key, str):
            key = 100_000 + zlib.crc32(key.encode())
        return rng(self.seed, Stream.CHUNK, self.node, self.chunk, key)


def _first_steps(t: np.ndarray, interval: float, moments: list[float]) -> np.ndarray:
    """Mask of the first step at or after each moment that falls within this chunk's reach."""
    mask = np.zeros(t.shape, dtype=bool)
    for moment in moments:
        if t[0] - interval < moment <= t[-1]:
            mask[int(np.searchsorted(t, moment))] = True
    return mask


def _cumulate(start: np.ndarray, inc: np.ndarray, reset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counter values from increments; at a reset the counter restarts from zero (then adds that step)."""
    steps = inc.shape[0]
    prefix = np.concatenate([np.zeros((1, *inc.shape[1:])), np.cumsum(inc, axis=0)])
    if not reset.any():
        values = start + prefix[1:]
        return values, values[-1].copy()
    idx = np.where(reset, np.arange(steps).reshape((-1,) + (1,) * (inc.ndim - 1)), -1)
    last = np.maximum.accumulate(idx, axis=0)
    since = prefix[1:] - np.take_along_axis(prefix, np.maximum(last, 0), axis=0)
    values = np.where(last < 0, start + prefix[1:], since)
    return values, values[-1].copy()


def _poisson(r: np.random.Generator, rate_per_min: np.ndarray, dt_min: float) -> np.ndarray:
    counts: np.ndarray = r.poisson(np.maximum(rate_per_min, 0.0) * dt_min)
    return counts.astype(np.float64)


_PHASES = ((25 * 60, (60, 180), 0.45), (4 * 3600, (300, 720), 0.65), (90 * 60, (120, 300), 0.06))


def _phases(config: FleetConfig, node: int, chunk: int, t: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """Utilization target per step, shared by the pod's nodes: training with dips, evals and stalls."""
    pod = node // config.nodes_per_job_pod
    cadence_s = config.cadence_s

    def draw(r: np.random.Generator, shape: tuple[int, ...], extend: int = 0) -> np.ndarray:
        target = np.full((shape[0] + extend,), 0.97)
        # (mean period, duration range in seconds, utilization during the phase)
        for period, (lo, hi), level in _PHASES:
            steps = (max(1, round(lo / cadence_s)), max(1, round(hi / cadence_s)))
            on = episodes(r, shape, cadence_s / period, steps, extend)
            target = np.where(on, np.minimum(target, level), target)
        return target

    target = spilled(lambda c: rng(config.seed, Stream.PHASES, pod, c), chunk, t.shape, draw)
    return np.where(busy, target, 0.0)


def _job_hash(start_s: float, salt: int) -> float:
    """A job's own uniform number in [0, 1) (from its start time), the same on every node of its pod."""
    return (((int(start_s * 1000) + salt * 7919) * 2654435761) % 1_000_003) / 1_000_003.0


def _job_kinds(
    config: FleetConfig, jobs: tuple[tuple[float, float], ...], t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: whether the running job is bursty (power swings idle<->full every few minutes: RL,
    inference, evaluation-heavy work) and how hard it pushes (above 1: it asks for more than the
    power limit and sits at the power cap)."""
    bursty, intensity = np.zeros(t.shape, dtype=bool), np.full(t.shape, 0.9)
    w = config.world
    for start, end in jobs:
        if end > t[0] and start <= t[-1]:
            running = (t >= start) & (t < end)
            bursty |= running & (_job_hash(start, 1) < w.bursty_job_share)
            heavy = _job_hash(start, 2) < w.heavy_job_share
            level = 1.05 + 0.2 * _job_hash(start, 3) if heavy else 0.7 + 0.25 * _job_hash(start, 3)
            intensity = np.where(running, level, intensity)
    return bursty, intensity


def _bursts(config: FleetConfig, pod: int, chunk: int, n: int) -> np.ndarray:
    """A bursty job's utilization per step: levels held for about three minutes, shared by the pod."""
    r = rng(config.seed, Stream.PHASES, pod, chunk, 7)
    hold = max(1.0, 180.0 / config.cadence_s)
    segment = np.cumsum(r.random(n) < 1.0 / hold) % n
    levels: np.ndarray = np.array([0.08, 0.35, 0.7, 0.97])[r.integers(0, 4, n)][segment]
    return levels


def _job_memory_fraction(jobs: tuple[tuple[float, float], ...], t: np.ndarray) -> np.ndarray:
    """Framebuffer use per step: each job has its own footprint (a hash of its start time)."""
    frac = np.zeros(t.shape)
    for start, end in jobs:
        if end > t[0] and start <= t[-1]:
            footprint = 0.70 + 0.22 * ((int(start * 1000) * 2654435761) % 1000) / 1000.0
            frac = np.where((t >= start) & (t < end), footprint, frac)
    return frac


def generate_chunk(
    config: FleetConfig, traits: NodeTraits, schedule: NodeSchedule, state: NodeState, chunk: int
) -> NodeChunk:
    """The chunk's telemetry; advances `state` to its end. Chunks must be generated in order."""
    if chunk != state.chunks_done:
        raise ValueError(
            f"node {traits.index}: chunk {chunk} asked for, but the state is at chunk {state.chunks_done}"
        )
    first = chunk * config.chunk_steps
    rows = min(config.chunk_steps, config.steps - first)
    if rows <= 0:
        raise ValueError(f"chunk {chunk} is past the horizon ({config.steps} steps)")
    # Always a whole chunk, cut to the horizon at the end: a short last chunk is then exactly the
    # start of the same chunk in a longer run (the live source's).
    t = (first + np.arange(config.chunk_steps)) * config.cadence_s
    rs = _Streams(config.seed, traits.index, chunk)
    # The steps below share one generator, `noise`: they draw from it in this order, always.
    noise = rs(_Key.NOISE)
    out = _outages(config, schedule, t)
    load = _workload(config, traits, schedule, chunk, t, noise)
    fx = Effects(t, config.gpus_per_node, config.ib_ports)
    for failure in (*schedule.failures, *schedule.aborted):
        if failure.lead_s > 0 and failure.precursor_start_s <= t[-1] and failure.fail_s > t[0]:
            # Keyed by the failure itself: adding another failure cannot change this one's draws.
            kind = "aborted" if failure.aborted else "event"
            key = f"{kind}:{failure.gpu}:{round(failure.fail_s * 1000)}"
            apply_precursor(fx, failure, rs(key), config.cadence_s)
    app_xids = np.zeros(out.lost.shape, dtype=np.int64)
    if config.confounders:
        app_xids = apply_lookalikes(
            fx, config, traits, lambda c: _Streams(config.seed, traits.index, c), chunk, load.busy
        )
    heat = _thermals(config, traits, state, load, fx, noise)
    remaps = _remaps(rs, fx)  # one draw: the remap counter and Xid 63 show the same remaps
    v = _counters(config, traits, state, out, fx, rs, heat.power, remaps)
    v["xid_last"] = _xids(state, out, fx, rs, app_xids, v, remaps)
    v |= _gauges(traits, schedule, t, load, heat, fx, noise)
    gpu_values = _gpu_values(v, out.lost)
    ib_values, iface_values, peer_values, host_values = _network(
        config, traits, state, fx, rs, load.busy, out.node_return, out.node_dark
    )
    node_present, gpu_present = _rows_present(config, rs, fx, out)
    _freeze(fx.frozen, gpu_values, ib_values, iface_values, peer_values, host_values)
    last = {name: gpu_values[:, :, GPU_INDEX[name]] for name in SUMMARISED}  # as scraped, frozen or not
    summary = summarise(traits, config.cadence_s, load.swing, load.busy, last, heat.temp, fx, rs("substep"))
    state.chunks_done += 1
    cut = slice(0, rows)
    return NodeChunk(
        traits.index,
        first,
        t[cut],
        gpu_values[cut],
        gpu_present[cut],
        out.replacements[cut],
        ib_values[cut],
        iface_values[cut],
        peer_values[cut],
        host_values[cut],
        node_present[cut],
        out.lost[cut],
        summary[cut],
    )


@dataclass(frozen=True)
class _Outages:
    """When the node and its GPUs are dark, come back, are swapped or are lost, over a chunk (T, G)."""

    node_dark: np.ndarray  # (T,)
    node_return: np.ndarray  # (T,) the first step back
    gpu_dark: np.ndarray
    swapped: np.ndarray  # the first step of a replacement GPU
    replacements: np.ndarray  # how many times each slot's GPU was swapped so far
    lost: np.ndarray  # the collector reports the GPU lost (Xid 79, until the node is drained)
    lost_at: np.ndarray  # the Xid the collector sees when the GPU goes
    volatile_reset: np.ndarray  # a driver reload or a GPU back: volatile counters restart
    reboot: np.ndarray  # the collector restarts with the node or the GPU


def _outages(config: FleetConfig, schedule: NodeSchedule, t: np.ndarray) -> _Outages:
    n, g, cadence_s = len(t), config.gpus_per_node, config.cadence_s
    node_fail = schedule.node_failures()
    node_dark = in_windows(t, [(f.fail_s, f.return_s) for f in node_fail])
    node_return = _first_steps(t, cadence_s, [f.return_s for f in node_fail])
    reload = _first_steps(t, cadence_s, list(schedule.reloads_s)) | node_return
    gpu_dark = np.repeat(node_dark[:, None], g, axis=1)
    gpu_return = np.zeros((n, g), dtype=bool)
    swapped = np.zeros((n, g), dtype=bool)
    replacements = np.zeros((n, g), dtype=np.int64)
    # A GPU that falls off the bus (Xid 79) is reported lost by the collector until the node is
    # drained; other failures (a DBE, Xid 74, a firmware fault) take the GPU out of service at once.
    lost = np.zeros((n, g), dtype=bool)
    lost_at = np.zeros((n, g), dtype=np.int64)
    for gpu in range(g):
        own = schedule.gpu_failures(gpu)
        gpu_dark[:, gpu] |= in_windows(t, [(f.fail_s, f.return_s) for f in own])
        for f in own:
            if f.xid == 79:
                lost[:, gpu] |= in_windows(t, [(f.fail_s, min(f.fail_s + _LOST_REPORTED_S, f.return_s))])
                lost_at[:, gpu] += _first_steps(t, cadence_s, [f.fail_s]) * f.xid
        gpu_return[:, gpu] = _first_steps(t, cadence_s, [f.return_s for f in own])
        swapped[:, gpu] = _first_steps(t, cadence_s, [f.return_s for f in own if f.spec.replaced])
        for f in own:
            if f.spec.replaced:
                replacements[:, gpu] += t >= f.return_s
    return _Outages(
        node_dark=node_dark,
        node_return=node_return,
        gpu_dark=gpu_dark,
        swapped=swapped,
        replacements=replacements,
        lost=lost,
        lost_at=lost_at,
        volatile_reset=reload[:, None] | gpu_return,
        reboot=node_return[:, None] | gpu_return,
    )


@dataclass(frozen=True)
class _Workload:
    """The jobs' load on a healthy node, before failures and throttling (T, G)."""

    busy: np.ndarray  # (T,)
    util: np.ndarray  # percent
    power: np.ndarray  # W asked for, before jitter (may exceed the limit: the cap then holds it)
    power_jitter: np.ndarray  # W
    swing: np.ndarray  # (T,) the job's half power swing within a step, a share of the limit (sim/substep.py)


def _workload(
    config: FleetConfig,
    traits: NodeTraits,
    schedule: NodeSchedule,
    chunk: int,
    t: np.ndarray,
    noise: np.random.Generator,
) -> _Workload:
    n, g, gen = len(t), config.gpus_per_node, traits.generation
    busy = in_windows(t, schedule.jobs)
    target = _phases(config, traits.index, chunk, t, busy)
    bursty, intensity = _job_kinds(config, schedule.jobs, t)
    if bursty.any():
        swings = _bursts(config, traits.index // config.nodes_per_job_pod, chunk, n)
        target = np.where(bursty & busy, np.minimum(target, swings), target)
    util = np.clip(target[:, None] * 100.0 + noise.normal(0.0, 2.0, (n, g)) * busy[:, None], 0.0, 100.0)
    power = gen.idle_w + (gen.tdp_w - gen.idle_w) * intensity[:, None] * util / 100.0 + traits.power_offset_w
    power_jitter = noise.normal(0.0, 0.012 * gen.tdp_w, (n, g))
    # Within a step: every job its own swing (a hash of its start, so the pod shares it), bursty ones more.
    swing = config.world.step_power_swing * np.where(bursty, 2.5, _job_swing(schedule.jobs, t))
    return _Workload(busy, util, power, power_jitter, swing)


def _job_swing(jobs: tuple[tuple[float, float], ...], t: np.ndarray) -> np.ndarray:
    """Each job's half power swing within a step relative to the world's: 0.5 to 1.5, by job."""
    out = np.ones(t.shape)
    for start, end in jobs:
        if end > t[0] and start <= t[-1]:
            out = np.where((t >= start) & (t < end), 0.5 + _job_hash(start, 4), out)
    return out


@dataclass(frozen=True)
class _Heat:
    """Temperatures and what they, power caps and brakes do to power and clocks (T, G)."""

    temp: np.ndarray
    memory_temp: np.ndarray
    power: np.ndarray
    sm_clock: np.ndarray
    cap: np.ndarray
    sw_thermal: np.ndarray
    hw_thermal: np.ndarray
    hw_slowdown: np.ndarray
    reasons: np.ndarray  # NVML's clock-event reason bits


def _inlet(config: FleetConfig, traits: NodeTraits, t: np.ndarray, fx: Effects) -> np.ndarray:
    """The node's inlet air per step: the rack's mean, the day, the weather, cooling trouble."""
    w = config.world
    unix = config.start_unix_s + t
    first_day = int(unix[0] // 86_400) - 1
    days = range(first_day, int(unix[-1] // 86_400) + 2)
    # Keyed by the day (shifted: days before 1970 exist in tests), so every node sees the same weather.
    offsets = np.array([rng(config.seed, Stream.WEATHER, d + 10**6).normal(0.0, w.weather_c) for d in days])
    inlet: np.ndarray = (
        traits.rack_inlet_c
        + daily_cycle_c(unix, w.inlet_daily_c)
        + weather_c(unix, offsets, first_day)
        + fx.inlet_add
    )
    return inlet


def _thermals(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    load: _Workload,
    fx: Effects,
    noise: np.random.Generator,
) -> _Heat:
    gen, busy, w = traits.generation, load.busy, config.world
    asked = load.power + load.power_jitter * (1.0 + fx.power_noise)
    # The power limit holds a job that asks for more (SW power cap, clocks trimmed to fit).
    cap = asked > gen.tdp_w
    power = np.minimum(asked, np.where(cap, np.minimum(gen.tdp_w, 0.97 * asked + 0.03 * gen.tdp_w), asked))
    power = np.where(fx.brake, power * 0.6, power)
    c_per_w = gen.thermal_c_per_w * w.thermal_resistance_scale * np.ones(power.shape[1])
    spread = 1.0 + 0.15 * np.tanh((traits.temp_offset_c - 4.0) / 3.0)  # the hot slots are slow to cool
    die, sink = stage_rises(
        np.clip(power, 0.0, None), c_per_w, w.tau_die_s * spread, w.tau_sink_s * spread,
        (state.die_rise, state.sink_rise), config.cadence_s,
    )  # fmt: skip
    state.die_rise, state.sink_rise = die[-1].copy(), sink[-1].copy()
    inlet = _inlet(config, traits, fx.t, fx)[:, None]
    temp = inlet + traits.temp_offset_c + sink + die + fx.temp_add + noise.normal(0.0, 0.4, power.shape)
    memory_temp = inlet + traits.temp_offset_c + 1.1 * sink + 5.5 + 0.15 * fx.temp_add
    sw_thermal = temp > gen.slowdown_temp_c
    hw_thermal = temp > gen.shutdown_temp_c
    over = np.clip(temp - gen.slowdown_temp_c, 0.0, 20.0)
    clock = fx.clock * np.clip(1.0 - 0.03 * over, 0.3, 1.0)
    clock = np.where(cap, clock * np.clip(gen.tdp_w / np.maximum(asked, 1.0), 0.85, 1.0) ** 0.5, clock)
    clock = np.where(fx.brake, clock * 0.5, clock)
    power = np.where(sw_thermal, power * (1.0 - 0.02 * over), power)
    power = np.clip(power, 0.8 * gen.idle_w, 1.02 * gen.tdp_w)
    idle_clock = round(gen.sm_boost_mhz * 0.17 / 15.0) * 15.0
    sm_clock = np.where(busy[:, None], np.round(gen.sm_boost_mhz * clock / 15.0) * 15.0, idle_clock)
    hw_slowdown = hw_thermal | fx.brake
    reasons = (
        (~busy)[:, None] * 0x1
        + cap * 0x4
        + hw_slowdown * 0x8
        + sw_thermal * 0x20
        + hw_thermal * 0x40
        + fx.brake * 0x80
    )
    return _Heat(temp, memory_temp, power, sm_clock, cap, sw_thermal, hw_thermal, hw_slowdown, reasons)


def _counters(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    out: _Outages,
    fx: Effects,
    rs: _Streams,
    power: np.ndarray,
    remaps: np.ndarray,
) -> dict[str, np.ndarray]:
    """The GPU counters but the Xid ones, carried on from `state` (which they advance), by name."""
    n, g = out.lost.shape
    cadence_s = config.cadence_s
    dt_min = cadence_s / 60.0
    alive = ~out.gpu_dark
    reporting = alive | out.lost  # the collector still counts failed calls for a lost GPU
    volatile_reset, aggregate_reset = out.volatile_reset, out.swapped
    v: dict[str, np.ndarray] = {}

    def counter(name: str, inc: np.ndarray, reset: np.ndarray, mask: np.ndarray = alive) -> np.ndarray:
        values, state.gpu[name] = _cumulate(state.gpu[name], inc * mask, reset)
        v[name] = values
        return values

    counter("total_energy", power * cadence_s * 1000.0, volatile_reset)
    sbe = _poisson(rs(_Key.SBE), fx.sbe_per_min, dt_min)
    counter("ecc_sbe_volatile", sbe, volatile_reset)
    counter("ecc_sbe_aggregate", sbe, aggregate_reset)
    counter("ecc_dbe_volatile", np.zeros((n, g)), volatile_reset)
    counter("ecc_dbe_aggregate", np.zeros((n, g)), aggregate_reset)
    counter("remapped_rows_correctable", remaps, aggregate_reset)
    counter("remapped_rows_uncorrectable", np.zeros((n, g)), aggregate_reset)
    counter(
        "pcie_replay", _poisson(rs("pcie_replay"), fx.pcie_per_min, dt_min) + fx.pcie_burst, volatile_reset
    )
    links = traits.generation.nvlinks
    for k, kind in enumerate(_NVLINK_KINDS):
        worst_inc = _poisson(rs(f"nvlink_{kind}"), fx.nvlink_per_min[k], dt_min) + (
            fx.nvlink_burst if k == 0 else 0.0
        )
        others_inc = _poisson(rs(f"nvlink_{kind}_others"), np.full((n, g), 2e-4 * (links - 1)), dt_min)
        worst = counter(f"nvlink_{kind}_errors_worst_link", worst_inc, volatile_reset)
        others = counter(f"_nvlink_{kind}_others", others_inc, volatile_reset)
        v[f"nvlink_{kind}_errors"] = worst + others
        v[f"nvlink_{kind}_errors_worst_link"] = np.maximum(worst, np.ceil(others / max(links - 1, 1)))
    # A lost GPU fails its first call.
    failed = _poisson(rs("nvml_failed"), fx.nvml_fail_per_min, dt_min) + out.lost
    counter("nvml_failed_calls", failed, out.reboot, reporting)
    counter(
        "nvml_timed_out_calls", np.zeros_like(failed), out.reboot, reporting
    )  # the twin's NVML never hangs
    return v


def _remaps(rs: _Streams, fx: Effects) -> np.ndarray:
    """Correctable row remaps per step (0 or 1): its own stream, read by the counters and the Xids."""
    return (rs(_Key.REMAP).random(fx.remap_p.shape) < fx.remap_p).astype(np.float64)


def _xids(
    state: NodeState,
    out: _Outages,
    fx: Effects,
    rs: _Streams,
    app_xids: np.ndarray,
    v: dict[str, np.ndarray],
    remaps: np.ndarray,
) -> np.ndarray:
    """Adds the Xid event counters to `v` and returns the last Xid each step shows (T, G)."""
    n, g = out.lost.shape
    alive = ~out.gpu_dark
    reporting = alive | out.lost  # the collector still counts Xids for a lost GPU
    reboot = out.reboot

    def counter(name: str, inc: np.ndarray) -> None:
        v[name], state.gpu[name] = _cumulate(state.gpu[name], inc * reporting, reboot)

    # At most one per GPU per step; the hardware's own win over application codes.
    xr = rs(_Key.XID)
    xid = app_xids.copy()
    xid = np.where(xr.random((n, g)) < fx.xid92_p, 92, xid)
    xid = np.where(remaps > 0, 63, xid)
    xid = np.where(alive, xid, 0)
    xid = np.where(out.lost_at > 0, out.lost_at, xid)
    for code in TRACKED_XIDS:
        counter(f"xid_{code}_events", (xid == code).astype(np.float64))
    counter("xid_other_events", np.zeros((n, g)))
    has = xid > 0
    last_idx = np.maximum.accumulate(np.where(has, np.arange(n)[:, None], -1), axis=0)
    xid_last = np.where(
        last_idx >= 0, np.take_along_axis(xid, np.maximum(last_idx, 0), axis=0), state.xid_last
    )
    xid_last = np.where(reboot & ~has, 0.0, xid_last)  # a restarted collector has seen no Xid yet
    reboot_idx = np.maximum.accumulate(np.where(reboot, np.arange(n)[:, None], -1), axis=0)
    xid_last = np.where((reboot_idx > last_idx) & (reboot_idx >= 0), 0.0, xid_last)
    state.xid_last = xid_last[-1].copy()
    return np.asarray(xid_last, dtype=np.float64)


def _gauges(
    traits: NodeTraits,
    schedule: NodeSchedule,
    t: np.ndarray,
    load: _Workload,
    heat: _Heat,
    fx: Effects,
    noise: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The GPU gauges, by name (draws from `noise` in a fixed order: the dict's)."""
    gen, busy, util, temp = traits.generation, load.busy, load.util, heat.temp
    n, g = util.shape
    links = gen.nvlinks
    fb_frac = _job_memory_fraction(schedule.jobs, t)[:, None] * np.ones((1, g))
    fb_used = np.round(
        np.maximum(fb_frac * gen.fb_total_mib, 520.0) + noise.normal(0.0, 40.0, (n, g)) * busy[:, None]
    )
    nvml_s = _NVML_CALL_S * np.exp(noise.normal(0.0, 0.12, (n, g))) * fx.nvml_slow
    return {
        "gpu_temp": np.round(temp),
        "memory_temp": np.round(heat.memory_temp + noise.normal(0.0, 0.4, (n, g))),
        "power_usage": np.round(heat.power, 3),
        "power_limit": np.full((n, g), gen.tdp_w),
        "sm_clock": heat.sm_clock,
        "mem_clock": np.full((n, g), gen.mem_clock_mhz),
        "gpu_util": np.round(util),
        "mem_copy_util": np.round(util * 0.42),
        "fb_used": fb_used,
        "fb_free": gen.fb_total_mib - fb_used,
        "pstate": np.zeros((n, g)),
        "clock_event_reasons": heat.reasons.astype(np.float64),
        "throttle_sw_power_cap": heat.cap.astype(np.float64),
        "throttle_hw_slowdown": heat.hw_slowdown.astype(np.float64),
        "throttle_sw_thermal": heat.sw_thermal.astype(np.float64),
        "throttle_hw_thermal": heat.hw_thermal.astype(np.float64),
        "throttle_hw_power_brake": fx.brake.astype(np.float64),
        "row_remap_pending": fx.pending.astype(np.float64),
        "row_remap_failure": np.zeros((n, g)),
        "pcie_link_gen": np.full((n, g), float(gen.pcie_gen)) - fx.gen_down,
        "pcie_link_width": np.where(fx.width_down, 8.0, 16.0),
        "pcie_link_gen_max": np.full((n, g), float(gen.pcie_gen)),
        "pcie_link_width_max": np.full((n, g), 16.0),
        "pcie_tx_bytes_per_second": np.round(util * 2.1e8 * np.exp(noise.normal(0.0, 0.05, (n, g))), -3),
        "pcie_rx_bytes_per_second": np.round(util * 2.4e8 * np.exp(noise.normal(0.0, 0.05, (n, g))), -3),
        "nvlink_links_active": np.full((n, g), float(links)),
        "nvml_call_seconds": nvml_s,
        "nvml_slowest_call_seconds": nvml_s * noise.uniform(0.1, 0.25, (n, g)),
        # Fan speed (liquid-cooled SXM parts) and page retirement (replaced by row remapping since
        # Ampere) are NOT_SUPPORTED on both generations: four unsupported calls, values missing.
        "nvml_unsupported_fields": np.full((n, g), 4.0),
        "gpu_lost": np.zeros((n, g)),
    }


def _gpu_values(v: dict[str, np.ndarray], lost: np.ndarray) -> np.ndarray:
    """(T, G, metrics) in catalogue order, gauges narrowed; a lost GPU keeps only the collector's own
    bookkeeping about it."""
    n, g = lost.shape
    gpu_values = np.full((n, g, N_GPU_METRICS), np.nan)
    for name, values in v.items():
        column = GPU_INDEX.get(name)
        if column is not None:
            gpu_values[:, :, column] = values
    narrow_gauges(gpu_values, GPU_WIDE)
    gpu_values[lost[:, :, None] & ~_KEPT_WHEN_LOST[None, None, :]] = np.nan
    gpu_values[:, :, GPU_INDEX["gpu_lost"]] = lost
    return gpu_values


def _rows_present(
    config: FleetConfig, rs: _Streams, fx: Effects, out: _Outages
) -> tuple[np.ndarray, np.ndarray]:
    """Which rows exist: (node (T,), GPU (T, G)); lost scrapes are confounders' noise."""
    n, g = out.lost.shape
    mr = rs(_Key.MISSING)
    lost_scrape = mr.random(n) < (_NODE_ROW_MISSING if config.confounders else 0.0)
    lost_gpu = mr.random((n, g)) < (_GPU_ROW_MISSING if config.confounders else 0.0) + fx.missing
    node_present = ~out.node_dark & ~lost_scrape & ~fx.gap
    gpu_present = (~out.gpu_dark & ~lost_gpu | out.lost) & node_present[:, None]
    return node_present, gpu_present


def _freeze(frozen: np.ndarray, *arrays: np.ndarray) -> None:
    """A frozen exporter repeats the values of the step before the freeze (in place, time axis 0);
    a freeze from the chunk's first step repeats that step."""
    if not frozen.any():
        return
    steps = np.arange(len(frozen))
    last = np.maximum.accumulate(np.where(frozen, -1, steps))
    source = np.where(last < 0, steps, last)
    for values in arrays:
        values[:] = values[source]


def _network(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    fx: Effects,
    rs: _Streams,
    busy: np.ndarray,
    reboot: np.ndarray,
    dark: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The node's network counters and gauges over the chunk: IB ports (T, P, metrics), the
    Ethernet interface (T, 1, metrics), peers (T, Q, metrics), the host's TCP (T, metrics).
    Advances `state`'s network counters."""
    r = rs(_Key.NETWORK)  # schedule-independent draws, in this order; every Poisson count has its own stream
    cum = _NetworkCounters(reboot, ~dark)
    return (
        _ib_ports(config, traits, state, fx, rs, r, cum, busy),
        _interface(config, state, rs, r, cum, busy),
        _peers(config, state, fx, r, busy, ~dark),
        _host(config, state, fx, rs, r, cum, busy),
    )


class _NetworkCounters:
    """Cumulates a network counter (T, ...) that restarts with the node and stands still while dark."""

    def __init__(self, reboot: np.ndarray, alive: np.ndarray) -> None:
        self.reboot, self.alive = reboot, alive

    def __call__(self, store: dict[str, np.ndarray], name: str, inc: np.ndarray) -> np.ndarray:
        shaped_reset = self.reboot.reshape((-1,) + (1,) * (inc.ndim - 1)) & np.ones(inc.shape, dtype=bool)
        alive_b = self.alive.reshape((-1,) + (1,) * (inc.ndim - 1))
        values, store[name] = _cumulate(store[name], inc * alive_b, shaped_reset)
        return values


def _ib_ports(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    fx: Effects,
    rs: _Streams,
    r: np.random.Generator,
    cum: _NetworkCounters,
    busy: np.ndarray,
) -> np.ndarray:
    n, ports, cadence_s = len(fx.t), config.ib_ports, config.cadence_s
    dt_min = cadence_s / 60.0
    h100 = traits.generation.tdp_w > 500
    load = np.where(busy, 1.0, 0.002)[:, None]
    data = load * _IB_PORT_BYTES_S * cadence_s * r.uniform(0.9, 1.1, (n, ports))
    ib = {
        "ib_symbol_error": cum(
            state.ib,
            "ib_symbol_error",
            _poisson(rs("ib_symbol_error"), fx.ib_symbol_per_min, dt_min) + fx.ib_burst,
        ),
        # A flap: the link goes down and retrains within the step (link_downed and a recovery).
        "ib_link_downed": cum(state.ib, "ib_link_downed", fx.ib_flap),
        "ib_link_error_recovery": cum(
            state.ib,
            "ib_link_error_recovery",
            _poisson(rs("ib_link_error_recovery"), fx.ib_recovery_per_min, dt_min)
            + (fx.ib_burst > 0)
            + fx.ib_flap,
        ),
        "ib_port_rcv_errors": cum(
            state.ib,
            "ib_port_rcv_errors",
            _poisson(rs("ib_port_rcv_errors"), fx.ib_rcv_per_min, dt_min) + fx.ib_flap * 20.0,
        ),
        "ib_port_xmit_discards": cum(
            state.ib,
            "ib_port_xmit_discards",
            _poisson(rs("ib_port_xmit_discards"), fx.ib_discard_per_min + 0.002, dt_min),
        ),
        "ib_local_link_integrity_errors": cum(
            state.ib, "ib_local_link_integrity_errors", np.zeros((n, ports))
        ),
        "ib_excessive_buffer_overrun_errors": cum(
            state.ib, "ib_excessive_buffer_overrun_errors", np.zeros((n, ports))
        ),
        "ib_port_rcv_data": cum(state.ib, "ib_port_rcv_data", np.round(data)),
        "ib_port_xmit_data": cum(
            state.ib, "ib_port_xmit_data", np.round(data * r.uniform(0.97, 1.03, (n, ports)))
        ),
        "ib_rnr_nak_retry_err": cum(state.ib, "ib_rnr_nak_retry_err", np.zeros((n, ports))),
        "ib_local_ack_timeout_err": cum(
            state.ib,
            "ib_local_ack_timeout_err",
            _poisson(rs("ib_local_ack_timeout_err"), fx.ib_ack_timeout_per_min, dt_min),
        ),
        "ib_out_of_sequence": cum(
            state.ib,
            "ib_out_of_sequence",
            _poisson(rs("ib_out_of_sequence"), 0.01 * load * np.ones((n, ports)), dt_min),
        ),
        "ib_packet_seq_err": cum(state.ib, "ib_packet_seq_err", np.zeros((n, ports))),
        "ib_port_state": np.full((n, ports), 4.0),
        "ib_port_phys_state": np.full((n, ports), 5.0),
        "ib_port_rate_gbps": np.full((n, ports), 400.0 if h100 else 200.0),
    }

    return narrow_gauges(np.stack([ib[m.name] for m in IB_METRICS], axis=-1), IB_WIDE)


def _interface(
    config: FleetConfig,
    state: NodeState,
    rs: _Streams,
    r: np.random.Generator,
    cum: _NetworkCounters,
    busy: np.ndarray,
) -> np.ndarray:
    n, cadence_s = len(busy), config.cadence_s
    dt_min = cadence_s / 60.0
    eth_bytes = (2e5 + 1e6 * busy) * cadence_s
    iface = {
        "net_rx_bytes": cum(
            state.iface, "net_rx_bytes", np.round(eth_bytes * r.uniform(0.8, 1.2, n))[:, None]
        ),
        "net_tx_bytes": cum(
            state.iface, "net_tx_bytes", np.round(eth_bytes * r.uniform(0.8, 1.2, n))[:, None]
        ),
        "net_rx_packets": cum(state.iface, "net_rx_packets", np.round(eth_bytes / 900.0)[:, None]),
        "net_tx_packets": cum(state.iface, "net_tx_packets", np.round(eth_bytes / 950.0)[:, None]),
        "net_rx_errors": cum(state.iface, "net_rx_errors", np.zeros((n, 1))),
        "net_tx_errors": cum(state.iface, "net_tx_errors", np.zeros((n, 1))),
        "net_rx_dropped": cum(
            state.iface, "net_rx_dropped", _poisson(rs("net_rx_dropped"), np.full((n, 1), 0.001), dt_min)
        ),
        "net_tx_dropped": cum(state.iface, "net_tx_dropped", np.zeros((n, 1))),
    }

    return narrow_gauges(np.stack([iface[m.name] for m in IF_METRICS], axis=-1), IF_WIDE)


def _peers(
    config: FleetConfig,
    state: NodeState,
    fx: Effects,
    r: np.random.Generator,
    busy: np.ndarray,
    alive: np.ndarray,
) -> np.ndarray:
    n, cadence_s = len(busy), config.cadence_s
    q = config.peers
    p50 = 25e-6 * (1.0 + 0.2 * busy)[:, None] * np.exp(r.normal(0.0, 0.05, (n, q))) * fx.rtt[:, None]
    p99 = p50 * 2.5 * np.exp(r.normal(0.0, 0.1, (n, q))) * fx.rtt_tail[:, None]
    probes, state.peers_probes = _cumulate(
        state.peers_probes, np.full((n, q), cadence_s) * alive[:, None], np.zeros((n, q), dtype=bool)
    )
    loss = np.broadcast_to(fx.loss[:, None], (n, q))
    peer = {
        "peer_rtt_p50_seconds": p50,
        "peer_rtt_p99_seconds": p99,
        "peer_loss_ratio": loss,
        "peer_probes": probes,
    }

    return narrow_gauges(np.stack([peer[m.name] for m in PEER_METRICS], axis=-1), PEER_WIDE)


def _host(
    config: FleetConfig,
    state: NodeState,
    fx: Effects,
    rs: _Streams,
    r: np.random.Generator,
    cum: _NetworkCounters,
    busy: np.ndarray,
) -> np.ndarray:
    n, cadence_s = len(busy), config.cadence_s
    dt_min = cadence_s / 60.0
    sent = (800.0 + 4000.0 * busy) * cadence_s
    host = {
        "tcp_retrans_segs": cum(
            state.host,
            "tcp_retrans_segs",
            _poisson(rs("tcp_retrans_segs"), (0.5 + fx.retrans_per_min)[:, None], dt_min),
        ),
        "tcp_out_segs": cum(state.host, "tcp_out_segs", np.round(sent * r.uniform(0.9, 1.1, n))[:, None]),
        "tcp_in_errs": cum(state.host, "tcp_in_errs", np.zeros((n, 1))),
    }
    return narrow_gauges(np.concatenate([host[m.name] for m in HOST_METRICS], axis=-1), HOST_WIDE)
