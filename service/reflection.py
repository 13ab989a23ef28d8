"""gRPC server reflection, v1 as well as v1alpha.

grpcio-reflection ships only `grpc.reflection.v1alpha`; current tools (grpcurl, Postman, grpc_cli)
ask for `grpc.reflection.v1` first. The two protocols have the same messages with the same field
numbers under another package, so one servicer answers both: the v1alpha servicer, registered as
usual and also under the v1 method name with the v1alpha messages (identical bytes on the wire).
The v1 file descriptor, derived from v1alpha's by renaming the package, joins the default pool so
that clients can describe the v1 service itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer as AsyncReflectionServicer

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


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Put the v1 file in `pool` once (a second server in the process finds it there)."""
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.Add(_v1_file())


def enable_reflection(server: grpc.Server | grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection on `server` for `service_names` (fully qualified, e.g. faultcast.v1.Alerts)
    and for both reflection services (listed whether named or not), over v1alpha and v1. Call it
    once, instead of grpc_reflection's enable_server_reflection, before the server starts."""
    pool = descriptor_pool.Default()  # where the generated stubs registered their files
    _add_v1_descriptor(pool)
    names = tuple(dict.fromkeys((*service_names, V1ALPHA_SERVICE, V1_SERVICE)))  # each listed once
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
