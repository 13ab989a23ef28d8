"""The gRPC health service (grpc.health.v1) on the server's event loop, and a thread-safe handle
that the rest of the service turns it with.

An open Watch is a coroutine waiting on the loop, so it holds no worker thread: the sync servicer
held one per open Watch for good, and 256 of them, from callers without any identity, locked out
every other call and kept the process from exiting. Watch streams are still capped (each costs
memory, and anyone who reaches the port may open them); past the cap Watch is refused with
RESOURCE_EXHAUSTED and counted as throttled{what="health_watches"}. Check holds nothing open.

Any thread may change what the service reports, e.g. when the state disk fails:

    service.health.set_serving(ALL, False)   # load balancers and probes look elsewhere
    service.health.set_serving(ALL, True)    # it works again
    service.health.set_serving("faultcast.v1.Alerts", False)   # one service only

Names are "" (the server as a whole), the services named at construction, or ALL (all of these).
`enter_graceful_shutdown()` makes everything NOT_SERVING for good, as the service stops.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future
from typing import Any

import grpc
from grpc_health.v1 import _async, health_pb2, health_pb2_grpc

ALL = "*"  # set_serving(ALL, ...): the server ("") and every service it names
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _CappedHealthServicer(_async.HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    """grpc_health's aio servicer with a cap on open Watch streams; runs on the event loop only."""

    def __init__(self, max_watches: int, on_throttle: Callable[[str], None]) -> None:
        super().__init__()
        self.max_watches, self.on_throttle = max_watches, on_throttle
        self.watching = 0  # changed on the loop only; read from anywhere (an int is read whole)

    async def Watch(  # noqa: N802 (gRPC method name)
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
    ) -> None:
        if self.watching >= self.max_watches:
            self.on_throttle("health_watches")
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_watches} health Watch streams are open already; use Check, or retry later",
            )
        self.watching += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watching -= 1


class Health:
    """What the health service reports, settable from any thread. Statuses are kept here and
    handed to the servicer on the event loop; before the server runs they wait for `attach`."""

    def __init__(
        self,
        services: Iterable[str],
        *,
        max_watches: int = 1_024,
        on_throttle: Callable[[str], None] = lambda what: None,
    ) -> None:
        self.names = ("", *services)
        self._servicer = _CappedHealthServicer(max_watches, on_throttle)
        self._serving = dict.fromkeys(self.names, False)
        self._shutting_down = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def attach(self, server: grpc.aio.Server, loop: asyncio.AbstractEventLoop) -> None:
        """Serve health on `server`, whose event loop is `loop`; before the server starts."""
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        with self._lock:
            self._loop = loop
        self._schedule(self._apply())

    def set_serving(self, name: str, serving: bool) -> Future[None]:
        """Report `name` (a service, "" for the whole server, or ALL) SERVING or NOT_SERVING.

        Callable from any thread, the event loop's included; it does not wait. The future it
        returns is done once Check and Watch answer the new status: wait on it, if at all, off
        the loop's thread and with a timeout (a loop stopping meanwhile never runs it). Ignored
        after `enter_graceful_shutdown`; raises ValueError for a name the service does not serve
        (a typo must not go unnoticed)."""
        if name != ALL and name not in self._serving:
            raise ValueError(f"no health status named {name!r}; one of {self.names} or ALL")
        with self._lock:
            if self._shutting_down:
                return _done()
            for each in self.names if name == ALL else (name,):
                self._serving[each] = serving
        return self._schedule(self._apply())

    def serving(self, name: str = "") -> bool:
        """The status last set for `name` (what Check answers once the loop has applied it)."""
        with self._lock:
            return self._serving[name] and not self._shutting_down

    def enter_graceful_shutdown(self) -> Future[None]:
        """Everything NOT_SERVING for good: the service is stopping. Any thread; does not wait."""
        with self._lock:
            self._shutting_down = True
        return self._schedule(self._servicer.enter_graceful_shutdown())

    def watching(self) -> int:
        """Watch streams open now."""
        count: int = self._servicer.watching
        return count

    async def _apply(self) -> None:
        """Hand the servicer the statuses as they are now: whichever call runs last applies the
        latest, so calls from several threads cannot leave an older status in force."""
        with self._lock:
            statuses = dict(self._serving)
        for name, serving in statuses.items():
            await self._servicer.set(name, _SERVING if serving else _NOT_SERVING)

    def _schedule(self, change: Coroutine[Any, Any, None]) -> Future[None]:
        with self._lock:
            loop = self._loop
        if loop is None or not loop.is_running():  # not serving yet (attach applies it) or any more
            change.close()
            return _done()
        return asyncio.run_coroutine_threadsafe(change, loop)


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future
