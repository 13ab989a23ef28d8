"""What one caller may take of the service, so a flood from one does not starve the others.

- Push streams: a token bucket per stream; an empty bucket makes the servicer wait before reading
  the next message, and HTTP/2 flow control passes the wait back to the sender (backpressure,
  nothing dropped). Past `max_backlog` steps waiting to be scored, every stream waits the same way:
  the scoring queue stays bounded and collectors keep their samples in their spools meanwhile.
- At most `streams_per_node` open Push streams per node (a reconnecting collector needs two).
- Unary calls: a token bucket per caller, RESOURCE_EXHAUSTED when empty (the client backs off).
- At most `subscribers_per_caller` open Subscribe streams per caller, and `job_subscribers` per job
  named (whoever opened them).
- At most `job_nodes` nodes per job (RegisterJob), or named in one request: every Subscribe and
  listing of the job filters its alerts by them.
- At most `health_watches` open health Watch streams in all. Watch needs no identity, so anyone who
  reaches the port may open them: callers without one (anonymous) share `anonymous_health_watches`
  of them, at most `health_watches_per_host` per host, and the rest stay for callers that present
  one (a token or a certificate), each identity at most `health_watches_per_caller`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallerLimits:
    """Per-caller rates and caps the service enforces; every value must be positive."""

    push_samples_per_s: float = 1000.0  # per stream: a collector at 1 Hz replays a day in ~90 s
    push_burst: int = 10_000
    streams_per_node: int = 4
    max_backlog: int = 10_000  # completed steps waiting for the scorer (~6 kB each for 8 GPUs)
    calls_per_s: float = 100.0  # unary calls per caller (a job's ranks share one identity)
    call_burst: int = 2_000
    subscribers_per_caller: int = 1_024
    job_nodes: int = 4_096  # the largest jobs run on a few thousand nodes; SQLite takes 32,766 names
    job_subscribers: int = 1_024  # a guard per node (README), as many as one identity may open
    health_watches: int = 1_024  # a few per client that watches; Check holds nothing open
    # Of health_watches, what callers without an identity may hold together; the rest is kept for
    # identified callers (none is when this is at or above health_watches).
    anonymous_health_watches: int = 512
    health_watches_per_host: int = 128  # an anonymous host (a load balancer, a node's probes)
    health_watches_per_caller: int = 128  # an identity (a job's ranks share one)

    def __post_init__(self) -> None:
        for name in (
            "push_samples_per_s",
            "push_burst",
            "streams_per_node",
            "max_backlog",
            "calls_per_s",
            "call_burst",
            "subscribers_per_caller",
            "job_nodes",
            "job_subscribers",
            "health_watches",
            "anonymous_health_watches",
            "health_watches_per_host",
            "health_watches_per_caller",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class TokenBucket:
    """`rate` tokens a second, holding at most `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def reserve(self) -> float:
        """Take a token, borrowing if need be; returns how long to wait before using it (0: now)."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0.0 else -self._tokens / self.rate

    def try_take(self) -> bool:
        """Take a token if one is there."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class CallLimiter:
    """A bucket per caller, for the most recent `max_callers` callers (an idle one's bucket is
    full anyway, so forgetting it loses nothing); thread-safe."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_callers: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.max_callers, self.clock = rate, burst, max_callers, clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, caller: str) -> bool:
        """Take one call from the caller's bucket; False when it is empty."""
        with self._lock:
            bucket = self._buckets.get(caller)
            if bucket is None:
                bucket = self._buckets[caller] = TokenBucket(self.rate, self.burst, self.clock)
                if len(self._buckets) > self.max_callers:
                    self._buckets.popitem(last=False)
            self._buckets.move_to_end(caller)
            return bucket.try_take()


class OpenCount:
    """Open streams per key, capped; `enter` is False when the key is at its cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, key: str) -> bool:
        """Count one more open stream of `key`; False (nothing counted) when at the cap."""
        with self._lock:
            if self._open.get(key, 0) >= self.cap:
                return False
            self._open[key] = self._open.get(key, 0) + 1
            return True

    def leave(self, key: str) -> None:
        """Count one stream of `key` closed."""
        with self._lock:
            left = self._open.get(key, 0) - 1
            if left > 0:
                self._open[key] = left
            else:
                self._open.pop(key, None)


class WatchSlots:
    """Open streams under four caps: `total` in all; `anonymous` for the callers without an
    identity together, and `per_host` for each of their hosts; `per_identity` for each identity.
    Anonymous callers cannot take the slots above `anonymous`: they stay for identified callers."""

    def __init__(self, total: int, anonymous: int, per_host: int, per_identity: int) -> None:
        self.total, self.anonymous = total, anonymous
        self.open = 0  # streams open now, anonymous and identified
        self._anonymous_open = 0
        self._hosts = OpenCount(per_host)
        self._identities = OpenCount(per_identity)
        self._lock = threading.Lock()

    def enter(self, identity: str | None, host: str) -> str:
        """Count one more stream of `identity` (None: anonymous, counted by `host`); returns "" when
        counted, else which cap refused it (nothing counted)."""
        with self._lock:
            if self.open >= self.total:
                return f"{self.total} streams are open already"
            if identity is not None:
                if not self._identities.enter(identity):
                    return f"{identity} has {self._identities.cap} streams open already"
            elif self._anonymous_open >= self.anonymous:
                return f"callers without an identity have {self.anonymous} streams open already"
            elif not self._hosts.enter(host):
                return f"{host} has {self._hosts.cap} streams open without an identity already"
            else:
                self._anonymous_open += 1
            self.open += 1
            return ""

    def leave(self, identity: str | None, host: str) -> None:
        """Count one stream that `enter` counted closed."""
        with self._lock:
            self.open -= 1
            if identity is not None:
                self._identities.leave(identity)
            else:
                self._anonymous_open -= 1
                self._hosts.leave(host)
