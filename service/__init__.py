"""The prediction service: telemetry ingest, scoring, alerts and remediation."""
