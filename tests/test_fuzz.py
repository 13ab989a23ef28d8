"""Property-based fuzzing (hypothesis) of what untrusted collectors send: the protobuf decoding, the
ingest validation and the streaming features. Whatever arrives, nothing crashes: a sample is
decoded or refused with a WireError, validated or refused with a reason, and a value the validation
keeps is the value that was sent; the features built from whatever passes are never infinite."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from faultcast.catalogue import Kind, Scope, metrics_for
from faultcast.model.features.engine import FeatureConfig
from faultcast.model.features.online import LateSample, OnlineFeatures
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot
from faultcast.service.rpc.validation import MAX_MAGNITUDE, Limits, SampleRejected, check
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.wire import WireError, from_proto, to_proto

NOW_S = 1_767_571_200.0
GPUS = 8
WHOLE_SAMPLE_REASONS = {"bad_node_name", "unknown_node", "future_timestamp", "stale_timestamp"}
VALUE_REASONS = {
    "non_finite_value", "implausible_value", "negative_counter", "gpu_index_out_of_range", "duplicate_gpu_index",
    "duplicate_device",
}  # fmt: skip
COUNTERS = {scope: [m.kind is Kind.COUNTER for m in metrics_for(scope)] for scope in Scope}

# Values a collector might send: ordinary readings, the edges of float, NaN and infinities, and
# huge or negative numbers where counters belong.
values = st.one_of(
    st.floats(min_value=-1e3, max_value=1e4),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e308, -1e308, 2.0**64, 5e-324, math.nan, math.inf, -math.inf]),
)


def _spread(size: int, everywhere: float, changes: list[tuple[int, float]]) -> tuple[float, ...]:
    row = [everywhere] * size
    for position, value in changes:
        row[position] = value
    return tuple(row)


def row(scope: Scope) -> st.SearchStrategy[tuple[float, ...]]:
    """The values of one reading: one value everywhere, then up to six positions set to others, so
    any value lands at any position (counter or gauge) next to any other. Not 67 independent draws per
    GPU: eleven GPUs of those, at about 10 bytes of hypothesis's entropy per float, overran its 8 KiB
    budget for one example often enough to fail its `data_too_large` health check (and a stream of
    twelve samples nearly always did)."""
    n = len(metrics_for(scope))
    changes = st.lists(st.tuples(st.integers(min_value=0, max_value=n - 1), values), max_size=6)
    return st.builds(_spread, st.just(n), values, changes)


gpu_readings = st.builds(
    GpuReading,
    index=st.integers(min_value=-2, max_value=GPUS + 2),
    uuid=st.sampled_from(["GPU-a", "GPU-b", "GPU-c", ""]),
    model_name=st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ""]),
    values=row(Scope.GPU),
    lost=st.booleans(),
)
device_readings = st.sampled_from([Scope.IB_PORT, Scope.INTERFACE, Scope.PEER]).flatmap(
    lambda scope: st.builds(
        DeviceReading,
        scope=st.just(scope),
        device=st.sampled_from(["mlx5_0:1", "eth0", "peer-a"]),
        values=row(scope),
    )
)
node_names = st.one_of(st.sampled_from(["node-0000", "node-0001"]), st.text(max_size=300))


@st.composite
def snapshots(
    draw: st.DrawFn, names: st.SearchStrategy[str] = node_names, earliest_s: float = -8 * 3600.0
) -> NodeSnapshot:
    offset_s = draw(st.one_of(st.floats(min_value=earliest_s, max_value=600), st.just(0.0)))
    return NodeSnapshot(
        node=draw(names),
        time_unix_nano=max(0, int((NOW_S + offset_s) * 1e9)),
        sequence=draw(st.integers(min_value=0, max_value=2**63 - 1)),
        gpus=tuple(draw(st.lists(gpu_readings, max_size=GPUS + 3))),
        devices=tuple(draw(st.lists(device_readings, max_size=4))),
        host=draw(row(Scope.HOST)),
        collector=draw(row(Scope.COLLECTOR)),
    )


def kept_or_blanked(sent: tuple[float, ...], kept: tuple[float, ...], scope: Scope) -> int:
    """Every value is either kept as sent or blanked for a reason; returns how many were blanked."""
    blanked = 0
    for v, k, counter in zip(sent, kept, COUNTERS[scope], strict=True):
        bad = math.isinf(v) or abs(v) > MAX_MAGNITUDE or (counter and v < 0)
        if bad:
            assert math.isnan(k)
            blanked += 1
        else:
            assert k == v or (math.isnan(k) and math.isnan(v))
    return blanked


@given(snapshots())
def test_validation_refuses_a_sample_with_a_reason_or_keeps_every_good_value(sample: NodeSnapshot) -> None:
    try:
        cleaned, issues = check(sample, NOW_S, Limits(gpus_per_node=GPUS, nodes=frozenset()))
    except SampleRejected as exc:
        refused: SampleRejected | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.reason in WHOLE_SAMPLE_REASONS
        assert str(refused)
        return
    assert set(issues) <= VALUE_REASONS
    indexes = [g.index for g in cleaned.gpus]
    assert len(indexes) == len(set(indexes))
    assert all(0 <= i < GPUS for i in indexes)
    dropped = issues["gpu_index_out_of_range"] + issues["duplicate_gpu_index"]
    assert len(sample.gpus) - len(cleaned.gpus) == dropped
    # The first reading of each valid index is the one kept.
    first: dict[int, GpuReading] = {}
    for g in sample.gpus:
        if 0 <= g.index < GPUS:
            first.setdefault(g.index, g)
    blanked = 0
    for g in cleaned.gpus:
        assert g.uuid == first[g.index].uuid
        blanked += kept_or_blanked(first[g.index].values, g.values, Scope.GPU)
    blanked += kept_or_blanked(sample.host, cleaned.host, Scope.HOST)
    devices = {(d.scope, d.device): d for d in reversed(sample.devices)}  # the first of each wins
    assert len(sample.devices) - len(cleaned.devices) == issues["duplicate_device"]
    for d in cleaned.devices:
        blanked += kept_or_blanked(devices[(d.scope, d.device)].values, d.values, d.scope)
    assert issues["non_finite_value"] + issues["implausible_value"] + issues["negative_counter"] == blanked


@given(st.binary(max_size=4000))
def test_arbitrary_bytes_decode_to_a_sample_or_fail_with_a_reason(data: bytes) -> None:
    try:
        message = pb.NodeSample.FromString(data)
    except DecodeError:
        return
    try:
        decoded = from_proto(message)
    except WireError as exc:
        decoded, error = None, str(exc)
    if decoded is None:
        assert error  # says what does not fit
        return
    assert decoded.node == message.node


@given(snapshots(), st.integers(min_value=-3, max_value=3), st.sampled_from(["gpu", "host", "device"]))
def test_a_sample_with_the_wrong_number_of_values_is_refused_and_a_right_one_round_trips(
    sample: NodeSnapshot, extra: int, where: str
) -> None:
    # The wire's GPU index is unsigned: a negative one cannot be sent (validation still refuses one).
    sample = replace(sample, gpus=tuple(g for g in sample.gpus if g.index >= 0))
    message = to_proto(sample)
    decoded = from_proto(message)
    assert decoded.node == sample.node
    assert decoded.time_unix_nano == sample.time_unix_nano
    for a, b in zip(decoded.gpus, sample.gpus, strict=True):
        assert a.index == b.index
        assert np.array_equal(np.array(a.values), np.array(b.values), equal_nan=True)
    if extra == 0:
        return
    if where == "gpu" and message.gpus:
        target = message.gpus[0].values
    elif where == "device" and message.devices:
        target = message.devices[0].values
    else:
        target, where = message.host_values, "host"
    if extra > 0:
        target.extend([1.0] * extra)
    else:
        del target[extra:]
    if where == "host" and not len(target):  # none sent: none read (proto/README.md)
        assert all(math.isnan(v) for v in from_proto(message).host)
        return
    with pytest.raises(WireError, match="values"):
        from_proto(message)


# How many examples, the deadline and the health checks come from the hypothesis profile in force
# (tests/conftest.py); a stream of up to 12 samples costs several single samples: 2 in 5 of its examples.
@settings(max_examples=max(1, settings().max_examples * 2 // 5))
@given(
    st.lists(
        st.tuples(
            snapshots(st.sampled_from(["node-0000", "node-0001"]), earliest_s=-1200.0),
            st.integers(min_value=-2, max_value=3),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_features_from_whatever_passes_validation_are_never_infinite(
    stream: list[tuple[NodeSnapshot, int]],
) -> None:
    """A stream of samples from two nodes, in any order, with duplicates, resets (counters going
    down), missing GPUs and wild values, through validation into the online features."""
    config = FeatureConfig(cadence_s=60.0, windows_s=(300.0, 900.0), gpus_per_node=GPUS)
    online = OnlineFeatures(config, ["node-0000", "node-0001"], NOW_S - 3600)
    limits = Limits(gpus_per_node=GPUS, max_future_s=0, max_age_s=0)
    refused: Counter[str] = Counter()
    steps = []
    for sample, minutes in stream:
        # Spread the samples over the grid, sometimes back in time (reordering).
        shifted = replace(sample, time_unix_nano=sample.time_unix_nano + minutes * 60 * 10**9)
        try:
            cleaned, _ = check(shifted, NOW_S, limits)
            steps += online.add(cleaned)
        except SampleRejected as exc:
            refused[exc.reason] += 1
        except LateSample:
            refused["late"] += 1
    steps += online.flush()
    for step in steps:
        assert not np.isinf(step.features).any(), [
            online.engine.names[i] for i in np.nonzero(np.isinf(step.features).any(axis=0))[0]
        ]
