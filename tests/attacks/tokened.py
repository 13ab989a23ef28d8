"""A service over TLS whose callers are told apart by bearer tokens, as the probe ran it: no client
certificate is asked for, so anyone who reaches the port completes the handshake and, without a
token, is a stranger (health checks need no identity)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from faultcast.service.config import ServiceConfig
from faultcast.service.metrics import ServiceMetrics
from faultcast.service.remediation.spares.prescheduler import SpareProvider
from faultcast.service.rpc.auth import AccessPolicy, TokenBook, digest
from faultcast.service.rpc.limits import CallerLimits
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.tls import ServerTLS, channel_credentials
from tests.pki import Authority

# name -> role; each name's token is "token-" + name.
ROLES = {
    "alice": "admin",
    "job-a": "trainer",
    "job-b": "trainer",
    "job-c": "trainer",
    "node-1": "collector",
    "node-2": "collector",
}


@dataclass
class Tokened:
    service: Service
    port: int
    ca: Path

    @property
    def target(self) -> str:
        return f"localhost:{self.port}"

    def credentials(self, who: str | None = None) -> grpc.ChannelCredentials:
        """TLS with `who`'s token; None: TLS alone, a caller without any identity."""
        return channel_credentials(self.ca, token=f"token-{who}" if who is not None else None)

    def channel(self, who: str | None = None) -> grpc.Channel:
        return grpc.secure_channel(self.target, self.credentials(who))

    def aio_channel(self, who: str | None = None) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(self.target, self.credentials(who))

    def counted(self, metric: str, **labels: str) -> float:
        value = self.service.metrics.registry.get_sample_value(metric, labels)
        return value or 0.0

    def throttled(self, what: str) -> float:
        return self.counted("faultcast_throttled_total", what=what)


@contextmanager
def tokened_service(
    model: Path,
    directory: Path,
    *,
    caller_limits: CallerLimits | None = None,
    max_threads: int = 256,
    spares: SpareProvider | None = None,
    trainers_register: bool = True,
) -> Iterator[Tokened]:
    """A service on `directory` (its state there: a second one on the same directory is the first
    restarted), with `spares` readied during alerts when given."""
    pki = Authority(directory / "pki", "attack")
    server = pki.server()
    tokens = directory / "tokens"
    tokens.write_text(
        "".join(f"sha256:{digest('token-' + who)} {role} {who}\n" for who, role in ROLES.items())
    )
    model_dir = directory / "model"
    if not model_dir.exists():
        shutil.copytree(model, model_dir)
    metrics = ServiceMetrics()
    service = Service.open(
        model_dir,
        directory / "state",
        ServiceConfig(
            limits=Limits(max_future_s=0, max_age_s=0), caller_limits=caller_limits or CallerLimits()
        ),
        metrics=metrics,
        policy=AccessPolicy(tokens=TokenBook(tokens), metrics=metrics, trainers_register=trainers_register),
        spares=spares,
    )
    port = service.start("127.0.0.1:0", max_threads=max_threads, tls=ServerTLS(server.cert, server.key))
    try:
        yield Tokened(service, port, pki.ca.cert)
    finally:
        service.stop(0)
