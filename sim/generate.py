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
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from faultcast.catalogue import TRACKED_XIDS, Kind, Scope, index_of, metrics_for
from faultcast.rollup import is_wide
from faultcast.sim.config import FleetConfig
from faultcast.sim.fleet import NodeTraits, ambient_c
from faultcast.sim.schedule import NodeSchedule, ScheduledFailure, in_windows
from faultcast.sim.streams import Stream, rng

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


_APP_XIDS = np.array([13, 31, 43])  # application errors: common, harmless to the hardware
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
    CONFOUNDERS = 5
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


def _per_step(rate_per_min: np.ndarray | float, dt_min: float) -> np.ndarray:
    """Probability that an event of this rate happens within one step."""
    return -np.expm1(-np.asarray(rate_per_min, dtype=np.float64) * dt_min)


def _episodes(
    r: np.random.Generator, shape: tuple[int, ...], p_start: float, steps: tuple[int, int], extend: int = 0
) -> np.ndarray:
    """Boolean episodes: start with probability p_start per step, last a uniform number of steps.
    With `extend`, the result is that many steps longer, to see episodes running past the end."""
    starts = r.random(shape) < p_start
    lengths = r.integers(steps[0], steps[1] + 1, shape)
    out = np.zeros((shape[0] + extend, *shape[1:]), dtype=bool)
    for index in zip(*np.nonzero(starts), strict=True):
        i = index[0]
        out[(slice(i, i + int(lengths[index])), *index[1:])] = True
    return out


def _spilled(
    stream: Callable[[int], np.random.Generator],
    chunk: int,
    shape: tuple[int, ...],
    draw: Callable[..., np.ndarray],
) -> np.ndarray:
    """`draw(generator, shape, extend)` for this chunk, combined with the previous chunk's episodes
    that run past its end: an episode that starts near a chunk's end goes on into the next."""
    current = draw(stream(chunk), shape, 0)
    if chunk == 0:
        return current
    tail = draw(stream(chunk - 1), shape, shape[0])[shape[0] :]
    combined: np.ndarray = current | tail if current.dtype == bool else np.minimum(current, tail)
    return combined


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
            on = _episodes(r, shape, cadence_s / period, steps, extend)
            target = np.where(on, np.minimum(target, level), target)
        return target

    target = _spilled(lambda c: rng(config.seed, Stream.PHASES, pod, c), chunk, t.shape, draw)
    return np.where(busy, target, 0.0)


def _job_memory_fraction(jobs: tuple[tuple[float, float], ...], t: np.ndarray) -> np.ndarray:
    """Framebuffer use per step: each job has its own footprint (a hash of its start time)."""
    frac = np.zeros(t.shape)
    for start, end in jobs:
        if end > t[0] and start <= t[-1]:
            footprint = 0.70 + 0.22 * ((int(start * 1000) * 2654435761) % 1000) / 1000.0
            frac = np.where((t >= start) & (t < end), footprint, frac)
    return frac


@dataclass
class _Effects:
    """What failure precursors and confounders do to a node, before the counters integrate it."""

    t: np.ndarray
    g: int
    p: int  # IB ports
    temp_add: np.ndarray = field(init=False)
    clock: np.ndarray = field(init=False)
    power: np.ndarray = field(init=False)
    power_noise: np.ndarray = field(init=False)
    sbe_per_min: np.ndarray = field(init=False)
    remap_p: np.ndarray = field(init=False)
    pending: np.ndarray = field(init=False)
    brake: np.ndarray = field(init=False)
    cap: np.ndarray = field(init=False)
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
    rtt: np.ndarray = field(init=False)  # (T,) multiplier of p50
    rtt_tail: np.ndarray = field(init=False)  # (T,) multiplier of p99
    loss: np.ndarray = field(init=False)
    retrans_per_min: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n, g, p = len(self.t), self.g, self.p
        zeros, ones = np.zeros((n, g)), np.ones((n, g))
        self.temp_add, self.clock, self.power, self.power_noise = (
            zeros.copy(),
            ones.copy(),
            ones.copy(),
            zeros.copy(),
        )
        self.sbe_per_min, self.remap_p, self.xid92_p = zeros.copy(), zeros.copy(), zeros.copy()
        self.pending, self.brake, self.cap = (np.zeros((n, g), dtype=bool) for _ in range(3))
        self.nvlink_per_min, self.nvlink_burst = np.zeros((4, n, g)), zeros.copy()
        self.pcie_per_min, self.pcie_burst = zeros.copy(), zeros.copy()
        self.width_down, self.gen_down = np.zeros((n, g), dtype=bool), np.zeros((n, g), dtype=bool)
        self.nvml_slow, self.nvml_fail_per_min, self.missing = ones.copy(), zeros.copy(), zeros.copy()
        self.ib_symbol_per_min, self.ib_recovery_per_min = np.zeros((n, p)), np.zeros((n, p))
        self.ib_burst, self.ib_ack_timeout_per_min = np.zeros((n, p)), np.zeros((n, p))
        self.rtt, self.rtt_tail, self.loss = np.ones(n), np.ones(n), np.zeros(n)
        self.retrans_per_min = np.zeros(n)


def _precursor(fx: _Effects, f: ScheduledFailure, r: np.random.Generator, dt_min: float) -> None:
    """Add one failure's precursor to the effects; p runs from 0 to 1 over the precursor window."""
    t = fx.t
    window = (t >= f.precursor_start_s) & (t < f.fail_s)
    if f.lead_s <= 0 or not window.any():
        return
    p = np.where(window, np.clip((t - f.precursor_start_s) / f.lead_s, 0.0, 1.0), 0.0)
    s = f.strength
    g = f.gpu
    if f.mode == "hbm_wear":
        assert g is not None
        fx.sbe_per_min[:, g] += window * (0.3 + s * 25.0 * np.expm1(4.0 * p) / math.expm1(4.0))
        fx.remap_p[:, g] += window * _per_step(s * (0.02 + 0.6 * p**2), dt_min)
        fx.pending[:, g] |= window & (p > 0.25 + 0.5 * f.draws[1])
        fx.xid92_p[:, g] += window * (fx.sbe_per_min[:, g] > 8.0) * _per_step(0.1, dt_min)
    elif f.mode == "cooling":
        assert g is not None
        fx.temp_add[:, g] += s * 26.0 * p**1.5
    elif f.mode == "power":
        assert g is not None
        fx.brake[:, g] |= window & (r.random(len(t)) < _per_step(s * (0.01 + 0.5 * p**2), dt_min))
        fx.power_noise[:, g] += 4.0 * s * p
    elif f.mode == "nvlink":
        assert g is not None
        flit = s * (0.3 * p + 40.0 * p**2)
        for k, scale in enumerate((1.0, 0.35, 0.6, 0.0)):
            fx.nvlink_per_min[k, :, g] += flit * scale
        fx.nvlink_per_min[3, :, g] += s * 0.4 * p**3
    elif f.mode == "pcie":
        assert g is not None
        fx.pcie_per_min[:, g] += s * (0.2 * p + 25.0 * p**2)
        if f.draws[2] < 0.7:
            fx.width_down[:, g] |= window & (p > 0.45 + 0.45 * f.draws[3])
        if f.draws[4] < 0.35:
            fx.gen_down[:, g] |= window & (p > 0.5 + 0.45 * f.draws[5])
    elif f.mode == "detachment":
        assert g is not None
        fx.nvml_slow[:, g] *= 1.0 + 40.0 * s * p**3
        fx.nvml_fail_per_min[:, g] += 3.0 * s * p**2
        fx.missing[:, g] += np.minimum(0.6, 0.5 * s * p**2)
    elif f.mode == "infiniband":
        port = min(int(f.draws[0] * fx.p), fx.p - 1)
        fx.ib_symbol_per_min[:, port] += s * (2.0 * p + 150.0 * p**2)
        fx.ib_recovery_per_min[:, port] += s * 0.4 * p**3
        fx.ib_ack_timeout_per_min[:, port] += s * 5.0 * p**2
        fx.rtt *= 1.0 + 3.0 * s * p**2
        fx.rtt_tail *= (1.0 + 15.0 * s * p**2) / (1.0 + 3.0 * s * p**2)  # p99 grows 16x in all, p50 4x
        fx.loss += np.minimum(0.5, 0.08 * s * p**3)
        fx.retrans_per_min += s * 50.0 * p**2


def _confounders(
    fx: _Effects, traits: NodeTraits, rs: _Streams, cadence_s: float, busy: np.ndarray
) -> np.ndarray:
    """Healthy events that look like trouble and are followed by nothing. Returns app-Xid codes (T, G)."""
    n, g = fx.clock.shape
    day = 86_400.0
    r = rs(_Key.CONFOUNDERS)
    fx.sbe_per_min += traits.steady_sbe_per_min
    # Transient power-cap throttling, 2-10 minutes, about once a day per GPU while busy.
    cap_steps = (max(1, round(120 / cadence_s)), max(1, round(600 / cadence_s)))

    def cap(gen: np.random.Generator, shape: tuple[int, ...], extend: int) -> np.ndarray:
        return _episodes(gen, shape, cadence_s / day, cap_steps, extend)

    streams = _Streams(rs.seed, rs.node, 0)
    fx.cap |= (
        _spilled(lambda c: _Streams(streams.seed, streams.node, c)("cap"), rs.chunk, (n, g), cap)
        & busy[:, None]
    )
    # Short NVLink and PCIe error bursts after which nothing happens.
    fx.nvlink_burst += (r.random((n, g)) < cadence_s / (3 * day)) * r.integers(5, 50, (n, g))
    fx.pcie_burst += (r.random((n, g)) < cadence_s / (10 * day)) * r.integers(1, 20, (n, g))
    # InfiniBand symbol-error bursts after a cable reseat, about every five days per node.
    fx.ib_burst += (r.random((n, fx.p)) < cadence_s / (5 * day * fx.p)) * r.integers(20, 500, (n, fx.p))
    # Application Xids (13, 31, 43) from buggy jobs, about weekly per GPU.
    app = (r.random((n, g)) < cadence_s / (7 * day)) & busy[:, None]
    return np.where(app, r.choice(_APP_XIDS, (n, g)), 0)


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
    fx = _Effects(t, config.gpus_per_node, config.ib_ports)
    for failure in schedule.failures:
        if failure.lead_s > 0 and failure.precursor_start_s <= t[-1] and failure.fail_s > t[0]:
            # Keyed by the failure itself: adding another failure cannot change this one's draws.
            key = f"event:{failure.gpu}:{round(failure.fail_s * 1000)}"
            _precursor(fx, failure, rs(key), config.cadence_s / 60.0)
    app_xids = np.zeros(out.lost.shape, dtype=np.int64)
    if config.confounders:
        app_xids = _confounders(fx, traits, rs, config.cadence_s, load.busy)
    heat = _thermals(traits, load, fx, noise)
    remaps = _remaps(rs, fx)  # one draw: the remap counter and Xid 63 show the same remaps
    v = _counters(config, traits, state, out, fx, rs, heat.power, remaps)
    v["xid_last"] = _xids(state, out, fx, rs, app_xids, v, remaps)
    v |= _gauges(traits, schedule, t, load, heat, fx, noise)
    gpu_values = _gpu_values(v, out.lost)
    ib_values, iface_values, peer_values, host_values = _network(
        config, traits, state, fx, rs, load.busy, out.node_return, out.node_dark
    )
    node_present, gpu_present = _rows_present(config, rs, fx, out)
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
    power: np.ndarray  # W, before jitter
    power_jitter: np.ndarray  # W
    inlet: np.ndarray  # (T,) degrees C


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
    util = np.clip(target[:, None] * 100.0 + noise.normal(0.0, 2.0, (n, g)) * busy[:, None], 0.0, 100.0)
    power = gen.idle_w + (gen.tdp_w - gen.idle_w) * 0.9 * util / 100.0 + traits.power_offset_w
    power_jitter = noise.normal(0.0, 0.012 * gen.tdp_w, (n, g))
    inlet = traits.rack_inlet_c + ambient_c(config.start_unix_s + t)
    return _Workload(busy, util, power, power_jitter, inlet)


@dataclass(frozen=True)
class _Heat:
    """Temperature and what it, power caps and brakes do to power and clocks (T, G)."""

    temp: np.ndarray
    power: np.ndarray
    sm_clock: np.ndarray
    sw_thermal: np.ndarray
    hw_thermal: np.ndarray
    hw_slowdown: np.ndarray
    reasons: np.ndarray  # NVML's clock-event reason bits


def _thermals(traits: NodeTraits, load: _Workload, fx: _Effects, noise: np.random.Generator) -> _Heat:
    gen, busy = traits.generation, load.busy
    power = load.power + load.power_jitter * (1.0 + fx.power_noise)
    temp = (
        load.inlet[:, None]
        + gen.thermal_c_per_w * power
        + traits.temp_offset_c
        + noise.normal(0.0, 0.4, power.shape)
    )
    temp += fx.temp_add
    sw_thermal = temp > gen.slowdown_temp_c
    hw_thermal = temp > gen.shutdown_temp_c
    clock = fx.clock * np.clip(1.0 - 0.03 * np.clip(temp - gen.slowdown_temp_c, 0.0, None), 0.3, 1.0)
    clock = np.where(fx.cap, clock * 0.93, clock)
    clock = np.where(fx.brake, clock * 0.55, clock)
    power = np.where(fx.cap, np.minimum(power, 0.92 * gen.tdp_w), power)
    power = np.where(fx.brake, power * 0.6, power)
    power = np.where(sw_thermal, power * (1.0 - 0.02 * np.clip(temp - gen.slowdown_temp_c, 0.0, 20.0)), power)
    power = np.clip(power, 0.8 * gen.idle_w, 1.05 * gen.tdp_w)
    idle_clock = round(gen.sm_boost_mhz * 0.17 / 15.0) * 15.0
    sm_clock = np.where(busy[:, None], np.round(gen.sm_boost_mhz * clock / 15.0) * 15.0, idle_clock)
    hw_slowdown = hw_thermal | fx.brake
    reasons = (
        (~busy)[:, None] * 0x1
        + fx.cap * 0x4
        + hw_slowdown * 0x8
        + sw_thermal * 0x20
        + hw_thermal * 0x40
        + fx.brake * 0x80
    )
    return _Heat(temp, power, sm_clock, sw_thermal, hw_thermal, hw_slowdown, reasons)


def _counters(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    out: _Outages,
    fx: _Effects,
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


def _remaps(rs: _Streams, fx: _Effects) -> np.ndarray:
    """Correctable row remaps per step (0 or 1): its own stream, read by the counters and the Xids."""
    return (rs(_Key.REMAP).random(fx.remap_p.shape) < fx.remap_p).astype(np.float64)


def _xids(
    state: NodeState,
    out: _Outages,
    fx: _Effects,
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
    fx: _Effects,
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
        "memory_temp": np.round(temp + 5.5 + 0.15 * fx.temp_add + noise.normal(0.0, 0.4, (n, g))),
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
        "throttle_sw_power_cap": fx.cap.astype(np.float64),
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
    config: FleetConfig, rs: _Streams, fx: _Effects, out: _Outages
) -> tuple[np.ndarray, np.ndarray]:
    """Which rows exist: (node (T,), GPU (T, G)); lost scrapes are confounders' noise."""
    n, g = out.lost.shape
    mr = rs(_Key.MISSING)
    lost_scrape = mr.random(n) < (_NODE_ROW_MISSING if config.confounders else 0.0)
    lost_gpu = mr.random((n, g)) < (_GPU_ROW_MISSING if config.confounders else 0.0) + fx.missing
    node_present = ~out.node_dark & ~lost_scrape
    gpu_present = (~out.gpu_dark & ~lost_gpu | out.lost) & node_present[:, None]
    return node_present, gpu_present


def _network(
    config: FleetConfig,
    traits: NodeTraits,
    state: NodeState,
    fx: _Effects,
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
    fx: _Effects,
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
        "ib_link_downed": cum(state.ib, "ib_link_downed", np.zeros((n, ports))),
        "ib_link_error_recovery": cum(
            state.ib,
            "ib_link_error_recovery",
            _poisson(rs("ib_link_error_recovery"), fx.ib_recovery_per_min, dt_min) + (fx.ib_burst > 0),
        ),
        "ib_port_rcv_errors": cum(
            state.ib,
            "ib_port_rcv_errors",
            _poisson(rs("ib_port_rcv_errors"), 0.4 * fx.ib_symbol_per_min, dt_min),
        ),
        "ib_port_xmit_discards": cum(
            state.ib,
            "ib_port_xmit_discards",
            _poisson(rs("ib_port_xmit_discards"), 0.2 * fx.ib_symbol_per_min + 0.002, dt_min),
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
    fx: _Effects,
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
    fx: _Effects,
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
