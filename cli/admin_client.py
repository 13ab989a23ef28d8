"""One Admin API call from a command-line tool: `--service` and the client TLS flags, a channel per call,
a refusal printed in the service's own words. `faultcast labels` and `faultcast models` share it."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from faultcast.cli.tls_args import add_client_arguments, client_tls_options


def add_service_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of a subcommand that talks to a running service: its address and the client TLS."""
    parser.add_argument("--service", required=True, help="the service's address, host:port")
    add_client_arguments(parser)
    return parser


def admin_call(
    args: argparse.Namespace, command: str, method: str, request: object, timeout_s: float = 120.0
) -> Any:
    """The Admin API's `method` on args.service; a TLS misconfiguration or a refusal exits (status 1) with
    a message that names `command` and, for a refusal, the service's status and words."""
    import grpc  # the CLI loads grpc only when a subcommand talks to the service

    from faultcast.tls import TLSConfigError, client_channel_factory
    from faultcast.v1 import alerts_pb2_grpc

    try:
        channel = client_channel_factory(client_tls_options(args))(args.service)
    except TLSConfigError as exc:
        raise SystemExit(f"{command}: {exc}") from None
    try:
        return getattr(alerts_pb2_grpc.AdminStub(channel), method)(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        status = exc.code().name if isinstance(exc, grpc.Call) else "ERROR"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise SystemExit(f"{command}: {method} refused ({status}): {details}") from None
    finally:
        channel.close()


def iso_time(time_ns: int) -> str:
    """Unix nanoseconds as an ISO 8601 UTC time to the second, e.g. 2026-12-07T10:31:00Z."""
    moment = dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
