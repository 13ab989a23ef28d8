"""Ships spooled samples to the service over a gRPC push stream, resuming after outages.

One background thread keeps one `Telemetry.Push` stream open: a hello, then every spooled
sample after the last acknowledged one, in order, with at most `window` unacknowledged in
flight. Acks trim the spool. When the stream breaks the thread backs off (exponential, with
jitter) and reconnects, resending everything not yet acknowledged; the service drops the
duplicates by sequence number, so every sample arrives once and in order.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from faultcast import wire
from faultcast.collector.spool import Spool
from faultcast.v1 import telemetry_pb2 as pb
from faultcast.v1 import telemetry_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


_GOODBYE_S = 1.0  # how long `close` waits for the service to end a stream closed cleanly


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnection delays: exponential from `initial` to `maximum`, each with +-`jitter` noise."""

    initial: float = 0.5
    maximum: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.2  # +-20% so a fleet of collectors does not reconnect in lockstep

    def delays(self, rng: random.Random) -> Iterator[float]:
        """An endless run of delays in seconds; start a new one to begin small again."""
        delay = self.initial
        while True:
            yield delay * (1.0 + rng.uniform(-self.jitter, self.jitter))
            delay = min(self.maximum, delay * self.multiplier)


@dataclass(slots=True)
class ShipperStats:
    """What the shipper has done so far; written by its thread, read by anyone (the CLI's status)."""

    connected: bool = False
    connects: int = 0
    stream_failures: int = 0
    samples_sent: int = 0
    rejected: int = 0
    last_error: str = ""


class Shipper:
    """Ships `spool`'s samples to the service at `target` from a background thread, until `close`.

    `channel_factory` makes the gRPC channel (tests pass their own); `seed` fixes the jitter.
    """

    def __init__(
        self,
        target: str,
        spool: Spool,
        node: str,
        *,
        window: int = 256,
        backoff: Backoff = Backoff(),
        channel_factory: Callable[[str], grpc.Channel] = grpc.insecure_channel,
        seed: int | None = None,
    ) -> None:
        self.target = target
        self.spool = spool
        self.node = node
        self.window = window
        self.backoff = backoff
        self.channel_factory = channel_factory
        self.stats = ShipperStats()
        self._rng = random.Random(seed)  # noqa: S311 (jitter, not secrets)
        self._stop = threading.Event()
        self._call: grpc.Call | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the shipping thread (a daemon)."""
        self._thread = threading.Thread(target=self._run, name="faultcast-shipper", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0, *, flush: float = 2.0) -> None:
        """Stop shipping. While the stream is up, first wait up to `flush` seconds for the service
        to acknowledge what is spooled; whatever is left stays in the spool for the next start."""
        if self.stats.connected and flush > 0:
            spool = self.spool
            spool.wait(lambda: spool.acked_through >= spool.last_sequence or not self.stats.connected, flush)
        self._stop.set()
        with self.spool.changed:
            self.spool.changed.notify_all()
        # The request stream ends at once (stop is set): the service sees the stream closed, a
        # goodbye, not a broken stream (which it would take for a dead node). Samples sent before it
        # may still be waiting for the service's pace: while their acks keep coming, the goodbye is
        # on its way. Cancelled only when no ack came for `_GOODBYE_S`, or after `timeout`.
        self._await_goodbye(timeout)
        call = self._call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel untyped
        if self._thread is not None:
            self._thread.join(timeout)

    def _await_goodbye(self, timeout: float) -> None:
        """Wait for the shipping thread to end, for as long as the service keeps acknowledging the
        samples ahead of the goodbye (at most `timeout` seconds)."""
        thread = self._thread
        if thread is None:
            return
        deadline, acked = time.monotonic() + timeout, -1
        while thread.is_alive() and acked != self.spool.acked_through:
            acked = self.spool.acked_through
            left = deadline - time.monotonic()
            if left <= 0:
                return
            thread.join(min(left, _GOODBYE_S))

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        delays = self.backoff.delays(self._rng)
        while not self._stop.is_set():
            acked_before = self.spool.acked_through
            try:
                with self.channel_factory(self.target) as channel:
                    self._stream(pb_grpc.TelemetryStub(channel))
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                self.stats.stream_failures += 1
                self.stats.last_error = f"{exc.code().name}: {exc.details()}"
                log.warning("telemetry stream to %s failed: %s", self.target, self.stats.last_error)
            except Exception as exc:  # a spool or encoding fault must not end shipping for good
                self.stats.stream_failures += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("shipping to %s failed; retrying", self.target)
            finally:
                self.stats.connected = False
                self._call = None
                with self.spool.changed:
                    self.spool.changed.notify_all()  # wake a flush waiting on this stream
            if self.spool.acked_through > acked_before:
                delays = self.backoff.delays(self._rng)  # the service was reachable: start small again
            self._stop.wait(next(delays))

    def _stream(self, stub: pb_grpc.TelemetryStub) -> None:
        call = stub.Push(self._requests())
        self._call = call
        for ack in call:
            if not self.stats.connected:
                self.stats.connected = True
                self.stats.connects += 1
                log.info("telemetry stream to %s open", self.target)
            for rejection in ack.rejections:
                self.stats.rejected += 1
                log.warning("service rejected sample %d: %s", rejection.sequence, rejection.reason)
            if ack.acked_through > self.spool.last_sequence:
                log.error(
                    "service acked sequence %d beyond the last spooled (%d); ignoring the ack",
                    ack.acked_through,
                    self.spool.last_sequence,
                )
                continue
            self.spool.ack(ack.acked_through)

    def _requests(self) -> Iterator[pb.PushRequest]:
        yield wire.hello(self.node, self.spool.spool_id)
        sent = self.spool.acked_through  # resend everything the service has not confirmed
        while not self._stop.is_set():
            sent = max(sent, self.spool.acked_through)  # the service may already hold more than we sent
            room = self.window - (sent - self.spool.acked_through)
            batch = self.spool.read_after(sent, min(room, 64)) if room > 0 else []
            if not batch:
                last_sent = sent

                def ready(last_sent: int = last_sent) -> bool:
                    return self._stop.is_set() or (
                        self.spool.last_sequence > last_sent
                        and last_sent - self.spool.acked_through < self.window
                    )

                self.spool.wait(ready, timeout=1.0)
                continue
            for sequence, payload in batch:
                yield pb.PushRequest(sample=pb.NodeSample.FromString(payload))
                sent = sequence
                self.stats.samples_sent += 1
        # Stopping on purpose: say so, or the service takes the closed stream for a node gone dark.
        yield pb.PushRequest(goodbye=pb.PushGoodbye())
