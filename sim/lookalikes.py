"""Look-alikes: what healthy hardware shows that a precursor shows too, and is followed by nothing.

For every precursor signal there is a healthy source of the same signal, at rates, durations and
strengths that overlap the precursors (rates from the world, sim/world.py; sources in
docs/failure-modes.md):

- correctable ECC: a steady rate on a few cards (traits), bursts on them, benign row remaps and
  now and then a pending remap, Xid 63 and 92 on the noisiest;
- PCIe: replay trickles (traits) and bursts; links trained below their maximum for good (traits);
- NVLink: CRC errors on marginal links (traits) and bursts;
- InfiniBand: symbol errors on marginal ports (traits), bursts after reseats, links that flap and
  heal (link_downed, recovery, receive errors, a moment of peer loss and latency), congestion (ACK
  timeouts, discards, peer latency, TCP retransmits for minutes);
- heat and power in groups: a rack's cooling trouble (inlet up 8-20 C for 20-120 min) throttles
  many GPUs at once, a PDU power-brakes a whole rack for minutes, the weather and the day move every
  inlet (sim/thermal.py); heavy jobs sit at the power cap (sim/generate.py);
- application Xids (13, 31, 43) from user code; driver reloads that reset counters (the schedule);
- monitoring: NVML slow under load for minutes on a whole node, scrapes lost, collector gaps of
  5-60 min, exporters frozen on their last values for 30 min to 12 h.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from faultcast.sim.config import FleetConfig
from faultcast.sim.episodes import episodes, spilled, steps_between
from faultcast.sim.fleet import NodeTraits
from faultcast.sim.precursors import Effects, add_brakes, per_step
from faultcast.sim.streams import Stream, rng

_APP_XIDS = np.array([13, 31, 43])  # application errors: common, harmless to the hardware
_DAY = 86_400.0
_MONTH = 30 * _DAY

Streams = Callable[[int], Callable[[int | str], np.random.Generator]]
"""Chunk -> that chunk's keyed streams of the node (generate._Streams)."""


def _node_episodes(
    streams: Streams, chunk: int, name: str, shape: tuple[int, ...], per_day: float, length_s: tuple[float, float],
    cadence_s: float,
) -> np.ndarray:  # fmt: skip
    """Episodes of one kind on the node (or each of its GPUs/ports), carried across chunk boundaries."""
    lengths = steps_between(*length_s, cadence_s)

    def draw(r: np.random.Generator, s: tuple[int, ...], extend: int) -> np.ndarray:
        return episodes(r, s, per_day * cadence_s / _DAY, lengths, extend)

    return spilled(lambda c: streams(c)(name), chunk, shape, draw)


def _rack_episodes(
    config: FleetConfig, rack: int, chunk: int, name: str, per_month: float, length_s: tuple[float, float],
    n: int,
) -> np.ndarray:  # fmt: skip
    """Episodes every node of the rack shares (their own stream, keyed by the rack)."""
    lengths = steps_between(*length_s, config.cadence_s)
    key = zlib.crc32(name.encode())

    def draw(r: np.random.Generator, s: tuple[int, ...], extend: int) -> np.ndarray:
        return episodes(r, s, per_month * config.cadence_s / _MONTH, lengths, extend)

    return spilled(lambda c: rng(config.seed, Stream.RACK, rack, c, key), chunk, (n,), draw)


def apply_lookalikes(
    fx: Effects, config: FleetConfig, traits: NodeTraits, streams: Streams, chunk: int, busy: np.ndarray
) -> np.ndarray:
    """Add the healthy look-alikes of one node's chunk to `fx`; returns its application Xids (T, G)."""
    n, g = fx.clock.shape
    w, cadence_s = config.world, config.cadence_s
    dt_min = cadence_s / 60.0
    rs = streams(chunk)
    r = rs("lookalikes")
    # Correctable ECC: the steady cards, bursts on them (10-90 min at 1-20/min), benign remaps.
    heavy = traits.steady_sbe_per_min > 0
    burst = _node_episodes(streams, chunk, "sbe_burst", (n, g), 0.2, (600, 5400), cadence_s) & heavy
    fx.sbe_per_min += traits.steady_sbe_per_min + burst * r.uniform(1.0, 20.0, g)
    fx.remap_p += per_step(traits.remap_per_day / 1440.0, dt_min)
    fx.xid92_p += (fx.sbe_per_min > 8.0) * per_step(0.02, dt_min)
    # A remap takes effect at the next GPU reset: the card reports it pending until then (here 10 min-2 h).
    pending = _node_episodes(
        streams, chunk, "pending", (n, g), w.benign_remap_per_day, (600, 7200), cadence_s
    )
    fx.pending |= pending & heavy
    # PCIe: trickles, bursts, and links that trained low for good.
    fx.pcie_per_min += traits.pcie_trickle_per_min
    fx.pcie_burst += (r.random((n, g)) < per_step(w.pcie_bursts_per_day / 1440.0, dt_min)) * r.integers(
        1, 60, (n, g)
    )
    fx.width_down |= (traits.pcie_downtrained == 1)[None, :]
    fx.gen_down |= (traits.pcie_downtrained == 2)[None, :]
    # NVLink: marginal links and bursts (up to thousands in a minute, then nothing).
    fx.nvlink_per_min[0] += traits.nvlink_marginal_per_min
    fx.nvlink_per_min[1] += 0.35 * traits.nvlink_marginal_per_min
    sizes = np.exp(r.uniform(np.log(5.0), np.log(3000.0), (n, g)))
    fx.nvlink_burst += (r.random((n, g)) < per_step(w.nvlink_bursts_per_day / 1440.0, dt_min)) * np.round(
        sizes
    )
    # InfiniBand: marginal ports, reseat bursts, flaps.
    p = fx.p
    fx.ib_symbol_per_min += traits.ib_marginal_per_min
    fx.ib_rcv_per_min += 0.2 * traits.ib_marginal_per_min
    fx.ib_burst += (r.random((n, p)) < per_step(w.ib_bursts_per_port_day / 1440.0, dt_min)) * r.integers(
        20, 2000, (n, p)
    )
    flap = r.random((n, p)) < per_step(w.ib_flaps_per_port_day / 1440.0, dt_min)
    fx.ib_flap += flap
    flapped = flap.any(axis=1)
    fx.loss += flapped * r.uniform(0.02, 0.3, n)
    fx.rtt_tail *= 1.0 + flapped * r.uniform(1.0, 8.0, n)
    fx.retrans_per_min += flapped * r.uniform(20.0, 200.0, n)
    # Congestion (another job's all-to-all, a busy spine): ACK timeouts, discards, latency, retransmits.
    jam = _node_episodes(
        streams, chunk, "congestion", (n,), w.ib_congestion_per_node_day, (120, 1800), cadence_s
    )
    level = rs("congestion_level").uniform(0.2, 3.0)
    fx.ib_ack_timeout_per_min += (jam * level)[:, None] * np.ones(p)
    fx.ib_discard_per_min += (jam * 50.0 * level)[:, None] * np.ones(p)
    fx.rtt *= 1.0 + jam * level
    fx.rtt_tail *= 1.0 + jam * 2.0 * level
    fx.retrans_per_min += jam * 20.0 * level
    # Heat and power in groups: the rack's cooling and its PDU.
    cooling = _rack_episodes(config, traits.rack, chunk, "room_cooling", w.room_cooling_events_per_rack_month,
                             (1200, 7200), n)  # fmt: skip
    rise = rng(config.seed, Stream.RACK, traits.rack, chunk, 1).uniform(8.0, 20.0)
    fx.inlet_add += cooling * rise
    brake = _rack_episodes(config, traits.rack, chunk, "rack_brake", w.rack_power_brakes_per_rack_month,
                           (60, 600), n)  # fmt: skip
    fx.brake |= (brake & busy)[:, None]
    fx.brake_s = np.where((brake & busy)[:, None], cadence_s, fx.brake_s)  # a PDU brake spans whole steps
    _brake_blips(config, traits, fx, rs, busy)
    # Monitoring: slow NVML under load, gaps, frozen exporters.
    slow = _node_episodes(streams, chunk, "nvml_slow", (n,), w.nvml_slow_episodes_per_node_day, (60, 1200),
                          cadence_s)  # fmt: skip
    fx.nvml_slow *= (1.0 + slow * rs("nvml_slow_factor").uniform(2.0, 29.0))[:, None]
    fx.nvml_fail_per_min += (slow * 0.2)[:, None]
    fx.gap |= _node_episodes(
        streams, chunk, "gap", (n,), w.monitoring_gaps_per_node_day, (300, 3600), cadence_s
    )
    fx.frozen |= _node_episodes(
        streams, chunk, "frozen", (n,), w.exporter_freezes_per_node_month / 30.0, (1800, 43_200), cadence_s
    )
    # Application Xids from buggy jobs.
    app = (r.random((n, g)) < per_step(w.app_xids_per_gpu_week / (7 * 1440.0), dt_min)) & busy[:, None]
    return np.where(app, r.choice(_APP_XIDS, (n, g)), 0)


def _brake_blips(
    config: FleetConfig,
    traits: NodeTraits,
    fx: Effects,
    rs: Callable[[str], np.random.Generator],
    busy: np.ndarray,
) -> None:
    """Power brakes of seconds on healthy hardware: a node's power supply stepping (every GPU of the
    node at once), single blips on any GPU, and a few brake-prone cards that blip often for life."""
    w, g, cadence_s = config.world, fx.g, config.cadence_s
    n = len(fx.t)
    dt_min = cadence_s / 60.0
    node = (
        rs("node_brake").random(n) < per_step(w.node_power_transients_per_node_day / 1440.0, dt_min)
    ) & busy
    add_brakes(fx, slice(None), np.repeat(node[:, None], g, axis=1), rs("node_brake_len"), cadence_s)
    prone = rng(config.seed, Stream.TRAITS, traits.index, 41)  # for life: keyed by the node, not the chunk
    rate = np.where(
        prone.random(g) < w.brake_prone_share,
        w.brake_prone_per_day * np.exp(prone.normal(0.0, 1.0, g)),
        w.brake_blips_per_gpu_day,
    )
    blips = (rs("gpu_brake").random((n, g)) < per_step(rate / 1440.0, dt_min)) & busy[:, None]
    add_brakes(fx, slice(None), blips, rs("gpu_brake_len"), cadence_s)
