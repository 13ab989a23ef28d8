"""A stand-in node with healthy GPUs and network, behind the same Source interface.

It lets everything run without a GPU: `faultcast collect --source simulated`, the demo and the
tests. The values are plausible for an 8x H100 node under a training job (utilization phases,
power following utilization, temperature following power, counters that only grow). Failure
dynamics belong to the fleet twin (faultcast.sim, a later issue); this source is healthy noise.
Deterministic for a seed: the same seed gives the same sequence of readings.
"""

from __future__ import annotations

import uuid

import numpy as np

from faultcast.catalogue import Scope, metrics_for
from faultcast.readings import DeviceReading, GpuReading, Reading, pack

MODEL_NAME = "NVIDIA H100 80GB HBM3"
_FB_TOTAL_MIB = 81_559.0
_POWER_LIMIT_W = 700.0
_IDLE_POWER_W = 70.0
_NVLINKS = 18
_IB_PORTS = ("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1")
_INTERFACES = ("eth0",)
_PEERS = ("peer-a:22", "peer-b:22")


class SimulatedSource:
    name = "simulated"

    def __init__(
        self,
        node: str = "sim-node-0",
        *,
        gpus: int = 8,
        seed: int = 0,
        interval: float = 1.0,
        start_unix_nano: int | None = None,
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.interval = interval
        self.start_unix_nano = start_unix_nano
        self._rng = np.random.default_rng(seed)
        self._tick = 0
        # Static per-GPU traits: manufacturing spread and position in the chassis.
        self._temp_offset = self._rng.normal(0.0, 2.0, gpus)
        self._power_offset = self._rng.normal(0.0, 8.0, gpus)
        self._uuids = [f"GPU-{uuid.UUID(bytes=self._rng.bytes(16), version=4)}" for _ in range(gpus)]
        # Counters, carried across readings.
        self._energy_mj = self._rng.uniform(1e9, 5e9, gpus)
        self._pcie_replay = np.zeros(gpus)
        self._ecc_sbe_agg = self._rng.integers(0, 3, gpus).astype(float)
        self._net_bytes = np.zeros((len(_INTERFACES), 2))
        self._net_packets = np.zeros((len(_INTERFACES), 2))
        self._ib_data = np.zeros((len(_IB_PORTS), 2))
        self._tcp = np.array([0.0, 0.0, 0.0])  # retrans, out, in_errs
        self._probes = 0.0
        self._phase = 1.0  # job phase: 1 training, lower during data loading dips

    def read(self) -> Reading:
        rng, n, dt = self._rng, self.gpus, self.interval
        self._tick += 1
        # Job phases: mostly steady training with occasional short data-loading dips.
        self._phase = 0.35 if rng.random() < 0.05 else min(1.0, self._phase + 0.3)
        util = np.clip(self._phase * 97.0 + rng.normal(0.0, 2.0, n), 0.0, 100.0)
        power = np.clip(
            _IDLE_POWER_W + util / 100.0 * 520.0 + self._power_offset + rng.normal(0.0, 6.0, n),
            50.0,
            _POWER_LIMIT_W,
        )
        temp = 30.0 + power * 0.055 + self._temp_offset + rng.normal(0.0, 0.4, n)
        mem_temp = temp + 6.0 + rng.normal(0.0, 0.4, n)
        self._energy_mj += power * dt * 1000.0
        self._pcie_replay += rng.random(n) < 0.0005
        fb_used = 62_000.0 + rng.normal(0.0, 50.0, n)
        nvml_seconds = np.abs(rng.normal(0.0022, 0.0003, n))
        gpus = []
        for i in range(n):
            values = {
                "gpu_temp": round(temp[i]),
                "memory_temp": round(mem_temp[i]),
                "power_usage": round(power[i], 3),
                "power_limit": _POWER_LIMIT_W,
                "total_energy": round(self._energy_mj[i]),
                "sm_clock": 1980.0 - (15.0 if util[i] > 95.0 else 0.0),
                "mem_clock": 2619.0,
                "gpu_util": round(util[i]),
                "mem_copy_util": round(util[i] * 0.45),
                "fb_used": round(fb_used[i]),
                "fb_free": round(_FB_TOTAL_MIB - fb_used[i]),
                "pstate": 0.0,
                "clock_event_reasons": 0.0,
                "throttle_sw_power_cap": 0.0,
                "throttle_hw_slowdown": 0.0,
                "throttle_sw_thermal": 0.0,
                "throttle_hw_thermal": 0.0,
                "throttle_hw_power_brake": 0.0,
                "ecc_sbe_volatile": 0.0,
                "ecc_dbe_volatile": 0.0,
                "ecc_sbe_aggregate": self._ecc_sbe_agg[i],
                "ecc_dbe_aggregate": 0.0,
                "retired_pages_sbe": 0.0,
                "retired_pages_dbe": 0.0,
                "retired_pages_pending": 0.0,
                "remapped_rows_correctable": 0.0,
                "remapped_rows_uncorrectable": 0.0,
                "row_remap_pending": 0.0,
                "row_remap_failure": 0.0,
                "pcie_replay": self._pcie_replay[i],
                "pcie_link_gen": 5.0,
                "pcie_link_width": 16.0,
                "pcie_link_gen_max": 5.0,
                "pcie_link_width_max": 16.0,
                "pcie_tx_bytes_per_second": round(util[i] * 2.1e7),
                "pcie_rx_bytes_per_second": round(util[i] * 2.4e7),
                "nvlink_links_active": float(_NVLINKS),
                "xid_last": 0.0,
                "nvml_call_seconds": nvml_seconds[i],
                "nvml_slowest_call_seconds": nvml_seconds[i] / 8.0,
                "nvml_failed_calls": 0.0,
                "nvml_unsupported_fields": 1.0,  # fan speed: liquid-cooled SXM parts report NOT_SUPPORTED
                "gpu_lost": 0.0,
            }
            for metric in metrics_for(Scope.GPU):
                if metric.name.startswith(("nvlink_", "xid_")) and metric.name not in values:
                    values[metric.name] = 0.0
            gpus.append(GpuReading(i, self._uuids[i], MODEL_NAME, pack(Scope.GPU, values)))
        return Reading(
            gpus=tuple(gpus),
            devices=self._network(util.mean() / 100.0),
            host=self._host(),
            time_unix_nano=(
                None if self.start_unix_nano is None else self.start_unix_nano + int(self._tick * dt * 1e9)
            ),
        )

    def _network(self, load: float) -> tuple[DeviceReading, ...]:
        rng, dt = self._rng, self.interval
        self._net_bytes += rng.uniform(0.5e6, 1.5e6, self._net_bytes.shape) * dt
        self._net_packets += rng.uniform(800, 1200, self._net_packets.shape) * dt
        self._ib_data += load * 45e9 * dt * rng.uniform(0.95, 1.05, self._ib_data.shape)
        self._probes += 1
        devices = [
            DeviceReading(
                Scope.INTERFACE,
                name,
                pack(
                    Scope.INTERFACE,
                    {
                        "net_rx_bytes": round(self._net_bytes[i, 0]),
                        "net_tx_bytes": round(self._net_bytes[i, 1]),
                        "net_rx_packets": round(self._net_packets[i, 0]),
                        "net_tx_packets": round(self._net_packets[i, 1]),
                        "net_rx_errors": 0.0,
                        "net_tx_errors": 0.0,
                        "net_rx_dropped": 0.0,
                        "net_tx_dropped": 0.0,
                    },
                ),
            )
            for i, name in enumerate(_INTERFACES)
        ]
        ib_zero = {m.name: 0.0 for m in metrics_for(Scope.IB_PORT)}
        for i, port in enumerate(_IB_PORTS):
            values = ib_zero | {
                "ib_port_rcv_data": round(self._ib_data[i, 0]),
                "ib_port_xmit_data": round(self._ib_data[i, 1]),
                "ib_port_state": 4.0,
                "ib_port_phys_state": 5.0,
                "ib_port_rate_gbps": 400.0,
            }
            devices.append(DeviceReading(Scope.IB_PORT, port, pack(Scope.IB_PORT, values)))
        for peer in _PEERS:
            rtt = abs(rng.normal(25e-6, 3e-6))
            values = {
                "peer_rtt_p50_seconds": rtt,
                "peer_rtt_p99_seconds": rtt * 2.5,
                "peer_loss_ratio": 0.0,
                "peer_probes": self._probes,
            }
            devices.append(DeviceReading(Scope.PEER, peer, pack(Scope.PEER, values)))
        return tuple(devices)

    def _host(self) -> tuple[float, ...]:
        sent = self._rng.uniform(900, 1100) * self.interval
        self._tcp += (self._rng.random() < 0.02, sent, 0.0)
        return pack(
            Scope.HOST,
            {
                "tcp_retrans_segs": self._tcp[0],
                "tcp_out_segs": round(self._tcp[1]),
                "tcp_in_errs": self._tcp[2],
            },
        )

    def close(self) -> None:
        """Nothing to release; here for the Source interface."""
