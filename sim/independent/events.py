"""The fleet's layout and its whole-run schedule, drawn once before any telemetry: cards, jobs,
failures with their precursors, degradations that never fail, outages, resets.

Times are seconds since the run's start. Everything is drawn from `numpy.random.default_rng([seed, ...])`
streams of its own, so a schedule depends on the seed and the configuration only.

How a failure unfolds (numbers in world.py): a cause is drawn from the Llama3 mix at the world's rate
(x acceleration); a GPU-level cause picks a GPU, hot racks weighted up (Titan); a node-level one a node.
Whether it has a precursor is drawn per failure (p_precursor of its cause, a minority overall); its length
is lognormal around the cause's median, its strength lognormal around 1, its on-fraction uniform in
[0.3, 1] (intermittent), and each of its channels is dropped with probability channel_drop_p (partial).
The failed GPU (or node) writes one last sample (the Xid), goes dark and comes back after a lognormal
repair (hours), with a new card (new UUID) with probability p_replace, and its volatile counters reset.
A failure that would strike hardware already down is dropped (it could not happen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from faultcast.sim.independent.world import (
    A100,
    CAUSES,
    H100,
    MODELS,
    Cause,
    IndependentConfig,
    World,
    cause_level,
    logged_mode,
)

DAY = 86_400.0

CHANNELS: dict[str, tuple[str, ...]] = {
    "hbm": ("sbe", "remap"),  # Xid 92 follows from the SBE rate itself
    "cooling": ("temp", "hbm_temp"),
    "power": ("brake", "excursion", "clock"),
    "nvlink": ("crc", "replay", "link_drop", "xid74"),
    "pcie": ("replay", "downtrain"),
    "structural": ("latency", "failed", "missing"),
    "ib": ("symbol", "ler", "rcv", "flap", "rtt", "ack"),
}
"""The precursor kinds and the signals each may show (a partial precursor shows only some)."""


@dataclass(frozen=True)
class Episode:
    """A degradation on one GPU (gpu >= 0), all GPUs of a node (gpu == -1, GPU kinds) or a node's
    network (kind "ib"); it ends in a failure at t1 or just stops (a near miss)."""

    kind: str
    node: int
    gpu: int
    t0: float
    t1: float
    strength: float
    shape: float  # intensity = strength * progress**shape (0: flat)
    on_fraction: float  # share of 10-minute blocks in which it shows
    channels: frozenset[str]
    fails: bool
    port: int = 0  # the bad InfiniBand port (kind "ib")


@dataclass(frozen=True)
class FailureEvent:
    time_s: float
    cause: Cause
    mode: str | None  # None: the interruption happened but no known mode names it (not logged)
    node: int
    gpu: int  # -1: node level
    xid: int  # 0: none
    precursor_s: float
    repair_until_s: float  # == time_s when nothing goes dark
    replace: bool
    card_before: int  # -1 for node level
    card_after: int


@dataclass
class Schedule:
    """The run's layout and events."""

    node_model: np.ndarray  # (N,) index into MODELS
    node_rack: np.ndarray  # (N,)
    node_pod: np.ndarray  # (N,)
    hot_rack: np.ndarray  # (racks,) bool
    power_limit: np.ndarray  # (N,) watts
    # cards: one row per physical GPU that ever sits in a slot
    card_unit: list[int] = field(default_factory=list)
    card_offset_c: list[float] = field(default_factory=list)
    card_efficiency: list[float] = field(default_factory=list)
    card_sbe_rate: list[float] = field(default_factory=list)  # per day
    card_nvlink_rate: list[float] = field(default_factory=list)  # CRC flit errors per day
    card_nvlink_dominant: list[float] = field(
        default_factory=list
    )  # share of background errors on the worst link
    card_pcie_rate: list[float] = field(default_factory=list)  # replays per day
    card_downtrained: list[bool] = field(default_factory=list)
    card_agg_sbe: list[float] = field(default_factory=list)  # lifetime counters at install
    card_agg_dbe: list[float] = field(default_factory=list)
    card_remapped: list[float] = field(default_factory=list)
    card_nvml_s: list[float] = field(default_factory=list)
    # unit -> [(from_s, card)] in time order
    slot_cards: list[list[tuple[float, int]]] = field(default_factory=list)
    failures: list[FailureEvent] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    gpu_dark: list[tuple[int, float, float]] = field(default_factory=list)  # (unit, from_s, until_s)
    node_dark: list[tuple[int, float, float]] = field(default_factory=list)  # (node, from_s, until_s)
    gpu_resets: list[tuple[int, float]] = field(default_factory=list)  # (unit, at_s): GPU reset/reload
    node_resets: list[tuple[int, float]] = field(default_factory=list)  # (node, at_s): reboot
    driver_reloads: list[tuple[int, float]] = field(default_factory=list)  # (node, at_s)
    exporter_outages: list[tuple[int, float, float]] = field(default_factory=list)
    frozen: list[tuple[int, float, float]] = field(default_factory=list)
    # pods: per pod arrays of jobs (start, end, type, intensity, phase offset)
    jobs: list[np.ndarray] = field(default_factory=list)
    pod_gaps: list[list[tuple[float, float]]] = field(default_factory=list)  # idle after interruptions
    app_crashes: list[tuple[int, float]] = field(default_factory=list)  # (pod, at_s) job end with Xid 13/43
    unlogged: dict[str, int] = field(default_factory=dict)
    near_misses: int = 0


def _card(s: Schedule, rng: np.random.Generator, w: World, unit: int, installed: bool) -> int:
    prone = rng.random() < w["sbe_prone_share"]
    s.card_unit.append(unit)
    s.card_offset_c.append(float(rng.normal(0.0, w["gpu_offset_sd_c"])))
    s.card_efficiency.append(float(rng.normal(1.0, 0.03)))  # prior: +-3% power spread at equal work
    rate = w["sbe_prone_rate_per_day"] * rng.lognormal(0.0, 1.0) if prone else w["sbe_background_per_gpu_day"]
    s.card_sbe_rate.append(float(rate))
    s.card_nvlink_rate.append(float(w["nvlink_crc_per_gpu_day"] * rng.lognormal(0.0, 1.5)))
    s.card_nvlink_dominant.append(float(rng.uniform(0.1, 0.9)))
    s.card_pcie_rate.append(float(w["pcie_replay_per_gpu_day"] * rng.lognormal(0.0, 1.5)))
    s.card_downtrained.append(bool(rng.random() < w["pcie_downtrained_share"]))
    # Lifetime counters of a card already in service (prior: months of history); a new card starts clean.
    age_days = rng.uniform(30, 700) if installed else 0.0
    s.card_agg_sbe.append(float(rng.poisson(rate * age_days * 0.5)))
    s.card_agg_dbe.append(float(rng.random() < 0.002 * age_days / 365))
    s.card_remapped.append(float(rng.poisson(w["benign_remap_per_gpu_day"] * age_days)))
    s.card_nvml_s.append(float(w["nvml_call_s"] * rng.lognormal(0.0, 0.3)))
    return len(s.card_unit) - 1


def _poisson_times(rng: np.random.Generator, rate_per_s: float, horizon: float) -> np.ndarray:
    n = int(rng.poisson(max(rate_per_s, 0.0) * horizon))
    return np.sort(rng.uniform(0.0, horizon, n))


def build(config: IndependentConfig, w: World) -> Schedule:
    """The whole run's schedule for `config` in world `w`."""
    n, g = config.nodes, config.gpus_per_node
    units = n * g
    horizon = config.steps * config.cadence_s
    last_sample = horizon - config.cadence_s
    rng = np.random.default_rng([config.seed, 0x5EED, 2])

    # Layout ---------------------------------------------------------------------------------------
    rack = np.arange(n) // w["nodes_per_rack"]
    racks = int(rack.max()) + 1
    if w["generation"] == "h100":
        rack_model = np.full(racks, MODELS.index(H100))
    elif w["generation"] == "a100":
        rack_model = np.full(racks, MODELS.index(A100))
    else:
        rack_model = rng.integers(0, 2, racks)
    hot = rng.random(racks) < w["hot_rack_share"]
    node_model = rack_model[rack]
    tdp = np.array([MODELS[m].tdp_w for m in node_model], dtype=np.float64)
    capped = rng.random(n) < w["power_capped_node_share"]
    limit = np.where(capped, np.round(tdp * rng.uniform(0.7, 0.9, n) / 10) * 10, tdp)
    pod = np.arange(n) // w["nodes_per_pod"]
    s = Schedule(node_model, rack, pod, hot, limit)
    s.slot_cards = [[(-math.inf, _card(s, rng, w, u, True))] for u in range(units)]

    # Jobs per pod (prior shapes, world parameters) ------------------------------------------------
    pods = int(pod.max()) + 1
    for _ in range(pods):
        rows = []
        t = -rng.uniform(0, w["job_median_h"] * 3600)
        while t < horizon:
            length = max(600.0, w["job_median_h"] * 3600 * rng.lognormal(0.0, 1.0))
            job_type = int(rng.choice(3, p=[1 - w["bursty_job_share"] - w["inference_job_share"],
                                    w["bursty_job_share"], w["inference_job_share"]]))  # fmt: skip
            rows.append((t, t + length, job_type, rng.uniform(0.75, 1.0), rng.uniform(0, 1e5)))
            t += length + rng.exponential(w["idle_gap_mean_min"] * 60)
            if rng.random() < w["app_crash_share"] and 0 <= rows[-1][1] < horizon - 1:
                s.app_crashes.append((len(s.jobs), float(rows[-1][1])))
        s.jobs.append(np.array(rows, dtype=np.float64).reshape(-1, 5))
        s.pod_gaps.append([])

    # Failures ------------------------------------------------------------------------------------
    accel = config.acceleration
    rate = w["failure_rate_per_gpu_day"] * accel / DAY  # per GPU-second
    weight_hot = np.where(hot[rack], w["hot_rack_failure_factor"], 1.0)
    gpu_weight = np.repeat(weight_hot, g)
    gpu_weight = gpu_weight / gpu_weight.sum()
    drawn: list[tuple[float, int, int, int]] = []  # (time, cause, node, gpu)
    for ci, cause in enumerate(CAUSES):
        times = _poisson_times(rng, rate * w["cause_mix"][cause.name] * units, last_sample)
        level = cause_level(cause)
        for t in times:
            if level == "node":
                drawn.append((float(np.floor(t)), ci, int(rng.integers(n)), -1))
            else:
                unit = int(rng.choice(units, p=gpu_weight))
                drawn.append((float(np.floor(t)), ci, unit // g, unit % g))
    drawn.sort()
    unit_up_at = np.zeros(units)  # when each slot's current card went in (or came back)
    unit_busy = np.full(units, -math.inf)  # dark until
    node_busy = np.full(n, -math.inf)
    for t, ci, node, gpu in drawn:
        cause = CAUSES[ci]
        if node_busy[node] > t or (gpu >= 0 and unit_busy[node * g + gpu] > t):
            continue
        mode = logged_mode(cause)
        pre = 0.0
        kind = cause.precursor
        if kind and rng.random() < w["p_precursor"][cause.name]:
            pre = float(
                np.round(w["precursor_median_s"][cause.name] * rng.lognormal(0, w["precursor_sigma"]))
            )
            since = unit_up_at[node * g + gpu] if gpu >= 0 else unit_up_at[node * g : node * g + g].max()
            pre = max(0.0, min(pre, t - since)) if since > 0 else pre
        xid = int(rng.choice(cause.xids)) if cause.xids else 0
        repair = cause.repair
        until = t + (w["repair_median_h"] * 3600 * rng.lognormal(0.0, 0.8) if repair else 0.0)
        replace = bool(repair and gpu >= 0 and rng.random() < cause.p_replace)
        before = after = -1
        if gpu >= 0:
            unit = node * g + gpu
            before = after = s.slot_cards[unit][-1][1]
            if replace:
                after = _card(s, rng, w, unit, False)
                s.slot_cards[unit].append((until, after))
        if pre > 0:
            s.episodes.append(_episode(rng, w, kind, node, gpu, t - pre, t, fails=True))
        s.failures.append(FailureEvent(t, cause, mode, node, gpu, xid, pre, until, replace, before, after))
        if mode is None:
            s.unlogged[cause.name] = s.unlogged.get(cause.name, 0) + 1
        # The job on the pod stops and restarts after a gap; the hardware goes dark until repaired.
        p = int(pod[node])
        s.pod_gaps[p].append((t, max(until, t) + w["restart_gap_min"] * 60 * rng.uniform(0.5, 1.5)))
        if repair and gpu >= 0:
            unit = node * g + gpu
            s.gpu_dark.append((unit, t, until))
            s.gpu_resets.append((unit, until))
            unit_busy[unit] = until
            unit_up_at[unit] = until
        elif repair:
            s.node_dark.append((node, t, until))
            s.node_resets.append((node, until))
            node_busy[node] = until
            unit_up_at[node * g : node * g + g] = until
        if repair and kind in ("nvlink", "pcie", "ib") and rng.random() < w["reseat_burst_p"]:
            # A short error burst after the reseat (docs/failure-modes.md look-alike); never fails.
            length = rng.uniform(600, 2400)
            s.episodes.append(
                _episode(rng, w, kind, node, gpu, until, until + length, fails=False, shape=0.0, strength=0.5)
            )
            s.near_misses += 1

    # Near misses: the same degradations, stopping short of a failure (prior ratio per precursor) ------
    for kind in CHANNELS:
        expected = 0.0
        for cause in CAUSES:
            if cause.precursor == kind:
                expected += rate * w["cause_mix"][cause.name] * units * horizon * w["p_precursor"][cause.name]
        if kind == "cooling":
            # plus rack-level cooling trouble (a CDU, a blocked door): prior 0.01 per rack-day
            for t in _poisson_times(rng, 0.01 / DAY * racks, horizon):
                r = int(rng.integers(racks))
                length = float(np.round(w["precursor_median_s"]["thermal"] * rng.lognormal(0, 1)))
                start = float(t) - length / 2
                for in_rack in np.flatnonzero(rack == r).tolist():
                    s.episodes.append(_episode(rng, w, "cooling", in_rack, -1, start, start + length, False))
                s.near_misses += 1
        count = int(rng.poisson(expected * w["near_miss_ratio"]))
        median = np.mean([w["precursor_median_s"][c.name] for c in CAUSES if c.precursor == kind])
        for _ in range(count):
            length = float(np.round(median * rng.lognormal(0, w["precursor_sigma"])))
            end = float(rng.uniform(0, horizon + length))
            unit = int(rng.integers(units))
            gpu = -1 if kind == "ib" else unit % g
            s.episodes.append(_episode(rng, w, kind, unit // g, gpu, end - length, end, fails=False))
            s.near_misses += 1

    # Monitoring and maintenance ---------------------------------------------------------------------
    for node in range(n):
        for t in _poisson_times(rng, w["driver_reload_per_node_day"] / DAY, horizon):
            s.driver_reloads.append((node, float(t)))
        for t in _poisson_times(rng, w["exporter_outage_per_node_day"] / DAY, horizon):
            s.exporter_outages.append((node, float(t), float(t + rng.uniform(600, 3 * 3600))))
        for t in _poisson_times(rng, w["frozen_exporter_per_node_day"] / DAY, horizon):
            s.frozen.append((node, float(t), float(t + rng.uniform(3600, 6 * 3600))))
    return s


def _episode(
    rng: np.random.Generator,
    w: World,
    kind: str,
    node: int,
    gpu: int,
    t0: float,
    t1: float,
    fails: bool,
    *,
    shape: float | None = None,
    strength: float | None = None,
) -> Episode:
    names = CHANNELS[kind]
    kept = [c for c in names if rng.random() >= w["channel_drop_p"]]
    if not kept:
        kept = [names[int(rng.integers(len(names)))]]
    return Episode(
        kind,
        node,
        gpu,
        float(t0),
        float(t1),
        float(rng.lognormal(0.0, w["precursor_strength_sigma"]) if strength is None else strength),
        float(rng.uniform(0.5, 3.0) if shape is None else shape),
        float(rng.uniform(0.3, 1.0)),
        frozenset(kept),
        fails,
        int(rng.integers(w["ib_ports"])),
    )
