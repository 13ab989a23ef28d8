"""Server reflection over both protocol versions, asked by real clients: grpc's own v1alpha
descriptor database, and a v1 client that calls grpc.reflection.v1.ServerReflection, learns the
v1 messages from the server's own v1 descriptor, then speaks them to describe the faultcast API.
Both a plain and an asyncio server (the service runs the latter)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from faultcast.service.rpc.reflection import V1_SERVICE, enable_reflection
from faultcast.v1 import alerts_pb2 as apb
from faultcast.v1 import telemetry_pb2 as tpb

NAMES = (
    apb.DESCRIPTOR.services_by_name["Alerts"].full_name,
    tpb.DESCRIPTOR.services_by_name["Telemetry"].full_name,
)
V1_METHOD = f"/{V1_SERVICE}/ServerReflectionInfo"
WAIT_S = 30.0


@pytest.fixture(params=["sync", "aio"])
def channel(request: pytest.FixtureRequest) -> Iterator[grpc.Channel]:
    """A channel to a server with reflection enabled and nothing else."""
    if request.param == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        enable_reflection(server, NAMES)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
        server.stop(0)
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def serve() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        enable_reflection(server, NAMES)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    aio_server, port = asyncio.run_coroutine_threadsafe(serve(), loop).result(WAIT_S)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    asyncio.run_coroutine_threadsafe(aio_server.stop(0), loop).result(WAIT_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT_S)


def test_v1alpha_reflection_describes_the_api_and_both_reflection_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {*NAMES, "grpc.reflection.v1alpha.ServerReflection", V1_SERVICE} <= services
    pool = descriptor_pool.DescriptorPool(database)
    subscribe = pool.FindServiceByName("faultcast.v1.Alerts").methods_by_name["Subscribe"]
    assert subscribe.output_type.full_name == "faultcast.v1.SubscribeResponse"
    v1 = pool.FindServiceByName(V1_SERVICE).methods_by_name["ServerReflectionInfo"]
    assert v1.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"


def _v1_call(channel: grpc.Channel, requests: list[Message], response: type[Message]) -> list[Message]:
    call = channel.stream_stream(
        V1_METHOD,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )
    return list(call(iter(requests), timeout=WAIT_S))


def _files(response: Message) -> list[descriptor_pb2.FileDescriptorProto]:
    raw = response.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
    return [descriptor_pb2.FileDescriptorProto.FromString(blob) for blob in raw]


def test_a_v1_client_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    # First contact: the v1 method, asked for its own file, in v1alpha's messages (the same bytes).
    (first,) = _v1_call(
        channel,
        [reflection_pb2.ServerReflectionRequest(file_containing_symbol=V1_SERVICE)],
        reflection_pb2.ServerReflectionResponse,
    )
    (v1_file,) = _files(first)
    assert (v1_file.name, v1_file.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    v1alpha_file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(v1alpha_file)
    assert [(m.name, [(f.name, f.number) for f in m.field]) for m in v1_file.message_type] == [
        (m.name, [(f.name, f.number) for f in m.field]) for m in v1alpha_file.message_type
    ]
    # From here on the client speaks the v1 messages as the server described them.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(v1_file)
    # Classes made at run time from the server's descriptor: nothing for the type checker to know.
    request: Any = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest")
    )
    response = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse")
    )
    listed, described = _v1_call(
        channel,
        [request(list_services=""), request(file_containing_symbol="faultcast.v1.Alerts")],
        response,
    )
    services = {s.name for s in listed.list_services_response.service}  # type: ignore[attr-defined]
    assert {*NAMES, V1_SERVICE} <= services
    api = descriptor_pool.DescriptorPool()
    for file in _files(described):  # alerts.proto imports nothing
        api.Add(file)
    method = api.FindServiceByName("faultcast.v1.Alerts").methods_by_name["Subscribe"]
    assert method.output_type.full_name == "faultcast.v1.SubscribeResponse"
    assert method.server_streaming
