"""The gRPC health service (grpc.health.v1) on the server's event loop, and a thread-safe handle
that the rest of the service turns it with.

An open Watch is a coroutine waiting on the loop, so it holds no worker thread: the sync servicer
held one per open Watch for good, and 256 of them, from callers without any identity, locked out
every other call and kept the process from exiting. Watch streams are still capped (each costs
memory, and anyone who reaches the port may open them), fairly (limits.WatchSlots): health needs no
identity, but a caller that presents one the access policy knows (a bearer token, a client
certificate) watches in slots that callers without one cannot take, which share a smaller part
and are capped per host. Past a cap Watch is refused with RESOURCE_EXHAUSTED and counted as
throttled{what="health_watches"}. Check holds nothing open.

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

from faultcast.service.rpc.auth import INSECURE, AccessPolicy, AuthError
from faultcast.service.rpc.limits import CallerLimits, WatchSlots

ALL = "*"  # set_serving(ALL, ...): the server ("") and every service it names
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_Context = grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]


def _identity(policy: AccessPolicy | None, context: _Context) -> str | None:
    """Who the caller proved to be ("role/name"), or None: no identity, one the policy does not
    know (health refuses no one for it), or a service that identifies no one (--insecure)."""
    if policy is None or policy.insecure:
        return None
    try:
        principal = policy.identify(context)
    except AuthError:
        return None
    return None if principal is INSECURE else f"{principal.role.value}/{principal.name}"


class _CappedHealthServicer(_async.HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    """grpc_health's aio servicer with fair caps on open Watch streams; runs on the event loop only."""

    def __init__(
        self, slots: WatchSlots, policy: AccessPolicy | None, on_throttle: Callable[[str], None]
    ) -> None:
        super().__init__()
        self.slots, self.policy, self.on_throttle = slots, policy, on_throttle

    async def Watch(  # noqa: N802 (gRPC method name)
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> None:
        identity = _identity(self.policy, context)
        host = context.peer().rsplit(":", 1)[0]  # "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7"
        refused = self.slots.enter(identity, host)
        if refused:
            self.on_throttle("health_watches")
            hint = (
                "" if identity is not None else " (a caller with a token or certificate has slots of its own)"
            )
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"health Watch: {refused}; use Check, or retry later{hint}",
            )
        try:
            await super().Watch(request, context)
        finally:
            self.slots.leave(identity, host)


class Health:
    """What the health service reports, settable from any thread. Statuses are kept here and
    handed to the servicer on the event loop; before the server runs they wait for `attach`."""

    def __init__(
        self,
        services: Iterable[str],
        *,
        limits: CallerLimits | None = None,
        policy: AccessPolicy | None = None,
        on_throttle: Callable[[str], None] = lambda what: None,
    ) -> None:
        """`limits`: the Watch caps (health_watches and the shares of it); `policy`: tells callers
        that present an identity apart from those that do not (None: every caller is anonymous)."""
        self.names = ("", *services)
        limits = limits or CallerLimits()
        slots = WatchSlots(
            limits.health_watches,
            limits.anonymous_health_watches,
            limits.health_watches_per_host,
            limits.health_watches_per_caller,
        )
        self._servicer = _CappedHealthServicer(slots, policy, on_throttle)
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
        count: int = self._servicer.slots.open
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
