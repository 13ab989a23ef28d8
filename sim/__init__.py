"""The fleet digital twin: GPU and network telemetry with realistic failure modes and their logs."""
