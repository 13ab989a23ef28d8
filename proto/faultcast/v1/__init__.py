"""Generated protobuf and gRPC code for the faultcast.v1 API (see the .proto files beside it)."""
