"""The service's edge: the gRPC servicers, who may call what, caller limits, sample validation,
health and reflection."""
