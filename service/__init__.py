"""The prediction service: telemetry ingest, scoring, alerts and remediation.

What a user builds a service from is importable from here (`from faultcast.service import Service,
ServiceConfig`). Each name loads its module on first use (PEP 562): `faultcast serve`'s flags import
faultcast.service.config, and importing this package must not load the model stack (LightGBM) for that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultcast.lazy_exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
