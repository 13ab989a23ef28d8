"""A telemetry servicer on a real grpc.aio server, its event loop on a thread of its own, for the
tests that push to the async servicer without the rest of the service."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from faultcast.service.rpc.telemetry import AsyncTelemetryServicer
from faultcast.v1 import telemetry_pb2_grpc as tpb_grpc

STOP_WAIT_S = 30.0  # for the loop's thread to end once the server stopped


@contextmanager
def aio_telemetry_server(servicer: AsyncTelemetryServicer) -> Iterator[int]:
    """Serve `servicer` on 127.0.0.1; yields its port, and stops server and loop on leaving."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def serve() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        tpb_grpc.add_TelemetryServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(serve(), loop).result()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_WAIT_S)
