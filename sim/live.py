"""The twin as a live collector source: one node, one sample per read, on a virtual clock.

Each `read()` advances the node's virtual clock by one interval and returns exactly the values the
offline run (`faultcast simulate`) writes for that node and step with the same configuration and
seed. A collector scraping every second with a 60 s twin interval runs at `--speed 60`.
"""

from __future__ import annotations

from collections.abc import Iterable

from faultcast.catalogue import Scope
from faultcast.readings import DeviceReading, GpuReading, Reading
from faultcast.sim.config import FleetConfig
from faultcast.sim.generate import NodeChunk
from faultcast.sim.modes import BY_NAME
from faultcast.sim.node import NodeTwin
from faultcast.sim.schedule import Scenario
from faultcast.step_summary import summary_of_row

# What the exporter labels a GPU's series with besides its UUID (dcgm-exporter's pci_bus_id and
# DCGM_FI_DRIVER_VERSION): the buses of an 8-GPU HGX board, in NVML's form, and a datacenter
# driver of the generation's branch.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_DRIVERS = {"NVIDIA A100-SXM4-80GB": "535.216.03", "NVIDIA H100 80GB HBM3": "550.127.08"}
_DEFAULT_DRIVER = "550.127.08"


def pci_bus_id(gpu: int) -> str:
    """The PCI bus id of a twin GPU, as NVML writes it ("00000000:18:00.0")."""
    bus = _HGX_BUSES[gpu] if gpu < len(_HGX_BUSES) else 0xE0 + gpu - len(_HGX_BUSES)
    return f"00000000:{bus:02X}:00.0"


def driver_version(model_name: str) -> str:
    """The NVIDIA driver a twin node of this GPU model runs."""
    return _DRIVERS.get(model_name, _DEFAULT_DRIVER)


class TwinExhausted(RuntimeError):  # noqa: N818 (a state, not a programming error)
    """The virtual clock reached the end of the configured horizon."""


class TwinSource:
    """One node of the twin as a collector source (faultcast.collector.source.Source): each read()
    is the next step, with the same values `faultcast simulate` writes for that node and step."""

    name = "simulated"

    def __init__(self, config: FleetConfig, node: int = 0, scenarios: Iterable[Scenario] = ()) -> None:
        self.config = config
        self.node = NodeTwin(config, node, scenarios)
        self.step = 0  # the next step to read
        self._chunk: NodeChunk | None = None
        self._scenarios = list(self.node.scenarios)

    @property
    def virtual_time_s(self) -> float:
        """Seconds since the twin's start of the next reading."""
        return self.step * self.config.cadence_s

    def inject(self, scenario: Scenario) -> Scenario:
        """Order a failure on cue from now on; returns the scenario as scheduled.

        The precursor cannot start in the past (those samples were read already), so its lead is
        shortened to the time left before the failure when needed.
        """
        if scenario.node != self.node.node:
            raise ValueError(f"this source simulates node {self.node.node}, not {scenario.node}")
        now = self.virtual_time_s
        if scenario.fail_s <= now:
            raise ValueError(f"the failure time {scenario.fail_s} s is not after the virtual now ({now} s)")
        spec = BY_NAME[scenario.mode]
        lead = spec.lead_median_s if scenario.lead_s is None else scenario.lead_s
        scheduled = Scenario(
            scenario.mode,
            scenario.node,
            scenario.gpu,
            scenario.fail_s,
            min(lead, scenario.fail_s - now),
            scenario.strength,
        )
        self._scenarios.append(scheduled)
        if self._chunk is not None:
            self._chunk = self.node.redo_chunk(self._scenarios)
        else:
            self.node = NodeTwin(self.config, self.node.node, self._scenarios)
        return scheduled

    def read(self) -> Reading:
        """The node's next step, stamped with its virtual time; a dark step (node down or scrape lost)
        gives a Reading with only the time. Raises TwinExhausted past the configured horizon."""
        config = self.config
        if self.step >= config.steps:
            raise TwinExhausted(f"the twin's horizon of {config.days} days is over")
        chunk = self._chunk
        if chunk is None or self.step >= chunk.first_step + len(chunk.times_s):
            chunk = self._chunk = self.node.next_chunk()
        k = self.step - chunk.first_step
        self.step += 1
        time_ns = config.start_unix_s * 10**9 + round(float(chunk.times_s[k]) * 1e9)
        if not chunk.node_present[k]:
            return Reading(time_unix_nano=time_ns)  # the node is dark or the scrape was lost
        traits = self.node.traits
        model = traits.generation.model_name
        driver = driver_version(model)
        gpus = tuple(
            GpuReading(
                g,
                self.node.uuid(g, int(chunk.replacements[k, g])),
                model,
                tuple(chunk.gpu_values[k, g].tolist()),
                lost=bool(chunk.gpu_lost[k, g]),
                pci_bus_id=pci_bus_id(g),
                driver_version=driver,
                summary=summary_of_row(chunk.gpu_summary[k, g]),
            )
            for g in range(config.gpus_per_node)
            if chunk.gpu_present[k, g]
        )
        devices = [
            DeviceReading(Scope.IB_PORT, port, tuple(chunk.ib_values[k, p].tolist()))
            for p, port in enumerate(traits.ib_ports)
        ]
        devices.append(DeviceReading(Scope.INTERFACE, "eth0", tuple(chunk.iface_values[k, 0].tolist())))
        devices += [
            DeviceReading(Scope.PEER, peer, tuple(chunk.peer_values[k, q].tolist()))
            for q, peer in enumerate(traits.peers)
        ]
        return Reading(
            gpus=gpus,
            devices=tuple(devices),
            host=tuple(chunk.host_values[k].tolist()),
            time_unix_nano=time_ns,
        )

    def close(self) -> None:
        """Nothing to release; here for the Source interface."""
