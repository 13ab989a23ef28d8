"""Prometheus exposition of the latest snapshot, with dcgm-exporter-compatible names and labels.

GPU series carry dcgm-exporter's labels (gpu, UUID, device, modelName, Hostname), so dashboards
and rules written for dcgm-exporter work unchanged; metrics dcgm-exporter lacks are named
faultcast_*. Missing values (NaN) are left out, as dcgm-exporter does for unsupported fields.

prometheus-client appends `_total` to every counter family, which would rename dcgm-exporter's
counters (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL_total); those few families keep their exact name and
are typed gauge. faultcast_* counters are real counters ending in `_total`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from faultcast.catalogue import FAMILY_HELP, Kind, Scope, metrics_for
from faultcast.catalogue import Metric as CatalogueMetric
from faultcast.readings import NodeSnapshot

GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
_DEVICE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.INTERFACE: ("device", "Hostname"),
    Scope.IB_PORT: ("device", "port", "Hostname"),
    Scope.PEER: ("peer", "Hostname"),
}


@dataclass(frozen=True, slots=True)
class _Family:
    """One exported family and the catalogue positions that feed it."""

    name: str
    help: str
    counter: bool
    members: tuple[tuple[int, tuple[str, str] | None], ...]  # (position in scope, extra label)


def _families(scope: Scope) -> tuple[_Family, ...]:
    grouped: dict[str, list[tuple[int, CatalogueMetric]]] = {}
    for position, metric in enumerate(metrics_for(scope)):
        grouped.setdefault(metric.prometheus_name, []).append((position, metric))
    families = []
    for name, members in grouped.items():
        first = members[0][1]
        counter = first.kind is Kind.COUNTER and first.dcgm is None
        help_text = FAMILY_HELP.get(name, first.help)
        families.append(
            _Family(
                name,
                f"{help_text} [{first.unit}]",
                counter,
                tuple((pos, m.family_label) for pos, m in members),
            )
        )
    return tuple(families)


def _emit(
    family: _Family,
    label_names: Sequence[str],
    rows: Iterable[tuple[Sequence[str], Sequence[float]]],
) -> Metric:
    extra = next((label[0] for _, label in family.members if label is not None), None)
    names = [*label_names, extra] if extra else list(label_names)
    metric: CounterMetricFamily | GaugeMetricFamily
    if family.counter:
        # CounterMetricFamily wants the name without _total; it adds the suffix itself.
        metric = CounterMetricFamily(family.name.removesuffix("_total"), family.help, labels=names)
    else:
        metric = GaugeMetricFamily(family.name, family.help, labels=names)
    for labels, values in rows:
        for position, label in family.members:
            value = values[position]
            if math.isnan(value):
                continue
            metric.add_metric([*labels, label[1]] if label else list(labels), value)
    return metric


class SnapshotCollector(Collector):
    """A prometheus-client collector over whatever snapshot `latest()` returns now."""

    def __init__(self, latest: Callable[[], NodeSnapshot | None]) -> None:
        self.latest = latest
        self._families = {scope: _families(scope) for scope in Scope}

    def collect(self) -> Iterable[Metric]:
        snapshot = self.latest()
        if snapshot is None:
            return []
        host = snapshot.node
        gpu_rows = [
            ((str(g.index), g.uuid, f"nvidia{g.index}", g.model_name, host), g.values) for g in snapshot.gpus
        ]
        metrics = [_emit(family, GPU_LABELS, gpu_rows) for family in self._families[Scope.GPU]]
        for scope, label_names in _DEVICE_LABELS.items():
            rows = [
                (_device_labels(scope, d.device, host), d.values)
                for d in snapshot.devices
                if d.scope is scope
            ]
            metrics.extend(_emit(family, label_names, rows) for family in self._families[scope])
        for scope, values in ((Scope.HOST, snapshot.host), (Scope.COLLECTOR, snapshot.collector)):
            metrics.extend(
                _emit(family, ("Hostname",), [((host,), values)]) for family in self._families[scope]
            )
        # A family with no samples (unsupported everywhere) is left out entirely, HELP line included.
        return [m for m in metrics if m.samples]


def _device_labels(scope: Scope, device: str, host: str) -> tuple[str, ...]:
    if scope is Scope.IB_PORT:
        name, _, port = device.rpartition(":")
        return (name, port, host)
    return (device, host)
