from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest

from faultcast import wire
from faultcast.catalogue import SCHEMA_HASH
from faultcast.readings import NodeSnapshot
from faultcast.sim.realtime import SimulatedSource
from faultcast.v1 import telemetry_pb2 as pb


def _snapshot() -> NodeSnapshot:
    reading = SimulatedSource(gpus=4, seed=3, start_unix_nano=1_700_000_000_000_000_000).read()
    return dataclasses.replace(
        NodeSnapshot.merge("n1", 0, [reading], {"scrape_duration_seconds": 0.01}), sequence=7
    )


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True)
    )


def test_a_snapshot_survives_the_wire() -> None:
    original = _snapshot()
    decoded = wire.from_proto(
        type(wire.to_proto(original)).FromString(wire.to_proto(original).SerializeToString())
    )
    assert decoded.sequence == 7
    assert decoded.node == "n1"
    assert decoded.time_unix_nano == original.time_unix_nano
    assert [(g.index, g.uuid, g.model_name, g.lost) for g in decoded.gpus] == [
        (g.index, g.uuid, g.model_name, g.lost) for g in original.gpus
    ]
    assert all(_same(a.values, b.values) for a, b in zip(decoded.gpus, original.gpus, strict=True))
    assert [(d.scope, d.device) for d in decoded.devices] == [(d.scope, d.device) for d in original.devices]
    assert _same(decoded.host, original.host)
    assert _same(decoded.collector, original.collector)


def test_a_sample_from_another_schema_is_refused_with_the_reason() -> None:
    sample = wire.to_proto(_snapshot())
    sample.schema_hash ^= 1
    with pytest.raises(wire.WireError, match="schema hash"):
        wire.from_proto(sample)


def test_a_short_value_array_is_refused_with_the_reason() -> None:
    sample = wire.to_proto(_snapshot())
    del sample.gpus[2].values[-3:]
    with pytest.raises(wire.WireError, match="gpu 2"):
        wire.from_proto(sample)


def test_the_schema_hash_is_computed_from_the_published_schema_as_proto_readme_says() -> None:
    """SHA-256 of "scope:name:kind" lines, scopes as GetSchema lists them, first 8 bytes big-endian:
    what a collector in another language computes from GetSchema alone."""
    published = wire.described_schema()
    lines = [
        f"{pb.Scope.Name(scope.scope).removeprefix('SCOPE_').lower()}:{d.name}:"
        f"{pb.MetricKind.Name(d.kind).removeprefix('METRIC_KIND_').lower()}"
        for scope in published.scopes
        for d in scope.descriptions
    ]
    digest = hashlib.sha256("\n".join(lines).encode()).digest()
    assert int.from_bytes(digest[:8], "big") == published.schema_hash == SCHEMA_HASH
    assert [list(s.metrics) for s in published.scopes] == [
        [d.name for d in s.descriptions] for s in published.scopes
    ]
    assert wire.schema().scopes[0].descriptions == []  # the hello's schema stays small
