"""gRPC server reflection, v1 as well as v1alpha.

grpcio-reflection ships only `grpc.reflection.v1alpha`; current tools (grpcurl, Postman, grpc_cli)
ask for `grpc.reflection.v1` first. The two protocols have the same messages with the same field
numbers under another package, so one servicer answers both: the v1alpha servicer, registered as
usual and also under the v1 method name with the v1alpha messages (identical bytes on the wire).
The v1 file descriptor, derived from v1alpha's by renaming the package, is served too, so that
clients can describe the v1 service itself.

What is described comes from a pool made for the purpose: the files of the services named, taken
from faultcast's own pool (faultcast.v1.pool, where faultcast's stubs live) first and from
protobuf's default pool (grpc's health and reflection) after it. The default pool may also hold a
third party's stubs of faultcast's .proto files from another revision, with the same names: the
service describes its own API, never theirs.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer as AsyncReflectionServicer

from faultcast.v1.pool import POOL

V1ALPHA_SERVICE = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"
_V1ALPHA_PACKAGE = reflection_pb2.DESCRIPTOR.package


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """The v1 reflection.proto: v1alpha's descriptor under the v1 package, with v1's file options."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name, proto.package = V1_FILE, V1_PACKAGE
    old, new = f".{_V1ALPHA_PACKAGE}.", f".{V1_PACKAGE}."
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    proto.options.Clear()
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    proto.options.java_multiple_files = True
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.java_outer_classname = "ServerReflectionProto"
    return proto


def _service_file(name: str) -> descriptor.FileDescriptor:
    """The file that defines service `name`: faultcast's own pool first, then the default pool."""
    for source in (POOL, descriptor_pool.Default()):
        try:
            return source.FindServiceByName(name).file
        except KeyError:
            continue
    raise KeyError(f"no descriptor of service {name!r}: import its generated module first")


def _add_file(pool: descriptor_pool.DescriptorPool, file: descriptor.FileDescriptor) -> None:
    """Put `file` in `pool` after its imports, each file once."""
    try:
        pool.FindFileByName(file.name)
        return
    except KeyError:
        pass
    for dependency in file.dependencies:
        _add_file(pool, dependency)
    pool.AddSerializedFile(file.serialized_pb)


def reflection_pool(service_names: Iterable[str]) -> descriptor_pool.DescriptorPool:
    """A pool with the files of `service_names` (and their imports) and the v1 reflection file."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_v1_file())
    for name in service_names:
        if name != V1_SERVICE:
            _add_file(pool, _service_file(name))
    return pool


def enable_reflection(server: grpc.Server | grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection on `server` for `service_names` (fully qualified, e.g. faultcast.v1.Alerts)
    and for both reflection services (listed whether named or not), over v1alpha and v1. Call it
    once, instead of grpc_reflection's enable_server_reflection, before the server starts."""
    names = tuple(dict.fromkeys((*service_names, V1ALPHA_SERVICE, V1_SERVICE)))  # each listed once
    pool = reflection_pool(names)
    servicer: reflection_pb2_grpc.ServerReflectionServicer = (
        AsyncReflectionServicer(names, pool=pool)
        if isinstance(server, grpc.aio.Server)
        else reflection.ReflectionServicer(names, pool=pool)
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
