"""Pushing samples to a service: one node's snapshots over one Push stream.

Used by the demo, the benchmark's load generator and the tests; collectors in production use the
spooling `Shipper` instead (it survives outages; this does not need to).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import grpc

from faultcast import wire
from faultcast.readings import NodeSnapshot
from faultcast.sim.live import TwinExhausted, TwinSource
from faultcast.v1 import telemetry_pb2 as tpb
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc


def twin_snapshots(
    source: TwinSource, name: str, count: int, first_sequence: int = 1
) -> Iterator[NodeSnapshot]:
    """`count` numbered snapshots of the twin node (fewer when its horizon ends)."""
    for i in range(count):
        try:
            reading = source.read()
        except TwinExhausted:
            return
        snapshot = NodeSnapshot.merge(name, reading.time_unix_nano or 0, [reading], {})
        yield replace(snapshot, sequence=first_sequence + i)


def push(
    channel: grpc.Channel, node: str, snapshots: Iterable[NodeSnapshot], *, spool_id: int = 1
) -> list[tpb.PushAck]:
    """Push the snapshots over one stream and return the service's acks (one per sample)."""

    def requests() -> Iterator[tpb.PushRequest]:
        yield wire.hello(node, spool_id)
        for snapshot in snapshots:
            yield tpb.PushRequest(sample=wire.to_proto(snapshot))

    return list(tpb_grpc.TelemetryStub(channel).Push(requests()))
