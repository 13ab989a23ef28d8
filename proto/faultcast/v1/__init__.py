"""Generated protobuf and gRPC code for the faultcast.v1 API, from proto/faultcast_api/v1/*.proto
(proto/generate.py)."""
