"""Conversion between readings and the faultcast.v1 protobuf messages, derived from the catalogue."""

from __future__ import annotations

import math

from faultcast import __version__
from faultcast.catalogue import CATALOGUE_VERSION, METRICS, SCHEMA_HASH, Kind, Scope, metrics_for
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot
from faultcast.step_summary import StepSummary
from faultcast.v1 import telemetry_pb2 as pb

_TO_PB: dict[Scope, pb.Scope.ValueType] = {
    Scope.GPU: pb.SCOPE_GPU,
    Scope.INTERFACE: pb.SCOPE_INTERFACE,
    Scope.IB_PORT: pb.SCOPE_IB_PORT,
    Scope.PEER: pb.SCOPE_PEER,
    Scope.HOST: pb.SCOPE_HOST,
    Scope.COLLECTOR: pb.SCOPE_COLLECTOR,
}
_FROM_PB: dict[int, Scope] = {int(v): k for k, v in _TO_PB.items()}


class WireError(ValueError):
    """A message that does not fit the schema; the text says what is wrong."""


_KIND_TO_PB: dict[Kind, pb.MetricKind.ValueType] = {
    Kind.GAUGE: pb.METRIC_KIND_GAUGE,
    Kind.COUNTER: pb.METRIC_KIND_COUNTER,
}


# Scopes in the order the catalogue lists their metrics, which is the order the schema hash reads
# them in: a collector hashes GetSchema's scopes as listed (proto/README.md).
_SCOPE_ORDER: tuple[Scope, ...] = tuple(dict.fromkeys([*(m.scope for m in METRICS), *Scope]))


def schema() -> pb.MetricSchema:
    """The wire schema a collector sends in its hello: every scope's metric names in wire order."""
    return pb.MetricSchema(
        catalogue_version=CATALOGUE_VERSION,
        schema_hash=SCHEMA_HASH,
        scopes=[
            pb.ScopeSchema(scope=_TO_PB[scope], metrics=[m.name for m in metrics_for(scope)])
            for scope in _SCOPE_ORDER
        ],
    )


def described_schema() -> pb.MetricSchema:
    """schema() with each metric's unit, kind and help (Telemetry/GetSchema), for collectors
    written from the API alone."""
    described = schema()
    for scope_schema, scope in zip(described.scopes, _SCOPE_ORDER, strict=True):
        scope_schema.descriptions.extend(
            pb.MetricDescription(name=m.name, unit=m.unit, kind=_KIND_TO_PB[m.kind], help=m.help)
            for m in metrics_for(scope)
        )
    return described


def hello(node: str, spool_id: int) -> pb.PushRequest:
    """The first message of a collector's push stream: its node, version and schema(). The service
    keeps its acknowledged sequence per (node, spool_id), any unsigned 64-bit number."""
    return pb.PushRequest(
        hello=pb.PushHello(node=node, collector_version=__version__, schema=schema(), spool_id=spool_id)
    )


def to_proto(snapshot: NodeSnapshot) -> pb.NodeSample:
    """Encode a snapshot, stamped with this catalogue's SCHEMA_HASH, with its GPUs' step summaries and
    its window; from_proto is its inverse (identity labels such as pci_bus_id are not on the wire)."""
    return pb.NodeSample(
        sequence=snapshot.sequence,
        time_unix_nano=snapshot.time_unix_nano,
        node=snapshot.node,
        schema_hash=SCHEMA_HASH,
        gpus=[_gpu_to_proto(g) for g in snapshot.gpus],
        devices=[
            pb.DeviceSample(scope=_TO_PB[d.scope], device=d.device, values=d.values) for d in snapshot.devices
        ],
        host_values=snapshot.host,
        collector_values=snapshot.collector,
        window_s=snapshot.window_s,
    )


def _gpu_to_proto(g: GpuReading) -> pb.GpuSample:
    sample = pb.GpuSample(index=g.index, uuid=g.uuid, model_name=g.model_name, values=g.values, lost=g.lost)
    if g.summary is not None:
        sample.summary_scrapes = g.summary.scrapes
        sample.summary_min.extend(g.summary.minimum)
        sample.summary_max.extend(g.summary.maximum)
        sample.summary_mean.extend(g.summary.mean)
    return sample


def _summary(g: pb.GpuSample) -> StepSummary | None:
    """The GPU's step summary, or None (summary_scrapes 0 and no arrays); WireError when malformed."""
    if g.summary_scrapes == 0:
        if len(g.summary_min) or len(g.summary_max) or len(g.summary_mean):
            raise WireError(f"gpu {g.index}: summary arrays without summary_scrapes")
        return None
    summary = StepSummary(
        g.summary_scrapes, tuple(g.summary_min), tuple(g.summary_max), tuple(g.summary_mean)
    )
    problem = summary.check()
    if problem is not None:
        raise WireError(f"gpu {g.index}: malformed step summary: {problem}")
    return summary


def _checked(scope: Scope, values: tuple[float, ...], what: str) -> tuple[float, ...]:
    expected = len(metrics_for(scope))
    if len(values) != expected:
        raise WireError(f"{what}: {len(values)} values, the {scope.value} schema has {expected}")
    return values


# A collector that reads no host metrics (or has no self-metrics of faultcast's collector) sends
# none rather than a row of NaN: an empty array is "nothing read", the same as all NaN.
_NONE_READ = {scope: (math.nan,) * len(metrics_for(scope)) for scope in (Scope.HOST, Scope.COLLECTOR)}


def _checked_or_none(scope: Scope, values: tuple[float, ...], what: str) -> tuple[float, ...]:
    return _NONE_READ[scope] if not values else _checked(scope, values, what)


# The windows a collector may claim (window_s > 0): no scrape loop runs faster than a millisecond,
# and a day is far beyond any step a model scores on. Outside them the number is garbage, and a
# window of 1e-300 s overflowed the service's window arithmetic.
MIN_WINDOW_S = 1e-3
MAX_WINDOW_S = 86_400.0


def window_problem(window_s: float) -> str | None:
    """Why `window_s` is no window a collector can have closed, or None (0: a single scrape)."""
    if window_s == 0:
        return None
    if not math.isfinite(window_s):
        return f"window_s {window_s} is not a finite length of time (0: a single scrape)"
    if window_s < 0:
        return f"window_s {window_s} is negative (0: a single scrape, no window)"
    if window_s < MIN_WINDOW_S:
        return f"window_s {window_s!r} is below {MIN_WINDOW_S} s, shorter than any scrape loop"
    if window_s > MAX_WINDOW_S:
        return f"window_s {window_s!r} is above {MAX_WINDOW_S:.0f} s (a day)"
    return None


def from_proto(sample: pb.NodeSample, *, spool_id: int = 0) -> NodeSnapshot:
    """Decode a sample (from the stream of `spool_id`); raises WireError when it does not match this
    catalogue, or when a step summary is malformed (StepSummary.check) or window_s is no window
    (window_problem). Empty host_values or collector_values mean nothing read (NaN for each metric)."""
    if sample.schema_hash != SCHEMA_HASH:
        raise WireError(
            f"schema hash {sample.schema_hash:#018x} differs from this catalogue's {SCHEMA_HASH:#018x}"
        )
    problem = window_problem(sample.window_s)
    if problem is not None:
        raise WireError(problem)
    devices = []
    for d in sample.devices:
        scope = _FROM_PB.get(int(d.scope))
        if scope is None or scope in (Scope.GPU, Scope.HOST, Scope.COLLECTOR):
            raise WireError(f"device {d.device!r} has scope {d.scope}, not a network device scope")
        devices.append(
            DeviceReading(scope, d.device, _checked(scope, tuple(d.values), f"device {d.device!r}"))
        )
    return NodeSnapshot(
        node=sample.node,
        time_unix_nano=sample.time_unix_nano,
        sequence=sample.sequence,
        gpus=tuple(
            GpuReading(
                g.index,
                g.uuid,
                g.model_name,
                _checked(Scope.GPU, tuple(g.values), f"gpu {g.index}"),
                g.lost,
                summary=_summary(g),
            )
            for g in sample.gpus
        ),
        devices=tuple(devices),
        host=_checked_or_none(Scope.HOST, tuple(sample.host_values), "host values"),
        collector=_checked_or_none(Scope.COLLECTOR, tuple(sample.collector_values), "collector values"),
        window_s=sample.window_s,
        spool_id=spool_id,
    )
