"""Parsed TLS flags to the typed settings faultcast.tls reads.

The flags themselves are added by faultcast.tls.add_server_arguments and add_client_arguments;
their destinations carry the settings' field names, read here and nowhere else.
"""

from __future__ import annotations

import argparse

from faultcast.tls import ClientTLSOptions, ServerTLSOptions


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
