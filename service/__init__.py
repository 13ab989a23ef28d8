"""The prediction service: telemetry ingest, scoring, alerts and remediation.

What a user builds a service from is importable from here (`from faultcast.service import Service,
ServiceConfig`). Each name loads its module on first use (PEP 562): `faultcast serve`'s flags import
faultcast.service.config, and importing this package must not load the model stack (LightGBM) for that.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faultcast.service.config import ServiceConfig
    from faultcast.service.remediation.actuators import Actuator, NoopActuator, RetryPolicy, WebhookActuator
    from faultcast.service.rpc.limits import CallerLimits
    from faultcast.service.rpc.validation import Limits
    from faultcast.service.server import Service

__all__ = [
    "Actuator",
    "CallerLimits",
    "Limits",
    "NoopActuator",
    "RetryPolicy",
    "Service",
    "ServiceConfig",
    "WebhookActuator",
]

# Each public name's module.
_HOME = {
    "Actuator": "faultcast.service.remediation.actuators",
    "CallerLimits": "faultcast.service.rpc.limits",
    "Limits": "faultcast.service.rpc.validation",
    "NoopActuator": "faultcast.service.remediation.actuators",
    "RetryPolicy": "faultcast.service.remediation.actuators",
    "Service": "faultcast.service.server",
    "ServiceConfig": "faultcast.service.config",
    "WebhookActuator": "faultcast.service.remediation.actuators",
}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
