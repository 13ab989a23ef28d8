"""The service's telemetry endpoint: validates pushed samples, drops duplicates, acknowledges.

A thin servicer over plain functions (gRPC Python examples convention). What happens to an
accepted sample is the sink's business: the scoring pipeline, or a list in a test. A sink may refuse
a sample by raising `SampleRejected`; that is counted by reason and acked like any other rejection.
Any other exception from the sink (a bug, or a sample no check foresaw) rejects that one sample as
"scoring_error", logged with its traceback, and the stream goes on: it never ends a collector's stream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Protocol

import grpc

from faultcast import wire
from faultcast.catalogue import SCHEMA_HASH
from faultcast.readings import NodeSnapshot
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.rpc.auth import AccessPolicy, AuthError, current, refuse
from faultcast.service.rpc.limits import CallerLimits, OpenCount, TokenBucket
from faultcast.service.rpc.validation import Limits, SampleRejected, check
from faultcast.service.state.cursors import SPOOLS_PER_NODE
from faultcast.service.state.db import MAX_STORED_INT
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Sink = Callable[[NodeSnapshot], None]


class StreamWatch(Protocol):
    """Hears each node's Push streams open and end (service/failure_watch.py)."""

    def stream_opened(self, node: str) -> None: ...

    def stream_ended(self, node: str, *, goodbye: bool) -> None: ...


class TelemetryServicer(pb_grpc.TelemetryServicer):
    """The Push stream's logic, synchronous: validates samples, drops replays by (node, spool
    id, sequence) cursor, hands the rest to `sink`, and acknowledges by sequence."""

    def __init__(
        self,
        sink: Sink,
        *,
        limits: Limits | None = None,
        metrics: ServiceMetrics | None = None,
        cursors: dict[tuple[str, int], int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`limits`: check every sample (without, only the schema is checked); `cursors`: the
        highest sequence already taken per (node, spool id), from a previous run."""
        self.sink, self.limits, self.metrics, self.clock = sink, limits, metrics, clock
        self.rejects: Counter[str] = Counter()  # whole samples refused, by reason
        self.blanked: Counter[str] = Counter()  # single values blanked inside kept samples, by reason
        self.duplicates = 0
        # Highest sequence stored per (node, spool id): what makes a replay after an outage exact.
        self._last: dict[tuple[str, int], int] = dict(cursors or {})
        self._lock = threading.Lock()
        # One lock per (node, spool): check, store and advance happen together even when an old
        # stream of the same collector is still draining during its reconnect.
        self._key_locks: dict[tuple[str, int], threading.Lock] = {}
        # Each node's spool ids, least recently opened first: at most SPOOLS_PER_NODE are kept.
        self._spools: dict[str, OrderedDict[int, None]] = {}
        for node, spool in self._last:
            self._spools.setdefault(node, OrderedDict())[spool] = None
        self.spools_forgotten = 0
        self._failures_traced: set[type[Exception]] = set()  # sink failures logged with a traceback

    def Push(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[pb.PushRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.PushAck]:
        """Take one collector's stream of samples; acknowledge each accepted or replayed sequence."""
        first = next(request_iterator, None)
        if first is None:
            return
        key, refusal = self.open_stream(first)
        if refusal is not None:
            context.abort(*refusal)
        for request in request_iterator:
            if request.HasField("goodbye"):
                return
            yield self.take(key, request)

    def GetSchema(  # noqa: N802 (gRPC method name)
        self, request: pb.GetSchemaRequest, context: grpc.ServicerContext
    ) -> pb.MetricSchema:
        """Every scope's metrics in wire order, described: what a collector sends its hello with."""
        return wire.described_schema()

    def open_stream(
        self, first: pb.PushRequest
    ) -> tuple[tuple[str, int], tuple[grpc.StatusCode, str] | None]:
        """The stream's (node, spool id) from its first message, or the status that refuses it."""
        if not first.HasField("hello"):
            self._reject("no_hello")
            return ("", 0), (grpc.StatusCode.INVALID_ARGUMENT, "a push stream must start with a PushHello")
        hello = first.hello
        if hello.schema.schema_hash != SCHEMA_HASH:
            self._reject("schema_mismatch")
            return ("", 0), (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"collector schema {hello.schema.schema_hash:#018x} "
                f"(catalogue {hello.schema.catalogue_version!r}) differs from the service's "
                f"{SCHEMA_HASH:#018x}; upgrade one side",
            )
        mismatch = _scopes_differ(hello.schema)
        if mismatch:
            self._reject("schema_mismatch")
            return ("", 0), (
                grpc.StatusCode.FAILED_PRECONDITION,
                f"collector schema {hello.schema.schema_hash:#018x} has this service's hash but other "
                f"scopes: {mismatch}; send the scopes exactly as Telemetry/GetSchema returns them",
            )
        # Every uint64 is a spool id: the cursors' store maps ids from 2^63 up to its signed integers.
        key = (hello.node, hello.spool_id)
        self._remember_spool(key)
        return key, None

    def _remember_spool(self, key: tuple[str, int]) -> None:
        """Keep the node's SPOOLS_PER_NODE most recently opened spools: a caller opening streams
        with fresh spool ids forgets the oldest (whose replay, should it ever come, may then be
        taken twice), instead of growing the cursors without bound."""
        node, spool = key
        with self._lock:
            spools = self._spools.setdefault(node, OrderedDict())
            spools[spool] = None
            spools.move_to_end(spool)
            while len(spools) > SPOOLS_PER_NODE:
                oldest, _ = spools.popitem(last=False)
                self._last.pop((node, oldest), None)
                self._key_locks.pop((node, oldest), None)
                self.spools_forgotten += 1
                if self.metrics is not None:
                    self.metrics.throttled.labels("spool_ids").inc()
                log.warning(
                    "node %s opened streams with more than %d spool ids; forgot the cursor of its oldest (%d)",
                    node,
                    SPOOLS_PER_NODE,
                    oldest,
                )

    def take(self, key: tuple[str, int], request: pb.PushRequest) -> pb.PushAck:
        """One message of an open stream: the sample taken (or refused, or a duplicate) and acked."""
        if not request.HasField("sample"):
            self._reject("repeated_hello")
            return pb.PushAck(acked_through=self._last.get(key, 0))
        rejection = self._accept(key, request.sample)
        return pb.PushAck(acked_through=self._last.get(key, 0), rejections=[rejection] if rejection else [])

    def cursors(self) -> dict[tuple[str, int], int]:
        """The highest sequence taken per (node, spool id): what a restart must remember."""
        with self._lock:
            return dict(self._last)

    def advance(self, taken: dict[tuple[str, int], int]) -> None:
        """Samples taken before a restart that the saved cursors do not cover (the journal holds
        them): their replay by a collector is a duplicate."""
        for key, sequence in taken.items():
            self._remember_spool(key)
            with self._lock:
                self._last[key] = max(self._last.get(key, 0), sequence)

    def _reject(self, reason: str) -> None:
        self.rejects[reason] += 1
        if self.metrics is not None:
            self.metrics.rejects.labels(reason).inc()

    def _accept(self, key: tuple[str, int], sample: pb.NodeSample) -> pb.Rejection | None:
        if key not in self._last:  # a stream whose spool was forgotten while it stayed open
            self._remember_spool(key)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            last = self._last.get(key, 0)
            if sample.sequence <= last and sample.sequence != 0:
                self.duplicates += 1
                if self.metrics is not None:
                    self.metrics.duplicates.inc()
                return None
            reason = message = ""
            if sample.sequence == 0:
                reason, message = "no_sequence", "sequence 0: collectors number samples from 1"
            elif sample.sequence > MAX_STORED_INT:
                # Refused and not acked: a cursor this high would make every later sample a duplicate.
                self._reject("malformed")
                log.warning("rejected sample %d from %s: sequence above 2^63-1", sample.sequence, key[0])
                return pb.Rejection(sequence=sample.sequence, reason="sequence above 2^63-1")
            elif sample.node != key[0]:
                reason, message = (
                    "wrong_node",
                    f"sample names node {sample.node!r} on a stream opened by {key[0]!r}",
                )
            else:
                try:
                    self._take(wire.from_proto(sample, spool_id=key[1]))
                except wire.WireError as exc:
                    reason, message = "malformed", str(exc)
                except SampleRejected as exc:
                    reason, message = exc.reason, str(exc)
                except Exception as exc:  # the sink's failure is this sample's, not the stream's
                    reason, message = (
                        "scoring_error",
                        f"the service failed on this sample ({type(exc).__name__})",
                    )
                    self._log_failure(sample.sequence, key[0], exc)
            if reason:
                self._reject(reason)
            # A rejected sample is acked too: resending cannot fix it.
            with self._lock:
                self._last[key] = max(last, sample.sequence)
        if reason:
            if reason != "scoring_error":  # logged already, with what failed
                log.warning("rejected sample %d from %s: %s", sample.sequence, key[0], message)
            return pb.Rejection(sequence=sample.sequence, reason=message)
        return None

    def _log_failure(self, sequence: int, node: str, exc: Exception) -> None:
        """One line per failed sample; the traceback with the first failure of each kind (a sample
        that fails will often fail again on every Push: the log keeps one traceback of it)."""
        first = type(exc) not in self._failures_traced
        self._failures_traced.add(type(exc))
        log.error(
            "rejected sample %d from %r: the sink failed on it (%r); the stream goes on%s",
            sequence,
            node,
            exc,
            " (later failures of this kind are logged without the traceback)" if first else "",
            exc_info=True if first else None,  # False would still set the record's exc_info
        )

    def _take(self, snapshot: NodeSnapshot) -> None:
        now = self.clock()
        if self.limits is not None:
            snapshot, blanked = check(snapshot, now, self.limits)
            if blanked:
                self.blanked.update(blanked)
                if self.metrics is not None:
                    for why, count in blanked.items():
                        self.metrics.blanked.labels(why).inc(count)
        self.sink(snapshot)
        if self.metrics is not None:
            self.metrics.node_samples.inc()
            self.metrics.samples.inc(len(snapshot.gpus))
            # A node clock running ahead would make the lag negative: it shows as its own gauge.
            behind = now - snapshot.time_unix_nano / 1e9
            self.metrics.ingest_lag.labels(snapshot.node).set(max(0.0, behind))
            self.metrics.clock_ahead.labels(snapshot.node).set(max(0.0, -behind))


# Each scope's metric names in wire order, as this service reads them.
_EXPECTED_SCOPES = {int(scope.scope): tuple(scope.metrics) for scope in wire.schema().scopes}


def _scopes_differ(schema: pb.MetricSchema) -> str:
    """How a hello's scopes differ from this service's (names and order per scope), or "" when they
    match. A hello without scopes is taken on its hash alone: collectors before GetSchema existed
    may send none, and the matching hash is their claim to pack values in this service's order."""
    if not schema.scopes:
        return ""
    sent: dict[int, tuple[str, ...]] = {}
    for scope in schema.scopes:
        name = pb.Scope.Name(scope.scope) if scope.scope in pb.Scope.values() else str(scope.scope)
        if scope.scope in sent:
            return f"scope {name} sent twice"
        if scope.scope not in _EXPECTED_SCOPES:
            return f"scope {name} is not one this service knows"
        sent[scope.scope] = tuple(scope.metrics)
    for number, expected in _EXPECTED_SCOPES.items():
        name = pb.Scope.Name(pb.Scope.ValueType(number))
        got = sent.get(number)
        if got is None:
            return f"scope {name} is missing"
        if got != expected:
            at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            if at is None:
                return f"scope {name} has {len(got)} metrics, the service's {len(expected)}"
            return f"scope {name} has {got[at]!r} at position {at}, the service {expected[at]!r}"
    return ""


class AsyncTelemetryServicer(pb_grpc.TelemetryServicer):
    """The same servicer for a `grpc.aio` server: one event loop carries every collector's stream,
    where the sync server needs a thread per open stream (and its wake-ups) for each."""

    def __init__(
        self,
        core: TelemetryServicer,
        policy: AccessPolicy | None = None,
        *,
        limits: CallerLimits | None = None,
        backlog: Callable[[], int] = lambda: 0,
        on_throttle: Callable[[str], None] = lambda what: None,
        streams: StreamWatch | None = None,
    ) -> None:
        """`policy`: a collector pushes only for its own node (None: no checks); `limits`: each
        stream's pace, streams per node, and `backlog()` (steps waiting to be scored) held under
        `limits.max_backlog` by making every stream wait; `streams` hears each accepted stream open
        and end, and whether its collector closed it (a goodbye) or it broke."""
        self.core, self.policy, self.backlog, self.on_throttle = core, policy, backlog, on_throttle
        self.watch = streams
        self.limits = limits or CallerLimits()
        self.streams = OpenCount(self.limits.streams_per_node)

    async def Push(  # noqa: N802 (the aio form of the same method)
        self,
        request_iterator: AsyncIterator[pb.PushRequest],
        context: grpc.aio.ServicerContext[pb.PushRequest, pb.PushAck],
    ) -> AsyncIterator[pb.PushAck]:
        """The same stream on the event loop, authenticated, paced and held back while the
        scorer's backlog is full."""
        key: tuple[str, int] | None = None
        bucket = TokenBucket(self.limits.push_samples_per_s, self.limits.push_burst)
        counted = ""  # the node whose open-stream count this stream holds
        watched = ""  # the node whose stream the watch heard open
        # Ended by the collector's goodbye, or refused: nothing happened to the node. Anything else
        # broke (a reset, keepalive pings unanswered; on a lost connection the requests simply end).
        broke = True
        principal = current() if self.policy is not None else None  # one caller per stream
        try:
            async for request in request_iterator:
                if key is None:
                    key, refusal = self.core.open_stream(request)
                    if refusal is None and self.policy is not None:
                        try:
                            self.policy.check_node(principal, key[0])  # type: ignore[arg-type]
                        except AuthError as denied:
                            refusal = refuse(self.policy, denied, context.peer())
                    if refusal is None:
                        if self.streams.enter(key[0]):
                            counted = key[0]
                        else:
                            self.on_throttle("streams")
                            refusal = (
                                grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"node {key[0]!r} has {self.limits.streams_per_node} push streams open already",
                            )
                    if refusal is not None:
                        await context.abort(*refusal)
                    if self.watch is not None:
                        watched = key[0]
                        self.watch.stream_opened(watched)
                    continue
                if request.HasField("goodbye"):
                    broke = False
                    break
                if (
                    principal is not None
                    and self.policy is not None
                    and not self.policy.still_valid(principal)
                ):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the bearer token was revoked")
                await self._pace(bucket)
                yield self.core.take(key, request)
            else:
                # The requests ended without a goodbye: the collector closed its side (an older one,
                # or a client of its own), or the connection was lost, which ends them the same way
                # and cancels this call a moment later. What comes first tells them apart.
                await asyncio.sleep(_LOST_CHECK_S)
                broke = False
        except grpc.aio.AbortError:
            broke = False  # the service refused the stream
            raise
        finally:
            if counted:
                self.streams.leave(counted)
            if watched and self.watch is not None:
                self.watch.stream_ended(watched, goodbye=not broke)

    async def GetSchema(  # noqa: N802 (the aio form of the same method)
        self,
        request: pb.GetSchemaRequest,
        context: grpc.aio.ServicerContext[pb.GetSchemaRequest, pb.MetricSchema],
    ) -> pb.MetricSchema:
        """Every scope's metrics in wire order, described."""
        return wire.described_schema()

    async def _pace(self, bucket: TokenBucket) -> None:
        """Wait for this stream's turn (its rate) and for the scorer (the backlog); while the
        servicer waits it reads nothing, so HTTP/2 flow control holds the sender back."""
        wait = bucket.reserve()
        if wait > 0:
            self.on_throttle("push_rate")
            await asyncio.sleep(wait)
        while self.backlog() > self.limits.max_backlog:
            self.on_throttle("push_backlog")
            await asyncio.sleep(_BACKLOG_POLL_S)  # the scorer runs on another thread: poll its queue


_BACKLOG_POLL_S = 0.05
# After requests that ended without a goodbye, how long a lost connection takes to cancel the call
# (within 50 ms here, a process killed); a stream still standing then was closed by its collector.
_LOST_CHECK_S = 0.5
# A node sample is a few kB; anything near this is not from a collector.
MAX_MESSAGE_BYTES = 1 << 20


def create_server(
    servicer: pb_grpc.TelemetryServicer, address: str = "127.0.0.1:0", *, max_workers: int = 16
) -> tuple[grpc.Server, int]:
    """A started server with the telemetry service; returns it and the bound port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
    )
    pb_grpc.add_TelemetryServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the telemetry service to {address}")
    server.start()
    return server, port
