"""Who may call what: callers' identities and the service's authorization policy.

Every call passes the `AuthInterceptor`: it refuses a request that does not decode, identifies the
caller (a bearer token from the tokens file, else a client certificate's SPIFFE ID; health checks
need no identity), refuses a role the method does not admit, and leaves the principal where the
servicers find it (`current()`), because only they see what a request names: a collector pushes
only for the node it is, a trainer reads and acknowledges only its own job's alerts, an admin
reloads models and sets remediation.

A method this table does not name is refused (fail closed), except the reflection service, which
any authenticated caller may use. `--insecure` admits every call as `INSECURE`, which may do all.
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from faultcast.service.metrics import ServiceMetrics
from faultcast.service.rpc.limits import CallerLimits, CallLimiter, OpenCount
from faultcast.service.state.db import StateWriteError

log = logging.getLogger(__name__)


class Role(enum.Enum):
    """What a caller is: a collector (one node), a trainer (one job) or an admin."""

    COLLECTOR = "collector"
    TRAINER = "trainer"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its role, its name, and how it proved it."""

    role: Role
    name: str  # the node (collector), the job id (trainer), the operator (admin)
    via: str  # "certificate", "token" or "insecure"
    token_digest: str = ""  # for tokens: revoked when its line leaves the tokens file

    def __str__(self) -> str:
        return f"{self.role.value} {self.name!r} ({self.via})"


INSECURE = Principal(Role.ADMIN, "insecure", "insecure")

_TELEMETRY, _ALERTS, _ADMIN = "/faultcast.v1.Telemetry/", "/faultcast.v1.Alerts/", "/faultcast.v1.Admin/"
_READERS = frozenset({Role.TRAINER, Role.ADMIN})
METHOD_ROLES: Mapping[str, frozenset[Role]] = {
    _TELEMETRY + "Push": frozenset({Role.COLLECTOR}),
    _TELEMETRY + "GetSchema": frozenset(Role),  # the schema is public knowledge
    _ALERTS + "Subscribe": _READERS,
    _ALERTS + "Acknowledge": _READERS,
    _ALERTS + "ListActiveAlerts": _READERS,
    _ALERTS + "RegisterJob": _READERS,
    _ALERTS + "AwaitHandOver": _READERS,  # a standby, with its job's identity
    _ALERTS + "ReportFailure": _READERS,  # a trainer, for its own job's nodes
    _ADMIN + "ReloadModel": frozenset({Role.ADMIN}),
    _ADMIN + "SetRemediation": frozenset({Role.ADMIN}),
    _ADMIN + "GetRemediation": frozenset({Role.ADMIN}),
    # The fleet's label log (service/label_desk.py) and the model registry (service/model_registry.py).
    _ADMIN + "AddFailures": frozenset({Role.ADMIN}),
    _ADMIN + "JudgeAlert": frozenset({Role.ADMIN}),
    _ADMIN + "ListLabels": frozenset({Role.ADMIN}),
    _ADMIN + "ListModels": frozenset({Role.ADMIN}),
    _ADMIN + "AddModel": frozenset({Role.ADMIN}),
    _ADMIN + "PromoteModel": frozenset({Role.ADMIN}),
    _ADMIN + "RollbackModel": frozenset({Role.ADMIN}),
    _ADMIN + "ShadowModel": frozenset({Role.ADMIN}),
    _ADMIN + "CompareShadow": frozenset({Role.ADMIN}),
}
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)  # load balancers and kubelets probe without identity
ANY_IDENTITY_PREFIXES = ("/grpc.reflection.",)  # describes the API, reveals no data

if TYPE_CHECKING:  # generic only in the stubs
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("faultcast_principal")


def current() -> Principal:
    """The caller of the RPC being served (set by the interceptor before the servicer runs)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("no principal: the servicer runs without the AuthInterceptor") from None


def digest(token: str) -> str:
    """The SHA-256 (hex) of a bearer token: what the tokens file holds."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenBook:
    """Bearer tokens by SHA-256: the file holds digests, never tokens, so reading it grants
    nothing. Lines: `sha256:HEX ROLE NAME`; `#` starts a comment."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._by_digest: dict[str, Principal] = {}
        self._lock = threading.Lock()
        self.reload()

    @staticmethod
    def parse(text: str, source: str) -> dict[str, Principal]:
        """The tokens in a tokens file's `text`; ValueError naming `source` and the line at fault."""
        book: dict[str, Principal] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            roles = ", ".join(r.value for r in Role)
            if len(parts) != 3 or not parts[0].startswith("sha256:") or len(parts[0]) != 7 + 64:
                raise ValueError(f"{source}:{number}: expected 'sha256:<64 hex digits> ROLE NAME'")
            try:
                role = Role(parts[1])
            except ValueError:
                raise ValueError(f"{source}:{number}: role {parts[1]!r} is not one of {roles}") from None
            book[parts[0][7:].lower()] = Principal(role, parts[2], "token", parts[0][7:].lower())
        return book

    def reload(self) -> int:
        """Read the file again (SIGHUP); a bad file raises and leaves the old tokens in force."""
        book = self.parse(self.path.read_text(), str(self.path))
        with self._lock:
            self._by_digest = book
        return len(book)

    def lookup(self, token: str) -> Principal | None:
        """Who holds `token`, or None."""
        with self._lock:
            return self._by_digest.get(digest(token))

    def holds(self, principal: Principal) -> bool:
        """Whether the principal's token is still in the file (not revoked)."""
        with self._lock:
            return principal.token_digest in self._by_digest


class AuthError(Exception):
    """A call refused: the gRPC status, the reason counted in faultcast_auth_denied_total, and the
    message the caller sees."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


class AccessPolicy:
    """Identification and the rules on what each role may name; the servicers ask it."""

    def __init__(
        self,
        *,
        tokens: TokenBook | None = None,
        trust_domain: str | None = None,
        insecure: bool = False,
        trainers_register: bool = True,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        """`metrics`: where refusals are counted (faultcast_auth_denied_total), by reason."""
        self.tokens, self.trust_domain, self.insecure = tokens, trust_domain, insecure
        self.trainers_register = trainers_register
        self.metrics = metrics
        self._warned: set[tuple[str, str]] = set()

    # -- who -------------------------------------------------------------------------------

    def identify(self, context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]) -> Principal:
        """Who the caller is (certificate, then bearer token); AuthError when neither says."""
        if self.insecure:
            return INSECURE
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                text = value.decode(errors="replace") if isinstance(value, bytes) else value
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise AuthError(
                        grpc.StatusCode.UNAUTHENTICATED, "bad_token", "authorization is not 'Bearer TOKEN'"
                    )
                found = self.tokens.lookup(token.strip()) if self.tokens is not None else None
                if found is None:
                    raise AuthError(
                        grpc.StatusCode.UNAUTHENTICATED, "unknown_token", "the bearer token is not known"
                    )
                return found
        spiffe: Any = context.auth_context().get("peer_spiffe_id")
        if spiffe:
            return self._from_spiffe(bytes(next(iter(spiffe))).decode(errors="replace"))
        raise AuthError(
            grpc.StatusCode.UNAUTHENTICATED, "no_identity", "present a client certificate or a bearer token"
        )

    def _from_spiffe(self, spiffe_id: str) -> Principal:
        rest = spiffe_id.removeprefix("spiffe://")
        domain, _, path = rest.partition("/")
        role_name, _, name = path.partition("/")
        if self.trust_domain is not None and domain != self.trust_domain:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                "foreign_domain",
                f"{spiffe_id}: trust domain {domain!r} is not {self.trust_domain!r}",
            )
        try:
            role = Role(role_name)
        except ValueError:
            role = None
        if role is None or not name or "/" in name:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                "bad_identity",
                f"{spiffe_id}: expected spiffe://DOMAIN/ROLE/NAME with ROLE one of "
                f"{', '.join(r.value for r in Role)}",
            )
        return Principal(role, name, "certificate")

    def still_valid(self, principal: Principal) -> bool:
        """False once a token is revoked (its line removed, tokens reloaded): long streams end."""
        if principal.via != "token" or self.tokens is None:
            return True
        return self.tokens.holds(principal)

    # -- what ------------------------------------------------------------------------------

    def admit(
        self, context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any], method: str
    ) -> Principal:
        """The caller, if its role may call `method`; else raises AuthError."""
        principal = self.identify(context)
        if principal is INSECURE or method.startswith(ANY_IDENTITY_PREFIXES):
            return principal
        roles = METHOD_ROLES.get(method)
        if roles is None or principal.role not in roles:
            raise AuthError(grpc.StatusCode.PERMISSION_DENIED, "role", f"{principal} may not call {method}")
        return principal

    def check_node(self, principal: Principal, node: str) -> None:
        """A collector pushes only for the node its identity names."""
        if principal is INSECURE:
            return
        if principal.role is not Role.COLLECTOR or principal.name != node:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED, "wrong_node", f"{principal} may not push for node {node!r}"
            )

    def check_job(
        self,
        principal: Principal,
        job_id: str,
        *,
        registering: bool = False,
        predecessors: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """A trainer names only its own job (and registers it only when trainers may), or a standby
        that took its job over (`predecessors(job_id)` names the jobs a standby carries on: it runs
        the job's command, with the job's credentials, under a job id of its own)."""
        if principal is INSECURE or principal.role is Role.ADMIN:
            return
        if registering and not self.trainers_register:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                "registration",
                "jobs are registered by admins here (--job-registration admin)",
            )
        if principal.role is not Role.TRAINER or (
            principal.name != job_id and (predecessors is None or principal.name not in predecessors(job_id))
        ):
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED, "wrong_job", f"{principal} may not act for job {job_id!r}"
            )

    def check_nodes(
        self,
        principal: Principal,
        job_id: str,
        nodes: Sequence[str],
        registered: Sequence[str],
        *,
        predecessors: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """A trainer reads (or acknowledges) only alerts of the nodes its job is registered on."""
        self.check_job(principal, job_id, predecessors=predecessors)
        if principal is INSECURE or principal.role is Role.ADMIN:
            return
        outside = sorted(set(nodes) - set(registered))
        if outside:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                "wrong_node",
                f"{principal}: nodes {outside} are not registered to job {job_id!r}",
            )

    def count(self, denied: AuthError, context_peer: str) -> None:
        """Count a refusal, and log it (the first per peer and reason at WARNING)."""
        if self.metrics is not None:
            self.metrics.auth_denied.labels(denied.reason).inc()
        # The first refusal per peer and reason at WARNING; a flood of them does not flood the log.
        key = (context_peer.rsplit(":", 1)[0], denied.reason)
        if key not in self._warned and len(self._warned) < 10_000:
            self._warned.add(key)
            log.warning("refused %s: %s", context_peer, denied)
        else:
            log.debug("refused %s: %s", context_peer, denied)


# -- the interceptor --------------------------------------------------------------------------


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Admits each call (identity and role), then holds the caller to its share: unary calls
    through a token bucket per caller, Subscribe streams under a cap per caller. Health calls
    need no identity. A request that does not decode is refused with INVALID_ARGUMENT and
    counted (`on_malformed`), for every method: gRPC would answer UNKNOWN and log a traceback."""

    def __init__(
        self,
        policy: AccessPolicy,
        limits: CallerLimits | None = None,
        on_throttle: Callable[[str], None] = lambda what: None,
        on_malformed: Callable[[], None] = lambda: None,
    ) -> None:
        self.policy, self.on_throttle, self.on_malformed = policy, on_throttle, on_malformed
        limits = limits or CallerLimits()
        self.calls = CallLimiter(limits.calls_per_s, limits.call_burst)
        self.subscribers = OpenCount(limits.subscribers_per_caller)
        # Each method's guarded handler, made once: the server asks for a handler on every call.
        self._guarded: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        """The method's handler wrapped so that every call is admitted (or refused) first."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        guarded = self._guarded.get(method)
        if guarded is None:
            guarded = self._guarded[method] = _guarded(handler, self, method)
        return guarded

    def admit(self, context: Any, method: str, *, unary: bool) -> Principal | tuple[grpc.StatusCode, str]:
        """The caller, or the status refusing it."""
        try:
            principal = self.policy.admit(context, method)
        except AuthError as denied:
            return refuse(self.policy, denied, context.peer())
        if unary and not self.calls.allow(self.caller(principal, context)):
            self.on_throttle("calls")
            return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{principal}: too many calls; back off and retry"
        return principal

    def enter(
        self, request: Any, context: Any, call: _Call
    ) -> Principal | tuple[grpc.StatusCode, str] | None:
        """The caller (None for health, which needs no identity), or the status refusing the call."""
        if request is MALFORMED:
            return self.malformed()
        if call.open:
            return None
        return self.admit(context, call.method, unary=call.unary)

    def malformed(self) -> tuple[grpc.StatusCode, str]:
        """Count a request that is not a valid message; the status that refuses it."""
        self.on_malformed()
        return (
            grpc.StatusCode.INVALID_ARGUMENT,
            "the request is not a valid protobuf message of the method's type",
        )

    @staticmethod
    def caller(principal: Principal, context: Any) -> str:
        """Whose share a call counts against: the identity, or without one (--insecure) the host."""
        if principal is INSECURE:
            return str(context.peer()).rsplit(":", 1)[0]
        return f"{principal.role.value}/{principal.name}"


class _Malformed:
    """What a request that does not decode becomes: the guarded handler refuses it."""


MALFORMED = _Malformed()


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, answering MALFORMED instead of raising (gRPC runs it before any handler)."""
    if deserializer is None:
        return None
    read = deserializer

    def lenient(data: bytes) -> Any:
        try:
            return read(data)
        except DecodeError:
            return MALFORMED

    return lenient


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    unary: bool  # one request, one answer: counted against the caller's call rate
    subscription: bool  # one request, a stream of answers (Subscribe): capped per caller
    request_stream: bool  # its messages are checked as they are read
    open: bool  # health: no identity needed


async def _checked(requests: AsyncIterator[Any], context: Any, gate: AuthInterceptor) -> AsyncIterator[Any]:
    async for request in requests:
        if request is MALFORMED:
            await context.abort(*gate.malformed())
        yield request


def _checked_sync(requests: Iterator[Any], context: Any, gate: AuthInterceptor) -> Iterator[Any]:
    for request in requests:
        if request is MALFORMED:
            context.abort(*gate.malformed())
        yield request


def _wrap(behavior: Any, gate: AuthInterceptor, call: _Call) -> Any:
    """The same kind of callable as `behavior` (coroutine, async generator, generator, function):
    the server runs each kind differently. It checks the request and admits the caller, then runs
    the behaviour with the principal in `current()`."""
    if inspect.isasyncgenfunction(behavior):

        async def async_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            admitted = gate.enter(request, context, call)
            if isinstance(admitted, tuple):
                await context.abort(*admitted)
                return
            if admitted is not None:
                _current.set(admitted)
            if call.request_stream:
                request = _checked(request, context, gate)
            # A request answered with a stream (Subscribe) is capped per caller; Push streams are
            # capped per node by the telemetry servicer.
            caller = gate.caller(admitted, context) if call.subscription and admitted is not None else ""
            if caller and not gate.subscribers.enter(caller):
                gate.on_throttle("subscribers")
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{admitted}: {gate.subscribers.cap} subscriptions open already",
                )
                return
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                if caller:
                    gate.subscribers.leave(caller)

        return async_stream
    if inspect.iscoroutinefunction(behavior):

        async def coroutine(request: Any, context: Any) -> Any:
            admitted = gate.enter(request, context, call)
            if isinstance(admitted, tuple):
                await context.abort(*admitted)
            if admitted is not None:
                _current.set(admitted)  # type: ignore[arg-type]  # abort raised on a refusal
            if call.request_stream:
                request = _checked(request, context, gate)
            try:
                return await behavior(request, context)
            except StateWriteError as exc:
                await context.abort(*_unavailable(exc))

        return coroutine
    if inspect.isgeneratorfunction(behavior):

        def stream(request: Any, context: Any) -> Iterator[Any]:
            admitted = gate.enter(request, context, call)
            if isinstance(admitted, tuple):
                context.abort(*admitted)
            if admitted is not None:
                _current.set(admitted)  # type: ignore[arg-type]  # abort raised on a refusal
            if call.request_stream:
                request = _checked_sync(request, context, gate)
            yield from behavior(request, context)

        return stream

    def function(request: Any, context: Any) -> Any:
        admitted = gate.enter(request, context, call)
        if isinstance(admitted, tuple):
            context.abort(*admitted)
        if admitted is not None:
            _current.set(admitted)  # type: ignore[arg-type]  # abort raised on a refusal
        if call.request_stream:
            request = _checked_sync(request, context, gate)
        try:
            return behavior(request, context)
        except StateWriteError as exc:
            context.abort(*_unavailable(exc))

    return function


def _unavailable(exc: StateWriteError) -> tuple[grpc.StatusCode, str]:
    """A call whose write the state disk refused: nothing of it was kept, the caller retries. Said
    here, around every handler, so that none answers UNKNOWN with a traceback."""
    return grpc.StatusCode.UNAVAILABLE, f"{exc}; nothing of this call was kept: retry it later"


def _guarded(handler: Handler, gate: AuthInterceptor, method: str) -> Handler:
    kinds = {
        (False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream),
        (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream),
    }
    make, behavior = kinds[(handler.request_streaming, handler.response_streaming)]
    call = _Call(
        method,
        unary=not handler.request_streaming and not handler.response_streaming,
        subscription=not handler.request_streaming and handler.response_streaming,
        request_stream=handler.request_streaming,
        open=method.startswith(OPEN_PREFIXES),
    )
    return make(
        _wrap(behavior, gate, call),
        request_deserializer=_lenient(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


def refuse(policy: AccessPolicy, denied: AuthError, peer: str) -> tuple[grpc.StatusCode, str]:
    """Count a servicer's refusal; the (code, message) to abort with."""
    policy.count(denied, peer)
    return denied.code, str(denied)
