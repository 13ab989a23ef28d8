"""The per-node collector: sources (NVML, network, simulated), the Prometheus exporter and gRPC shipping.

What a user runs a collector from is importable from here (`from faultcast.collector import
NodeCollector, NvmlSource`). Each name loads its module on first use (PEP 562): importing one part
(the spool, a source) does not load the others, and their modules import each other through here
without a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faultcast.lazy_exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
