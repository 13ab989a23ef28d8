"""The service's telemetry endpoint: validates pushed samples, drops duplicates, acknowledges.

A thin servicer over plain functions (gRPC Python examples convention). What happens to an
accepted sample is the sink's business: the scoring pipeline, or a list in a test.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from faultcast import wire
from faultcast.catalogue import SCHEMA_HASH
from faultcast.readings import NodeSnapshot
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Sink = Callable[[NodeSnapshot], None]


class TelemetryServicer(pb_grpc.TelemetryServicer):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.rejects: Counter[str] = Counter()  # by reason
        self.duplicates = 0
        # Highest sequence stored per (node, spool id): what makes a replay after an outage exact.
        self._last: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        # One lock per (node, spool): check, store and advance happen together even when an old
        # stream of the same collector is still draining during its reconnect.
        self._key_locks: dict[tuple[str, int], threading.Lock] = {}

    def Push(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[pb.PushRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.PushAck]:
        first = next(request_iterator, None)
        if first is None:
            return
        if not first.HasField("hello"):
            self.rejects["no_hello"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a push stream must start with a PushHello")
        hello = first.hello
        if hello.schema.schema_hash != SCHEMA_HASH:
            self.rejects["schema_mismatch"] += 1
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"collector schema {hello.schema.schema_hash:#018x} "
                f"(catalogue {hello.schema.catalogue_version!r}) differs from the service's "
                f"{SCHEMA_HASH:#018x}; upgrade one side",
            )
        key = (hello.node, hello.spool_id)
        for request in request_iterator:
            if not request.HasField("sample"):
                self.rejects["repeated_hello"] += 1
                continue
            rejection = self._accept(key, request.sample)
            acked = self._last.get(key, 0)
            yield pb.PushAck(acked_through=acked, rejections=[rejection] if rejection else [])

    def _accept(self, key: tuple[str, int], sample: pb.NodeSample) -> pb.Rejection | None:
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            last = self._last.get(key, 0)
            if sample.sequence <= last and sample.sequence != 0:
                self.duplicates += 1
                return None
            reason = ""
            if sample.sequence == 0:
                reason = "sequence 0: collectors number samples from 1"
                self.rejects["no_sequence"] += 1
            elif sample.node != key[0]:
                reason = f"sample names node {sample.node!r} on a stream opened by {key[0]!r}"
                self.rejects["wrong_node"] += 1
            else:
                try:
                    snapshot = wire.from_proto(sample)
                except wire.WireError as exc:
                    reason = str(exc)
                    self.rejects["malformed"] += 1
                else:
                    self.sink(snapshot)
            # A rejected sample is acked too: resending cannot fix it.
            self._last[key] = max(last, sample.sequence)
        if reason:
            log.warning("rejected sample %d from %s: %s", sample.sequence, key[0], reason)
            return pb.Rejection(sequence=sample.sequence, reason=reason)
        return None


def create_server(
    servicer: pb_grpc.TelemetryServicer, address: str = "127.0.0.1:0", *, max_workers: int = 16
) -> tuple[grpc.Server, int]:
    """A started server with the telemetry service; returns it and the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    pb_grpc.add_TelemetryServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the telemetry service to {address}")
    server.start()
    return server, port
