"""Plain data passed from sources to outputs: what one scrape of one node saw.

Values are tuples of floats aligned with the catalogue's order for their scope; a missing
value (NOT_SUPPORTED, unreadable, not applicable) is NaN, never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from faultcast.catalogue import Scope, index_of, metrics_for
from faultcast.step_summary import StepSummary

NAN = math.nan
"""The value of a missing reading (never zero); test with math.isnan, NaN != NaN."""


def pack(scope: Scope, values: Mapping[str, float]) -> tuple[float, ...]:
    """Align a name->value mapping with the catalogue order of `scope`; absent names become NaN."""
    positions = index_of(scope)
    unknown = set(values) - set(positions)
    if unknown:
        raise KeyError(f"not {scope.value} metrics in the catalogue: {sorted(unknown)}")
    out = [NAN] * len(positions)
    for name, value in values.items():
        out[positions[name]] = float(value)
    return tuple(out)


def unpack(scope: Scope, values: Sequence[float]) -> dict[str, float]:
    """The inverse of `pack`, keeping NaN for missing values."""
    metrics = metrics_for(scope)
    if len(values) != len(metrics):
        raise ValueError(f"{scope.value} values have {len(values)} entries, the catalogue has {len(metrics)}")
    return {m.name: v for m, v in zip(metrics, values, strict=True)}


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one scrape read of one GPU, with the identity its series are labelled with."""

    index: int
    uuid: str
    model_name: str
    values: tuple[float, ...]  # aligned with metrics_for(Scope.GPU)
    lost: bool = False
    # Identity labels of the exporter (dcgm-exporter's pci_bus_id and DCGM_FI_DRIVER_VERSION); empty
    # when unknown. Not on the wire: the service keys GPUs by node and index, and needs neither.
    pci_bus_id: str = ""  # NVML's form, "00000000:18:00.0"
    driver_version: str = ""  # "550.127.08"
    # The scrapes of a grid step behind this reading (faultcast.step_summary): set by a collector that
    # ships one sample per step, and by a source that already knows (the twin); None: one scrape.
    summary: StepSummary | None = None
    # dcgm-exporter default fields exported for parity only, aligned with faultcast.dcgm.PARITY (NaN
    # where NVML gave nothing); empty when the source reads none. Not on the wire, not a model input.
    parity: tuple[float, ...] = ()

    def get(self, name: str) -> float:
        """The value of GPU metric `name` (NaN when missing); KeyError for a name not in the GPU scope."""
        return self.values[index_of(Scope.GPU)[name]]


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """A network device of one scope: an interface, an InfiniBand port or a peer."""

    scope: Scope
    device: str  # "eth0", "mlx5_0:1", "node-b:22"
    values: tuple[float, ...]  # aligned with metrics_for(scope)

    def get(self, name: str) -> float:
        """The value of metric `name` (NaN when missing); KeyError for a name not in this device's scope."""
        return self.values[index_of(self.scope)[name]]


@dataclass(frozen=True, slots=True)
class Reading:
    """What one source saw; the collector merges the readings of its sources into a snapshot."""

    gpus: tuple[GpuReading, ...] = ()
    devices: tuple[DeviceReading, ...] = ()
    host: tuple[float, ...] | None = None  # aligned with metrics_for(Scope.HOST)
    # A simulated source owns a virtual clock; real sources leave time to the collector.
    time_unix_nano: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything the collector knows about its node at one instant."""

    node: str
    time_unix_nano: int
    gpus: tuple[GpuReading, ...]
    devices: tuple[DeviceReading, ...]
    host: tuple[float, ...]
    collector: tuple[float, ...]  # aligned with metrics_for(Scope.COLLECTOR)
    sequence: int = 0
    notes: tuple[str, ...] = field(default=())  # what went wrong during the scrape, for logs
    # The epoch-aligned window this sample closes and summarises (its GPUs' `summary`), in seconds;
    # 0 for a single scrape. A window that ends where the model's step ends completes that step.
    window_s: float = 0.0
    # The collector's spool the sample came from (its PushHello's spool_id): with `sequence`, what
    # tells a sample taken before a restart from one taken after. 0 outside the service.
    spool_id: int = 0

    @staticmethod
    def merge(
        node: str,
        time_unix_nano: int,
        readings: Iterable[Reading],
        collector: Mapping[str, float],
        notes: Iterable[str] = (),
    ) -> NodeSnapshot:
        """One snapshot from the readings of a node's sources: GPUs sorted by index, devices in the
        order given; the last reading that carries a host array or a time wins (a simulated source's
        virtual clock overrides `time_unix_nano`); no host reading gives an all-NaN host array.
        `collector` is packed like pack(Scope.COLLECTOR, ...) and raises KeyError the same way."""
        gpus: list[GpuReading] = []
        devices: list[DeviceReading] = []
        host: tuple[float, ...] | None = None
        for reading in readings:
            gpus.extend(reading.gpus)
            devices.extend(reading.devices)
            if reading.host is not None:
                host = reading.host
            if reading.time_unix_nano is not None:
                time_unix_nano = reading.time_unix_nano
        return NodeSnapshot(
            node=node,
            time_unix_nano=time_unix_nano,
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            devices=tuple(devices),
            host=host if host is not None else pack(Scope.HOST, {}),
            collector=pack(Scope.COLLECTOR, collector),
            notes=tuple(notes),
        )
