"""Xid lines from kernel logs, as the NVIDIA driver writes them, read one line at a time.

The driver prints `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
(older drivers leave out "PCI:", MIG adds " GPU-I:05" after the bus, some add the function ".0"), and at
load `NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`, which ties a bus to a UUID. Where the line came from
decides how it is stamped, and each stamp is read here:

    dmesg -T              [Mon Mar  4 10:11:12 2024] NVRM: ...          local time (--timezone), no host
    dmesg                 [12345.678901] NVRM: ...                       seconds since boot: needs --boot-time
    syslog, kern.log,     Mar  4 10:11:12 gpu-07 kernel: NVRM: ...      local time without a year (--year, else
    journalctl (short)                                                  the file's modification time), host
    rsyslog RFC 3339,     2024-03-04T10:11:12.123456+00:00 gpu-07 kernel: NVRM: ...  (a stamp without a zone
    journalctl short-iso                                                is local time), host
    journalctl short-full Mon 2024-03-04 10:11:12 UTC gpu-07 kernel: NVRM: ...
    journalctl short-unix 1709547072.123456 gpu-07 kernel: NVRM: ...

A syslog line may carry the kernel's own `[12345.678]` after "kernel:"; the syslog stamp is used. The node is
the line's host field; a file without one (dmesg) takes the name given with the file (NODE=PATH) or else its
file name up to the first dot. The GPU index comes from a map the operator gives (`GpuMap`: nvidia-smi's
index and PCI bus id per node); the kernel log's own "GPU at" lines give the UUID.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                        "nov", "dec"), start=1)}  # fmt: skip

# The driver's Xid line: the bus (optionally "PCI:", a function, a MIG instance), the code, the rest.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
    r"(?: GPU-I:\d+)?\): (?P<xid>\d+)\b,?\s*(?P<rest>.*)$"
)
_GPU_AT = re.compile(
    r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?: "
    r"(?P<uuid>GPU-[0-9A-Fa-f-]+)"
)
_BUS = re.compile(r"(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?")

# Stamps at the start of a line (see the module docstring).
_ISO = re.compile(
    r"(?P<stamp>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<zone>Z|[+-]\d{2}:?\d{2})?\s+(?P<host>\S+)\s"
)
_FULL = re.compile(
    r"[A-Z][a-z]{2} (?P<stamp>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) (?P<zone>[A-Za-z][\w+-]*) "
    r"(?P<host>\S+)\s"
)
_DMESG_T = re.compile(
    r"\[\s*(?:[A-Z][a-z]{2}\s+)?(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<time>\d{2}:\d{2}:\d{2})"
    r"\s+(?P<year>\d{4})\s*\]"
)
_SYSLOG = re.compile(
    r"(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:\.\d+)?\s+(?P<host>\S+)\s"
)
_UNIX = re.compile(r"(?P<stamp>\d{9,11}(?:\.\d+)?)\s+(?P<host>\S+)\s")
_UPTIME = re.compile(r"\[\s*(?P<up>\d+\.\d+)\s*\]")


class KernelLogError(ValueError):
    """A kernel log cannot be read as asked; the message names the file and line and what to do."""


def bus_key(text: str) -> str:
    """A PCI bus id as one key: "00000000:3B:00.0", "PCI:0000:3b:00" and "0000:3b:00" all give "0000:3b:00"."""
    found = _BUS.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a PCI bus id (domain:bus:device[.function])")
    domain, bus, device = (int(part, 16) for part in found.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def short_host(name: str) -> str:
    """A host name without its domain ("gpu-07.cluster.local" -> "gpu-07"); an IP address stays whole."""
    head = name.split(".", 1)[0]
    return name if head.isdigit() else head


@dataclass(frozen=True, slots=True)
class XidLine:
    """One Xid as the driver logged it."""

    time_s: float
    node: str
    bus: str  # bus_key form
    xid: int
    text: str  # the driver's message from "NVRM:" on
    where: str  # file:line


@dataclass
class KernelLogStats:
    """What reading the kernel logs saw; the counts the summary reports."""

    lines: int = 0
    xid_lines: int = 0
    unparseable: int = 0  # NVRM Xid lines whose stamp or shape could not be read
    first_unparseable: str = ""
    assumptions: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class KernelLogSource:
    """One kernel log file and how to read its stamps.

    `node` names the node for lines without a host field; `year` is the year of the file's first line
    for syslog stamps that carry none (None: from the file's modification time); `boot_s` is the node's
    boot time in unix seconds for `[uptime]` stamps; `zone` is the time zone of local-time stamps.
    """

    path: Path
    node: str
    zone: ZoneInfo
    year: int | None = None
    boot_s: float | None = None
    short_hosts: bool = False


def read_kernel_log(
    source: KernelLogSource, stats: KernelLogStats, uuids: dict[tuple[str, str], str]
) -> Iterator[XidLine]:
    """The Xid lines of one file, in file order, read line by line (memory stays flat whatever the size).

    Records bus -> UUID from "GPU at" lines in `uuids` ((node, bus) -> uuid); counts in `stats`. Raises
    KernelLogError naming file:line when the file stamps lines with seconds since boot and no boot time
    was given, since no line of it could be placed in time."""
    year = _YearGuess(source)
    with source.path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            stats.lines += 1
            at = raw.find("NVRM: ")
            if at < 0:
                continue
            message = raw[at:].rstrip("\r\n")
            is_xid = message.startswith("NVRM: Xid")
            if not is_xid and not message.startswith("NVRM: GPU at"):
                continue
            where = f"{source.path}:{number}"
            if is_xid:
                stats.xid_lines += 1
            stamp = _stamp(raw[:at], source, year, where)
            if stamp is None:
                if is_xid:
                    _unparseable(stats, where, "no time stamp this reader knows")
                continue
            when, host = stamp
            node = (short_host(host) if source.short_hosts else host) if host else source.node
            if not is_xid:
                found_at = _GPU_AT.search(message)
                if found_at:
                    uuids[(node, bus_key(found_at["bus"]))] = found_at["uuid"]
                continue
            found = _XID.search(message)
            if found is None:
                _unparseable(stats, where, "not the driver's Xid shape")
                continue
            yield XidLine(when, node, bus_key(found["bus"]), int(found["xid"]), message, where)
    stats.assumptions.extend(year.assumed())


def _unparseable(stats: KernelLogStats, where: str, why: str) -> None:
    stats.unparseable += 1
    if not stats.first_unparseable:
        stats.first_unparseable = f"{where} ({why})"


def _stamp(prefix: str, source: KernelLogSource, year: _YearGuess, where: str) -> tuple[float, str] | None:
    """(unix seconds, host or "") from the text before "NVRM:"; None when no known stamp starts it."""
    text = prefix.lstrip()
    if found := _ISO.match(text):
        return _iso_seconds(found["stamp"], found["zone"], source.zone), found["host"]
    if found := _FULL.match(text):
        zone = found["zone"]
        named = dt.UTC if zone in ("UTC", "GMT") else source.zone
        return dt.datetime.fromisoformat(found["stamp"]).replace(tzinfo=named).timestamp(), found["host"]
    if found := _DMESG_T.match(text):
        seconds = _local(
            int(found["year"]), found["mon"], int(found["day"]), found["time"], source.zone, where
        )
        return seconds, ""
    if found := _SYSLOG.match(text):
        month = _month(found["mon"], where)
        seconds = _local(year.of(month, int(found["day"])), found["mon"], int(found["day"]), found["time"],
                         source.zone, where)  # fmt: skip
        return seconds, found["host"]
    if found := _UNIX.match(text):
        return float(found["stamp"]), found["host"]
    if found := _UPTIME.match(text):
        if source.boot_s is None:
            raise KernelLogError(
                f"{where}: this log stamps lines with seconds since boot ([{found['up']}]), which need the "
                f"node's boot time: pass --boot-time {source.node}=TIME (`uptime -s` on the node, or "
                "`journalctl --list-boots`), or capture the log with `dmesg -T` or `journalctl -k -o short-iso`"
            )
        return source.boot_s + float(found["up"]), ""
    return None


def _iso_seconds(stamp: str, zone: str | None, local: ZoneInfo) -> float:
    moment = dt.datetime.fromisoformat(stamp.replace(",", ".").replace(" ", "T"))
    if zone is None:
        return moment.replace(tzinfo=local).timestamp()
    if zone == "Z":
        return moment.replace(tzinfo=dt.UTC).timestamp()
    sign = 1 if zone[0] == "+" else -1
    digits = zone[1:].replace(":", "")
    offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return moment.replace(tzinfo=dt.timezone(sign * offset)).timestamp()


def _month(name: str, where: str) -> int:
    try:
        return _MONTHS[name.lower()]
    except KeyError:
        raise KernelLogError(f"{where}: {name!r} is not a month") from None


def _local(year: int, month: str, day: int, clock: str, zone: ZoneInfo, where: str) -> float:
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    try:
        moment = dt.datetime(year, _month(month, where), day, hours, minutes, seconds, tzinfo=zone)
    except ValueError as exc:
        raise KernelLogError(f"{where}: {month} {day} {clock} {year} is not a time ({exc})") from None
    return moment.timestamp()


class _YearGuess:
    """The year of syslog stamps, which carry none: --year is the year of the file's first line (a month
    going backwards, December to January, starts the next year); without it, the year of the file's last
    write, taking a date later in the year than that write as the year before."""

    def __init__(self, source: KernelLogSource) -> None:
        self.given = source.year
        self.path = source.path
        self.current = source.year or 0
        self.last_month = 0
        written = dt.datetime.fromtimestamp(source.path.stat().st_mtime, tz=source.zone)
        self.written = (written.year, written.month, written.day)
        self.used: set[int] = set()

    def of(self, month: int, day: int) -> int:
        if self.given is not None:
            if month < self.last_month:
                self.current += 1
            self.last_month = month
            self.used.add(self.current)
            return self.current
        year, w_month, w_day = self.written
        guess = year if (month, day) <= (w_month, w_day) else year - 1
        self.used.add(guess)
        return guess

    def assumed(self) -> list[str]:
        if not self.used or self.given is not None:
            return []
        years = ", ".join(str(y) for y in sorted(self.used))
        return [
            f"{self.path}: syslog stamps carry no year; took {years} from the file's modification time "
            "(pass --year for the year of its first line)"
        ]


class GpuMap:
    """GPU index (and UUID) by node and PCI bus, from `nvidia-smi --query-gpu=index,pci.bus_id,uuid
    --format=csv` run on each node; a file may hold many nodes when it has a `node` (or `hostname`) column."""

    def __init__(self) -> None:
        self.by_bus: dict[tuple[str, str], tuple[int, str]] = {}

    def __len__(self) -> int:
        return len(self.by_bus)

    def gpu(self, node: str, bus: str) -> tuple[int, str] | None:
        """(index, uuid or "") of the GPU at `bus` on `node`; None when the map does not know it."""
        return self.by_bus.get((node, bus))

    def read(self, path: Path, node: str) -> None:
        """Adds one nvidia-smi CSV (`node` names the node when the file has no node column); raises
        KernelLogError naming file:line on a row that is not an index and a bus id."""
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle, skipinitialspace=True))
        header = [h.strip().lower() for h in rows[0]] if rows else []
        named = "pci.bus_id" in header or "index" in header
        columns = header if named else ["index", "pci.bus_id", "uuid"][: len(header)]
        start = 2 if named else 1
        for number, row in enumerate(rows[1:] if named else rows, start=start):
            if not row or not "".join(row).strip():
                continue
            values = dict(zip(columns, (v.strip() for v in row), strict=False))
            where = f"{path}:{number}"
            try:
                index = int(values["index"])
                bus = bus_key(values["pci.bus_id"])
            except (KeyError, ValueError) as exc:
                raise KernelLogError(
                    f"{where}: expected nvidia-smi --query-gpu=index,pci.bus_id[,uuid] --format=csv rows, "
                    f"got {','.join(row)!r} ({exc})"
                ) from None
            owner = values.get("node") or values.get("hostname") or node
            self.by_bus[(owner, bus)] = (index, values.get("uuid", ""))
