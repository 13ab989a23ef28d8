"""Checks on one decoded sample before it reaches the features.

A sample is refused whole only when nothing in it can be trusted (its node or its time) or when it is
bigger than any real node's (a label or a device list past its bound, see `Limits`: what is taken is
journalled, and one caller must not fill the service's disk); a bad value
inside it (an infinity, a magnitude beyond any real reading, a negative counter, a GPU index the
model has no slot for) is blanked, counted by reason, and the rest of the sample is kept; a GPU's
step summary loses its entries for the metrics blanked (and entries that are bad themselves). NaN is
not an error: it is how collectors say a metric could not be read, and the model has features for
exactly that.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from faultcast.catalogue import Kind, Scope, metrics_for
from faultcast.readings import DeviceReading, GpuReading, NodeSnapshot
from faultcast.step_summary import StepSummary


class SampleRejected(ValueError):  # noqa: N818 (a reason for a reject counter, not a bug)
    """The whole sample is refused; `reason` labels the reject counter, the text says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


MAX_NODE_NAME = 253  # a DNS name
# NVML's buffers for a GPU's UUID and its name are 96 bytes (NVML_DEVICE_UUID_V2_BUFFER_SIZE,
# NVML_DEVICE_NAME_V2_BUFFER_SIZE), and DCGM's are no longer: well past either.
MAX_GPU_LABEL = 256
# A device is an interface (IFNAMSIZ, 16), an InfiniBand port ("mlx5_0:1") or a peer ("node-b:22": a
# host name and a port).
MAX_DEVICE_NAME = MAX_NODE_NAME + 16
# Interfaces, InfiniBand ports and probed peers of one node: a few dozen on the largest hosts.
MAX_DEVICES = 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Which samples are taken: GPUs per node, clock skew, age, node names (the fleet's
    inventory when given)."""

    gpus_per_node: int = 8
    # Event time may run ahead of the service's clock by this much (clock skew); 0 turns the check
    # off (the fleet twin at accelerated time runs far ahead on purpose).
    max_future_s: float = 300.0
    # Samples older than this are history, not telemetry: refused (0: no limit).
    max_age_s: float = 6 * 3600.0
    max_node_name: int = MAX_NODE_NAME
    # The fleet's inventory: samples from any other node are refused ("unknown_node"). Empty: any
    # well-formed name is taken (up to the service's --max-nodes).
    nodes: frozenset[str] = frozenset()
    # A sample with a GPU's UUID or name, or a device's name, longer than these (characters), or more
    # devices than `max_devices`, is refused whole ("oversize_field").
    max_gpu_label: int = MAX_GPU_LABEL
    max_device_name: int = MAX_DEVICE_NAME
    max_devices: int = MAX_DEVICES


# Above any reading NVML, sysfs or a 64-bit counter can produce (2**64 is 1.8e19): such a value is
# garbage, and squaring it in a window's variance would overflow to infinity.
MAX_MAGNITUDE = 1e20

_COUNTERS = {scope: tuple(m.kind is Kind.COUNTER for m in metrics_for(scope)) for scope in Scope}


def _clean(values: tuple[float, ...], scope: Scope, issues: Counter[str]) -> tuple[float, ...]:
    counters = _COUNTERS[scope]
    out: list[float] | None = None  # copied on the first bad value: most samples have none
    for i, v in enumerate(values):
        if math.isinf(v):
            issues["non_finite_value"] += 1
        elif abs(v) > MAX_MAGNITUDE:
            issues["implausible_value"] += 1
        elif counters[i] and v < 0:
            issues["negative_counter"] += 1
        else:
            continue
        if out is None:
            out = list(values)
        out[i] = math.nan
    return values if out is None else tuple(out)


def _clean_gpu(gpu: GpuReading, issues: Counter[str]) -> GpuReading:
    """The GPU with bad values blanked, and its step summary's entries for those metrics too (what is
    blanked in the values must not live on in the summary); a summary entry that is itself infinite
    or beyond MAX_MAGNITUDE is blanked (min, max and mean together) and counted the same way."""
    values = _clean(gpu.values, Scope.GPU, issues)
    summary = gpu.summary
    if summary is None:
        return gpu if values is gpu.values else replace(gpu, values=values)
    stats = np.array((summary.minimum, summary.maximum, summary.mean), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = (np.abs(stats) > MAX_MAGNITUDE).any(axis=0)  # inf included; NaN is not bad
    if bad.any():
        issues["non_finite_value"] += int(np.isinf(stats).any(axis=0).sum())
        issues["implausible_value"] += int((bad & ~np.isinf(stats).any(axis=0)).sum())
    if values is not gpu.values:
        bad |= np.isnan(np.asarray(values)) & ~np.isnan(np.asarray(gpu.values))
    if bad.any():
        stats[:, bad] = math.nan
        lo, hi, mean = (tuple(row.tolist()) for row in stats)
        summary = StepSummary(summary.scrapes, lo, hi, mean)
    elif values is gpu.values:
        return gpu
    return replace(gpu, values=values, summary=summary)


def is_host_name(name: str, max_length: int = MAX_NODE_NAME) -> bool:
    """Whether `name` can name a node: non-empty, printable, no spaces, at most `max_length` long."""
    return bool(name) and len(name) <= max_length and name.isprintable() and " " not in name


def check(snapshot: NodeSnapshot, now_s: float, limits: Limits) -> tuple[NodeSnapshot, Counter[str]]:
    """The sample with bad values blanked, and what was blanked by reason; raises SampleRejected
    when the whole sample is unusable."""
    node = snapshot.node
    if not is_host_name(node, limits.max_node_name):
        raise SampleRejected("bad_node_name", f"node name {node[:80]!r} is not a host name")
    if limits.nodes and node not in limits.nodes:
        raise SampleRejected(
            "unknown_node", f"node {node!r} is not in the service's node inventory (--nodes-file)"
        )
    t = snapshot.time_unix_nano / 1e9
    if limits.max_future_s > 0 and t > now_s + limits.max_future_s:
        raise SampleRejected(
            "future_timestamp",
            f"sample from {node} is {t - now_s:.0f} s ahead of the service's clock "
            f"(limit {limits.max_future_s:.0f} s): check the node's clock (NTP)",
        )
    if limits.max_age_s > 0 and t < now_s - limits.max_age_s:
        raise SampleRejected(
            "stale_timestamp", f"sample from {node} is {now_s - t:.0f} s old (limit {limits.max_age_s:.0f} s)"
        )
    _check_sizes(snapshot, limits)
    issues: Counter[str] = Counter()
    gpus: list[GpuReading] = []
    seen: set[int] = set()
    for gpu in snapshot.gpus:
        if not 0 <= gpu.index < limits.gpus_per_node:
            issues["gpu_index_out_of_range"] += 1
            continue
        if gpu.index in seen:
            issues["duplicate_gpu_index"] += 1
            continue
        seen.add(gpu.index)
        gpus.append(_clean_gpu(gpu, issues))
    devices = []
    # Duplicates go first, so what is counted as blanked is only what is kept.
    for d in _dedupe(list(snapshot.devices), issues):
        values = _clean(d.values, d.scope, issues)
        devices.append(d if values is d.values else replace(d, values=values))
    host = _clean(snapshot.host, Scope.HOST, issues)
    if not issues:
        return snapshot, issues
    cleaned = replace(snapshot, gpus=tuple(gpus), devices=tuple(devices), host=host)
    return cleaned, issues


def _check_sizes(snapshot: NodeSnapshot, limits: Limits) -> None:
    """SampleRejected("oversize_field") for a label or a device list no real node has."""

    def refuse(what: str, size: int, limit: int) -> SampleRejected:
        return SampleRejected(
            "oversize_field", f"sample from {snapshot.node}: {what} is {size} long (limit {limit})"
        )

    for gpu in snapshot.gpus:
        for what, text in (("UUID", gpu.uuid), ("model name", gpu.model_name)):
            if len(text) > limits.max_gpu_label:
                raise refuse(f"GPU {gpu.index}'s {what}", len(text), limits.max_gpu_label)
    if len(snapshot.devices) > limits.max_devices:
        raise refuse("its device list", len(snapshot.devices), limits.max_devices)
    for d in snapshot.devices:
        if len(d.device) > limits.max_device_name:
            raise refuse(f"the name of a {d.scope.value} device", len(d.device), limits.max_device_name)


def _dedupe(devices: list[DeviceReading], issues: Counter[str]) -> list[DeviceReading]:
    out, seen = [], set()
    for d in devices:
        if (d.scope, d.device) in seen:
            issues["duplicate_device"] += 1
            continue
        seen.add((d.scope, d.device))
        out.append(d)
    return out
