"""Transport security for faultcast's gRPC endpoints: credentials from PEM files, and the settings
that choose them, for the service and for its clients.

Who a caller is (the service decides what it may do: faultcast.service.rpc.auth):
- a bearer token (`authorization: Bearer TOKEN`, sent only over TLS), whose SHA-256 the
  service's tokens file maps to ROLE NAME (`faultcast token` makes one);
- else the client certificate's SPIFFE ID (mTLS), a URI SAN `spiffe://TRUST-DOMAIN/ROLE/NAME`
  (ROLE: collector, trainer or admin; NAME: the node, the job id, the operator).

Plaintext only by `--insecure`, which says so in the log at start.

The library reads typed settings (ServerTLSOptions, ClientTLSOptions); the command-line flags that
fill them live with the CLI (faultcast.cli.tls_args), so a program that builds its settings without
argparse gets the same checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

ChannelFactory = Callable[[str], grpc.Channel]
"""Opens a channel to a target ("host:port") with the credentials chosen once, at start."""


class TLSConfigError(ValueError):
    """A certificate, key or token that cannot be used, with the file and the reason."""


def read_pem(path: Path, what: str) -> bytes:
    """The bytes of a PEM file; TLSConfigError naming `what` and the file when it is unreadable or
    holds no -----BEGIN line (a key in DER form, say)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{what} {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN " not in data:
        raise TLSConfigError(f"{what} {path}: not a PEM file (no -----BEGIN line)")
    return data


def read_token(path: Path) -> str:
    """A bearer token from a file (never from the command line, where `ps` shows it)."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise TLSConfigError(f"token file {path}: {exc.strerror or exc}") from exc
    if not token or any(c.isspace() for c in token):
        raise TLSConfigError(f"token file {path}: expected one token on one line")
    return token


# -- the service ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerTLSOptions:
    """The service's transport-security settings, as given (the flags of faultcast.cli.tls_args.add_server_arguments);
    server_tls checks them. Paths are not read here."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tokens_file: Path | None = None
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """Checked TLS settings of the service: its certificate chain and key, and the CA client
    certificates must chain to (None: no mTLS, callers prove who they are by bearer token)."""

    cert: Path
    key: Path
    # Clients must present a certificate this CA signed (mTLS). gRPC Python cannot ask for an
    # optional one, so with a CA every client needs a certificate; a bearer token, if it sends
    # one too, names who it is (a fleet-wide certificate plus a per-node token works).
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials from the files, read now; TLSConfigError when one is unreadable or
        not PEM (a certificate and key that do not match fail later, when the server binds)."""
        pair = (read_pem(self.key, "TLS key"), read_pem(self.cert, "TLS certificate"))
        if self.client_ca is None:
            return grpc.ssl_server_credentials([pair])
        return grpc.ssl_server_credentials(
            [pair], root_certificates=read_pem(self.client_ca, "client CA"), require_client_auth=True
        )


def server_tls(settings: ServerTLSOptions) -> ServerTLS | None:
    """The TLS settings asked for; None with `insecure`. Raises TLSConfigError on a contradiction,
    so a typo never falls back to plaintext. Files are not read here (ServerTLS.credentials does)."""
    wants_tls = any((settings.tls_cert, settings.tls_key, settings.tls_client_ca, settings.tokens_file))
    if settings.insecure:
        if wants_tls:
            raise TLSConfigError("--insecure contradicts the TLS flags given; choose one")
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise TLSConfigError(
            "give --tls-cert and --tls-key (and --tls-client-ca and/or --tokens-file to know who calls), "
            "or --insecure for plaintext without authentication"
        )
    if settings.tls_client_ca is None and settings.tokens_file is None:
        raise TLSConfigError(
            "TLS without --tls-client-ca or --tokens-file cannot tell collectors, trainers and admins "
            "apart; give one or both"
        )
    return ServerTLS(settings.tls_cert, settings.tls_key, settings.tls_client_ca)


# -- clients ----------------------------------------------------------------------------------


def channel_credentials(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None, token: str | None = None
) -> grpc.ChannelCredentials:
    """TLS to the service (its CA, or the system's roots), with a client certificate for mTLS
    and/or a bearer token."""
    if (cert is None) != (key is None):
        raise TLSConfigError("a client certificate needs its key, and a key its certificate")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca, "CA") if ca is not None else None,
        private_key=read_pem(key, "TLS key") if key is not None else None,
        certificate_chain=read_pem(cert, "TLS certificate") if cert is not None else None,
    )
    if token is None:
        return credentials
    return grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))


@dataclass(frozen=True, slots=True)
class ClientTLSOptions:
    """A client's settings for reaching the service, as given (the flags of
    faultcast.cli.tls_args.add_client_arguments); client_channel_factory checks them."""

    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token_file: Path | None = None  # re-read at every new channel, so a rotated token is picked up
    tls_server_name: str | None = None  # the name the service's certificate must carry, if not the host
    insecure: bool = False


def client_channel_factory(settings: ClientTLSOptions) -> ChannelFactory:
    """Channels as the settings ask; raises TLSConfigError now when they contradict or name bad files.
    The token file is re-read for every channel, so a rotated token is picked up on reconnect."""
    if settings.insecure:
        if any((settings.tls_ca, settings.tls_cert, settings.tls_key, settings.token_file)):
            raise TLSConfigError("--insecure contradicts the TLS flags given; choose one")
        log.warning("connecting without TLS or authentication (--insecure)")
        return grpc.insecure_channel
    if settings.tls_ca is None and settings.token_file is None and settings.tls_cert is None:
        raise TLSConfigError(
            "give --tls-ca (with --tls-cert/--tls-key or --token-file), or --insecure for plaintext"
        )
    # Fail now, not at the first connect.
    channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key)
    if settings.token_file is not None:
        read_token(settings.token_file)
    options = (
        [("grpc.ssl_target_name_override", settings.tls_server_name)] if settings.tls_server_name else []
    )

    def secure(target: str) -> grpc.Channel:
        token = read_token(settings.token_file) if settings.token_file is not None else None
        credentials = channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key, token)
        return grpc.secure_channel(target, credentials, options=options)

    return secure
