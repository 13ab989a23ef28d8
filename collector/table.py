"""Plain-text renderings of a snapshot for a terminal: the live table and the closing summary."""

from __future__ import annotations

import datetime as dt
import math

from faultcast.catalogue import Scope
from faultcast.readings import NodeSnapshot

# (header, metric, format): the handful of values an operator glances at.
_GPU_COLUMNS = (
    ("gpu", None, "{:>3}"),
    ("temp", "gpu_temp", "{:>5.0f}"),
    ("hbm", "memory_temp", "{:>5.0f}"),
    ("power", "power_usage", "{:>7.1f}"),
    ("sm_mhz", "sm_clock", "{:>7.0f}"),
    ("util", "gpu_util", "{:>5.0f}"),
    ("sbe", "ecc_sbe_volatile", "{:>5.0f}"),
    ("dbe", "ecc_dbe_volatile", "{:>5.0f}"),
    ("remap", "row_remap_pending", "{:>6.0f}"),
    ("pcie_rp", "pcie_replay", "{:>8.0f}"),
    ("nvl_crc", "nvlink_crc_flit_errors", "{:>8.0f}"),
    ("xid", "xid_last", "{:>4.0f}"),
    ("nvml_ms", "nvml_call_seconds", "{:>8.2f}"),
)


def _cell(fmt: str, value: float, scale: float = 1.0) -> str:
    width = len(fmt.format(0))
    return "-".rjust(width) if math.isnan(value) else fmt.format(value * scale)


def render_table(snapshot: NodeSnapshot) -> str:
    """A few lines for a terminal: a title, one row per GPU, one per InfiniBand port and peer."""
    header = " ".join(
        fmt.format(h) if "f" not in fmt else h.rjust(len(fmt.format(0))) for h, _, fmt in _GPU_COLUMNS
    )
    moment = dt.datetime.fromtimestamp(snapshot.time_unix_nano / 1e9, tz=dt.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    title = f"{snapshot.node}  {moment}" + (f"  sample {snapshot.sequence}" if snapshot.sequence else "")
    lines = [title, header]
    for gpu in snapshot.gpus:
        cells = [f"{gpu.index:>3}"]
        for _, metric, fmt in _GPU_COLUMNS[1:]:
            assert metric is not None
            cells.append(_cell(fmt, gpu.get(metric), 1000.0 if metric == "nvml_call_seconds" else 1.0))
        lines.append(" ".join(cells) + ("  LOST (fallen off the bus)" if gpu.lost else ""))
    for device in snapshot.devices:
        if device.scope is Scope.IB_PORT:
            lines.append(
                f"  ib {device.device:<10} state {device.get('ib_port_state'):.0f} "
                f"symbol_err {device.get('ib_symbol_error'):.0f} "
                f"rcv_err {device.get('ib_port_rcv_errors'):.0f} "
                f"link_down {device.get('ib_link_downed'):.0f}"
            )
        elif device.scope is Scope.PEER:
            lines.append(
                f"  peer {device.device:<20} p50 {device.get('peer_rtt_p50_seconds') * 1e6:.0f} us "
                f"p99 {device.get('peer_rtt_p99_seconds') * 1e6:.0f} us "
                f"loss {device.get('peer_loss_ratio'):.2f}"
            )
    return "\n".join(lines)
