"""The TLS flags of `faultcast serve` and of the clients (`faultcast collect`), and the typed settings
faultcast.tls reads, built from them. The flags' destinations carry the settings' field names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from faultcast.tls import ClientTLSOptions, ServerTLSOptions


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the service's security flags. The TLS ones have ServerTLSOptions' field names as their
    destinations; --trust-domain and --job-registration are read by the service's authorization."""
    group = parser.add_argument_group("transport security (TLS, mTLS, bearer tokens)")
    group.add_argument("--tls-cert", type=Path, help="the service's certificate chain (PEM)")
    group.add_argument("--tls-key", type=Path, help="the service's private key (PEM)")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        help="verify client certificates against this CA (mTLS); identities are SPIFFE IDs "
        "spiffe://DOMAIN/ROLE/NAME",
    )
    group.add_argument(
        "--tokens-file",
        type=Path,
        help="bearer tokens accepted: lines 'sha256:HEX ROLE NAME' (faultcast token); re-read on SIGHUP",
    )
    group.add_argument(
        "--trust-domain", help="accept only SPIFFE IDs of this trust domain (default: any the CA signed)"
    )
    group.add_argument(
        "--job-registration",
        choices=["trainer", "admin"],
        default="trainer",
        help="who may register a job's nodes: the job's own trainer, or only admins (a scheduler prolog)",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC with no authentication: every caller may do everything (tests, a laptop)",
    )


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a client's flags for reaching the service; their destinations are ClientTLSOptions' field names."""
    group = parser.add_argument_group("connecting to the service (TLS, mTLS, bearer token)")
    group.add_argument("--tls-ca", type=Path, help="the CA that signed the service's certificate (PEM)")
    group.add_argument("--tls-cert", type=Path, help="this client's certificate (PEM), for mTLS")
    group.add_argument("--tls-key", type=Path, help="this client's private key (PEM), for mTLS")
    group.add_argument(
        "--token-file", type=Path, help="a bearer token (faultcast token); re-read at every reconnect"
    )
    group.add_argument(
        "--tls-server-name", help="the name the service's certificate must carry, when not the target's host"
    )
    group.add_argument(
        "--insecure", action="store_true", help="plaintext, unauthenticated (the service must run --insecure)"
    )


def server_tls_options(args: argparse.Namespace) -> ServerTLSOptions:
    """The service's TLS settings from flags added by add_server_arguments (for faultcast.tls.server_tls)."""
    return ServerTLSOptions(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        tokens_file=args.tokens_file,
        insecure=args.insecure,
    )


def client_tls_options(args: argparse.Namespace) -> ClientTLSOptions:
    """A client's TLS settings from flags added by add_client_arguments (for client_channel_factory)."""
    return ClientTLSOptions(
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        token_file=args.token_file,
        tls_server_name=args.tls_server_name,
        insecure=args.insecure,
    )
