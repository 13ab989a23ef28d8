"""The network source: interfaces from procfs, InfiniBand/RoCE ports from sysfs, TCP counters, peer probes.

Every file is read once per `read()`, without pandas: this runs every second. One unreadable file
never sinks the read: its values become NaN, `read_errors` counts it, and the last error message of
each path is kept in `last_errors` (logged at debug, once per new message).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Collection, Iterable
from pathlib import Path

from faultcast.catalogue import Scope
from faultcast.collector.probes import PeerProber
from faultcast.readings import DeviceReading, Reading, pack

log = logging.getLogger(__name__)

NAN = math.nan

# /proc/net/dev columns after "name:": 8 receive fields, then 8 transmit fields.
_DEV_COLUMNS: tuple[tuple[str, int], ...] = (
    ("net_rx_bytes", 0),
    ("net_rx_packets", 1),
    ("net_rx_errors", 2),
    ("net_rx_dropped", 3),
    ("net_tx_bytes", 8),
    ("net_tx_packets", 9),
    ("net_tx_errors", 10),
    ("net_tx_dropped", 11),
)
_DEV_FIELDS = 16

_TCP_FIELDS: tuple[tuple[str, str], ...] = (
    ("RetransSegs", "tcp_retrans_segs"),
    ("OutSegs", "tcp_out_segs"),
    ("InErrs", "tcp_in_errs"),
)

# ports/N/counters/<file>: catalogue name "ib_<file>", value multiplied by the scale.
_IB_COUNTERS: tuple[tuple[str, int], ...] = (
    ("symbol_error", 1),
    ("link_downed", 1),
    ("link_error_recovery", 1),
    ("port_rcv_errors", 1),
    ("port_xmit_discards", 1),
    ("local_link_integrity_errors", 1),
    ("excessive_buffer_overrun_errors", 1),
    ("port_rcv_data", 4),  # in units of 4 octets (lanes)
    ("port_xmit_data", 4),
)
# ports/N/hw_counters/<file>, present on mlx5 and others; NaN (not an error) when absent.
_IB_HW_COUNTERS: tuple[str, ...] = (
    "rnr_nak_retry_err",
    "local_ack_timeout_err",
    "out_of_sequence",
    "packet_seq_err",
)


def _leading_number(text: str) -> float:
    """The number a sysfs attribute starts with: "4: ACTIVE" -> 4, "400 Gb/sec (4X NDR)" -> 400."""
    head = text.split(":", 1)[0].split(None, 1)
    if not head:
        raise ValueError(f"no number in {text!r}")
    return float(head[0])


def _port_key(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)


class NetworkSource:
    """Reads interfaces, InfiniBand ports, host TCP counters and (when given a prober) peer round trips.

    `interfaces=None` reads every interface in /proc/net/dev except the loopback "lo"; a collection
    reads exactly those (include "lo" to get it), and a named interface that is missing is reported
    with NaN values, since a vanished interface is itself worth seeing. The source owns `prober`:
    the caller starts it, `close()` closes it.
    """

    name = "network"

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        *,
        interfaces: Collection[str] | None = None,
        prober: PeerProber | None = None,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.interfaces = None if interfaces is None else tuple(dict.fromkeys(interfaces))
        self.prober = prober
        self.read_errors = 0
        self.last_errors: dict[str, str] = {}

    # -- error bookkeeping -------------------------------------------------------------------

    def _error(self, path: str, exc: BaseException) -> None:
        self.read_errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if self.last_errors.get(path) != message:
            log.debug("network source: cannot read %s: %s", path, message)
        self.last_errors[path] = message

    def _read_text(self, path: str) -> str | None:
        """The file's text, or None after recording the error."""
        try:
            with open(path, "rb") as f:
                return f.read().decode("ascii", "replace")
        except OSError as exc:  # EINVAL/EIO from a driver, EACCES, ENOENT for a vanished device
            self._error(path, exc)
            return None

    # -- procfs ------------------------------------------------------------------------------

    def _read_interfaces(self) -> list[DeviceReading]:
        path = os.path.join(self.proc_root, "net", "dev")
        text = self._read_text(path)
        found: dict[str, dict[str, float]] = {}
        for line in (text or "").splitlines()[2:]:  # two header lines
            name, sep, rest = line.partition(":")
            name = name.strip()
            if not sep or not name:
                continue
            if self.interfaces is None and name == "lo":
                continue
            if self.interfaces is not None and name not in self.interfaces:
                continue
            fields = rest.split()
            if len(fields) < _DEV_FIELDS:
                self._error(f"{path}:{name}", ValueError(f"{len(fields)} fields, expected {_DEV_FIELDS}"))
                found[name] = {}
                continue
            try:
                found[name] = {metric: float(fields[col]) for metric, col in _DEV_COLUMNS}
            except ValueError as exc:
                self._error(f"{path}:{name}", exc)
                found[name] = {}
        names: Iterable[str] = found if self.interfaces is None else self.interfaces
        return [DeviceReading(Scope.INTERFACE, n, pack(Scope.INTERFACE, found.get(n, {}))) for n in names]

    def _read_host(self) -> tuple[float, ...]:
        path = os.path.join(self.proc_root, "net", "snmp")
        text = self._read_text(path)
        if text is None:
            return pack(Scope.HOST, {})
        header: list[str] | None = None
        values: list[str] | None = None
        for line in text.splitlines():  # "Tcp: Name Name ..." then "Tcp: 1 200 ..."
            if not line.startswith("Tcp:"):
                continue
            if header is None:
                header = line.split()[1:]
            else:
                values = line.split()[1:]
                break
        if header is None or values is None or len(header) != len(values):
            self._error(path, ValueError("no well-formed Tcp header/value line pair"))
            return pack(Scope.HOST, {})
        row = dict(zip(header, values, strict=True))
        out: dict[str, float] = {}
        for field, metric in _TCP_FIELDS:
            try:
                out[metric] = float(row[field])
            except (KeyError, ValueError) as exc:
                self._error(f"{path}:Tcp:{field}", exc)
        return pack(Scope.HOST, out)

    # -- sysfs -------------------------------------------------------------------------------

    def _read_ib(self) -> list[DeviceReading]:
        base = os.path.join(self.sys_root, "class", "infiniband")
        try:
            devices = sorted(os.listdir(base))
        except FileNotFoundError:
            return []  # no InfiniBand/RoCE stack on this node
        except OSError as exc:
            self._error(base, exc)
            return []
        out: list[DeviceReading] = []
        for dev in devices:
            ports_dir = os.path.join(base, dev, "ports")
            try:
                ports = sorted(os.listdir(ports_dir), key=_port_key)
            except FileNotFoundError:
                continue  # the device vanished between the two listings
            except OSError as exc:
                self._error(ports_dir, exc)
                continue
            for port in ports:
                reading = self._read_port(os.path.join(ports_dir, port), f"{dev}:{port}")
                if reading is not None:
                    out.append(reading)
        return out

    def _read_port(self, port_dir: str, device: str) -> DeviceReading | None:
        errors: list[tuple[str, BaseException]] = []

        def number(path: str, *, counter: bool) -> float:
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("ascii", "replace")
                return float(text) if counter else _leading_number(text)
            except (OSError, ValueError) as exc:  # "N/A", EINVAL, EIO, a vanished port
                errors.append((path, exc))
                return NAN

        values: dict[str, float] = {}
        counters = os.path.join(port_dir, "counters")
        for counter, scale in _IB_COUNTERS:
            values[f"ib_{counter}"] = number(os.path.join(counters, counter), counter=True) * scale
        hw_dir = os.path.join(port_dir, "hw_counters")
        try:
            present = set(os.listdir(hw_dir))
        except OSError:
            present = set()
        for counter in _IB_HW_COUNTERS:
            if counter in present:
                values[f"ib_{counter}"] = number(os.path.join(hw_dir, counter), counter=True)
        values["ib_port_state"] = number(os.path.join(port_dir, "state"), counter=False)
        values["ib_port_phys_state"] = number(os.path.join(port_dir, "phys_state"), counter=False)
        values["ib_port_rate_gbps"] = number(os.path.join(port_dir, "rate"), counter=False)
        if errors:
            if not os.path.isdir(port_dir):
                log.debug("network source: %s vanished during the read", device)
                return None
            for path, exc in errors:
                self._error(path, exc)
        return DeviceReading(Scope.IB_PORT, device, pack(Scope.IB_PORT, values))

    # -- peers -------------------------------------------------------------------------------

    def _read_peers(self) -> list[DeviceReading]:
        if self.prober is None:
            return []
        return [
            DeviceReading(
                Scope.PEER,
                pid,
                pack(
                    Scope.PEER,
                    {
                        "peer_rtt_p50_seconds": s.p50_seconds,
                        "peer_rtt_p99_seconds": s.p99_seconds,
                        "peer_loss_ratio": s.loss_ratio,
                        "peer_probes": s.probes,
                    },
                ),
            )
            for pid, s in self.prober.stats().items()
        ]

    # -- Source ------------------------------------------------------------------------------

    def read(self) -> Reading:
        """Interfaces, InfiniBand ports and peers as devices, the TCP counters as host values."""
        devices = [*self._read_interfaces(), *self._read_ib(), *self._read_peers()]
        return Reading(devices=tuple(devices), host=self._read_host())

    def close(self) -> None:
        """Close the prober, if any."""
        if self.prober is not None:
            self.prober.close()
