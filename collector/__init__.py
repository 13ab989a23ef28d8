"""The per-node collector: sources (NVML, network, simulated), the Prometheus exporter and gRPC shipping.

What a user runs a collector from is importable from here (`from faultcast.collector import
NodeCollector, NvmlSource`). Each name loads its module on first use (PEP 562): importing one part
(the spool, a source) does not load the others, and their modules import each other through here
without a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from faultcast.collector.agent import NodeCollector
    from faultcast.collector.exporter import SnapshotExporter, start_metrics_server
    from faultcast.collector.network import NetworkSource
    from faultcast.collector.nvml.source import NvmlSource
    from faultcast.collector.shipper import Shipper
    from faultcast.collector.source import Source
    from faultcast.collector.spool import Spool

__all__ = [
    "NetworkSource",
    "NodeCollector",
    "NvmlSource",
    "Shipper",
    "SnapshotExporter",
    "Source",
    "Spool",
    "start_metrics_server",
]

# Each public name's module.
_HOME = {
    "NodeCollector": "faultcast.collector.agent",
    "SnapshotExporter": "faultcast.collector.exporter",
    "start_metrics_server": "faultcast.collector.exporter",
    "NetworkSource": "faultcast.collector.network",
    "NvmlSource": "faultcast.collector.nvml.source",
    "Shipper": "faultcast.collector.shipper",
    "Source": "faultcast.collector.source",
    "Spool": "faultcast.collector.spool",
}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
