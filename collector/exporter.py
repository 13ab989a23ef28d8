"""Prometheus exposition of the latest snapshot, with dcgm-exporter's names, types and labels.

GPU series carry dcgm-exporter's labels (gpu, UUID, pci_bus_id, device, modelName, Hostname and
DCGM_FI_DRIVER_VERSION), so dashboards and rules written for dcgm-exporter work unchanged; metrics
dcgm-exporter lacks are named faultcast_*. Missing values (NaN) are left out, as dcgm-exporter does
for unsupported fields, and so is a label whose value is unknown.

dcgm-exporter's default fields that are not catalogue metrics (encoder and decoder utilisation, NVLink
bandwidth, the DCP fields: faultcast.dcgm.PARITY) are exported from each GPU reading's `parity`
values, after the catalogue's GPU families, under dcgm-exporter's names, types and labels too; a
reading without them (a simulated source) exports none.

dcgm-exporter's counters keep their exact names (DCGM_FI_DEV_PCIE_REPLAY_COUNTER) and are typed
counter, as its CSVs declare them (faultcast.dcgm). prometheus-client cannot write that: its text
output names every counter family `<name>_total`. So the exposition is written here, in the text
format 0.0.4 that dcgm-exporter serves (OpenMetrics would require the `_total` suffix), and served
by a small HTTP server of its own. faultcast_* counters end in `_total` as before.
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from faultcast.catalogue import FAMILY_HELP, Kind, Scope, metrics_for
from faultcast.dcgm import LABELS, PARITY, Vocabulary, names, parity_name
from faultcast.readings import GpuReading, NodeSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_DEVICE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.INTERFACE: ("device",),
    Scope.IB_PORT: ("device", "port"),
    Scope.PEER: ("peer",),
}

Labels = tuple[tuple[str, str], ...]


def gpu_labels(vocabulary: Vocabulary = Vocabulary.CLASSIC) -> tuple[str, ...]:
    """The labels of every GPU series, in dcgm-exporter's order."""
    names_ = LABELS[vocabulary]
    return ("gpu", "UUID", "pci_bus_id", "device", "modelName", names_.hostname, names_.driver_version)


GPU_LABELS = gpu_labels()


@dataclass(frozen=True, slots=True)
class Family:
    """One exported family; every sample is named `name` exactly."""

    name: str
    type: str  # "gauge" or "counter"
    help: str
    samples: tuple[tuple[Labels, float], ...]


@dataclass(frozen=True, slots=True)
class _Spec:
    """One family and the catalogue positions that feed it."""

    name: str
    help: str
    counter: bool
    members: tuple[tuple[int, tuple[str, str] | None, float], ...]  # (position, extra label, scale)


def _specs(scope: Scope, vocabulary: Vocabulary) -> tuple[_Spec, ...]:
    dcgm = names(vocabulary)
    grouped: dict[str, list[tuple[int, tuple[str, str] | None, float]]] = {}
    first: dict[str, _Spec] = {}
    for position, metric in enumerate(metrics_for(scope)):
        named = dcgm.get(metric.name)
        if named is not None:
            name, counter, unit, scale = named.name, named.counter, named.unit, named.scale
        else:
            name, counter, unit, scale = metric.prometheus_name, metric.kind is Kind.COUNTER, metric.unit, 1.0
        if name not in first:
            first[name] = _Spec(name, f"{FAMILY_HELP.get(name, metric.help)} [{unit}]", counter, ())
        grouped.setdefault(name, []).append((position, metric.family_label, scale))
    return tuple(
        _Spec(spec.name, spec.help, spec.counter, tuple(grouped[spec.name])) for spec in first.values()
    )


def _parity_specs(vocabulary: Vocabulary) -> tuple[_Spec, ...]:
    """One family per parity field; its members' positions are in `GpuReading.parity`."""
    return tuple(
        _Spec(
            parity_name(field, vocabulary), f"{field.help} [{field.unit}]", field.counter, ((i, None, 1.0),)
        )
        for i, field in enumerate(PARITY)
    )


def _family(spec: _Spec, rows: Iterable[tuple[Labels, Sequence[float]]]) -> Family:
    samples: list[tuple[Labels, float]] = []
    for labels, values in rows:
        for position, extra, scale in spec.members:
            if position >= len(values):
                continue  # parity values the reading does not have
            value = values[position]
            if math.isnan(value):
                continue
            samples.append(((*labels, extra) if extra else labels, value * scale))
    return Family(spec.name, "counter" if spec.counter else "gauge", spec.help, tuple(samples))


class SnapshotExporter:
    """The exposition of whatever snapshot `latest()` returns now, in one vocabulary."""

    def __init__(
        self, latest: Callable[[], NodeSnapshot | None], vocabulary: Vocabulary = Vocabulary.CLASSIC
    ) -> None:
        self.latest = latest
        self.vocabulary = vocabulary
        self._hostname = LABELS[vocabulary].hostname
        self._driver = LABELS[vocabulary].driver_version
        self._specs = {scope: _specs(scope, vocabulary) for scope in Scope}
        self._parity_specs = _parity_specs(vocabulary)

    def families(self) -> list[Family]:
        """Every family with at least one sample (a field unsupported everywhere is left out)."""
        snapshot = self.latest()
        if snapshot is None:
            return []
        host = (self._hostname, snapshot.node)
        gpu_rows = [(self._gpu_labels(g, snapshot.node), g.values) for g in snapshot.gpus]
        families = [_family(spec, gpu_rows) for spec in self._specs[Scope.GPU]]
        parity_rows = [(labels, g.parity) for (labels, _), g in zip(gpu_rows, snapshot.gpus, strict=True)]
        families.extend(_family(spec, parity_rows) for spec in self._parity_specs)
        for scope, label_names in _DEVICE_LABELS.items():
            rows = [
                ((*zip(label_names, _device_values(scope, d.device), strict=True), host), d.values)
                for d in snapshot.devices
                if d.scope is scope
            ]
            families.extend(_family(spec, rows) for spec in self._specs[scope])
        for scope, values in ((Scope.HOST, snapshot.host), (Scope.COLLECTOR, snapshot.collector)):
            families.extend(_family(spec, [((host,), values)]) for spec in self._specs[scope])
        return [f for f in families if f.samples]

    def render(self) -> bytes:
        """The exposition in the Prometheus text format 0.0.4."""
        return render(self.families()).encode()

    def _gpu_labels(self, gpu: GpuReading, node: str) -> Labels:
        pairs = (
            ("gpu", str(gpu.index)),
            ("UUID", gpu.uuid),
            ("pci_bus_id", gpu.pci_bus_id),
            ("device", f"nvidia{gpu.index}"),
            ("modelName", gpu.model_name),
            (self._hostname, node),
            (self._driver, gpu.driver_version),
        )
        return tuple(p for p in pairs if p[1])  # an empty label is no label to Prometheus


def _device_values(scope: Scope, device: str) -> tuple[str, ...]:
    if scope is Scope.IB_PORT:
        name, _, port = device.rpartition(":")
        return (name, port)
    return (device,)


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))  # "NaN" never comes here: missing values are left out


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(families: Iterable[Family]) -> str:
    """Families in the Prometheus text format 0.0.4, labels in their given order."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for labels, value in family.samples:
            text = ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels)
            lines.append(
                f"{family.name}{{{text}}} {_number(value)}" if text else f"{family.name} {_number(value)}"
            )
    return "".join(line + "\n" for line in lines)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], family: socket.AddressFamily, body: Callable[[], bytes]
    ) -> None:
        self.address_family = family
        self.body = body
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if urlsplit(self.path).path not in ("/", "/metrics"):
            self.send_error(404, "only /metrics is served here")
            return
        body = self.server.body()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Every scrape would log a line; errors show in the scraper instead."""


def start_metrics_server(
    body: Callable[[], bytes], port: int, address: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """Serve `body()` on http://address:port/metrics from a daemon thread; port 0 picks a free one.

    `shutdown()` and `server_close()` on the returned server stop it.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    server = _Server((address, port), family, body)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
