"""Slurm's record of nodes going down or drained, and what their reasons say broke.

Two records exist:
- `sacctmgr show event` (node history, kept by slurmdbd): run it as
  `sacctmgr -P show event All_Time format=NodeName,TimeStart,TimeEnd,State,Reason,User` (or `Start=...`),
  and pass the text with --slurm-events. It is read with or without the header (-n), parsable with `|`
  (-p or -P) or in sacctmgr's fixed-width table (columns from the dashed line; sacctmgr cuts long reasons
  there). TimeStart and TimeEnd are local time without a zone ("Unknown" while the event is open).
- `sinfo -R` (the reasons nodes are down, drained or failing now, with the time each was set): read live,
  `sinfo -R -N -h -o "%N|%H|%T|%U|%E"`.
`--from-slurm` runs both against the cluster this machine reaches (SLURM_CONF), with TZ=UTC so the stamps
are UTC; without accounting (AccountingStorageType=accounting_storage/none, as in the test suite's local
cluster, which runs no slurmdbd) sacctmgr has no history and only the current reasons are read, which the
summary says.

A reason is read by `ReasonRules`: faultcast's own drains for a prediction ("faultcast alert N: ...", the
Slurm actuator's reason) are not failures; its drains for a failure it saw happen ("faultcast failure N:
xid 79 detachment ...") are, with the mode they name, except a node gone silent (a collector crash or a
network cut looks the same), which is unexplained; planned maintenance is not a failure; a reason that names a cause
gets that cause's mode; the rest is counted as unexplained and not guessed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from zoneinfo import ZoneInfo

from faultcast.modes import FailureMode
from faultcast.xid_catalogue import XidKind, lookup

SACCTMGR_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason", "User")
"""The columns --slurm-events reads, in the order assumed when the text has no header."""
SINFO_FORMAT = "%N|%H|%T|%U|%E"
"""`sinfo -R -N -h -o` format read live: node, reason time, state, user(uid), reason (last: it may hold |)."""
FAULTCAST_REASON = re.compile(r"^\s*faultcast alert \d+:", re.IGNORECASE)
"""How the Slurm actuator's drains for a prediction begin (faultcast.service.remediation.actuators.
Remediation.reason)."""
FAULTCAST_FAILURE = re.compile(r"^\s*faultcast failure \d+: (?:xid (\d+)|(\w+)) (\w+)", re.IGNORECASE)
"""How its drains for a failure that happened (a FAILED event) begin: the evidence, then the mode."""


class SlurmEventError(ValueError):
    """Slurm's text cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node going down or drained, with the reason given."""

    time_s: float
    node: str
    state: str
    reason: str
    user: str
    where: str  # file:line, or the command that printed it


class Verdict(StrEnum):
    """What a reason means for the failure log."""

    FAILURE = "failure"
    PREDICTION = "prediction"  # faultcast's own drain
    PLANNED = "planned"  # maintenance, reboots asked for, upgrades
    APPLICATION = "application"  # names an application Xid
    INFORMATIONAL = "informational"  # names an informational Xid
    UNEXPLAINED = "unexplained"


@dataclass(frozen=True, slots=True)
class Reading:
    verdict: Verdict
    mode: str = ""
    xid: int | None = None


_I = re.IGNORECASE
# First match wins; the Xid number, when a reason names one, goes through the Xid catalogue instead.
_RULES: tuple[tuple[re.Pattern[str], Verdict, str], ...] = (
    (re.compile(r"fell off|fallen off|off the bus|\botb\b|gres/gpu count|gpu (?:missing|lost|not found)", _I),
     Verdict.FAILURE, FailureMode.DETACHMENT),
    (re.compile(r"nvlink|nvswitch|fabric ?manager", _I), Verdict.FAILURE, FailureMode.NVLINK),
    (re.compile(r"\bdbe\b|double[- ]bit|\becc\b|uncorrectable|row[- ]?remap|retired page|page retire|\bhbm",
                _I), Verdict.FAILURE, FailureMode.HBM_WEAR),
    (re.compile(r"\bgsp\b", _I), Verdict.FAILURE, FailureMode.FIRMWARE),
    (re.compile(r"\bnccl\b", _I), Verdict.FAILURE, FailureMode.NCCL_TIMEOUT),
    (re.compile(r"\b(?:ib|infiniband|hca|roce|rdma)\b|\bmlx\d|\bib\d|link (?:down|flap)", _I),
     Verdict.FAILURE, FailureMode.INFINIBAND),
    (re.compile(r"\bpcie?\b|pci-e|\baer\b|link width|downtrain", _I), Verdict.FAILURE, FailureMode.PCIE),
    (re.compile(r"thermal|overheat|temperature|\bfans?\b|cooling|coolant", _I), Verdict.FAILURE,
     FailureMode.COOLING),
    (re.compile(r"\bpower\b|\bpsu\b|\bpdu\b|power[- ]brake", _I), Verdict.FAILURE, FailureMode.POWER),
    (re.compile(r"not responding|kill task failed|unexpectedly rebooted|batch job complete failure|"
                r"\bdimm\b|machine check|\bmce\b|\bbmc\b|\bssd\b|\bnvme\b|\bdisk\b|hardware|\bhw\b", _I),
     Verdict.FAILURE, FailureMode.HOST),
    (re.compile(r"reboot (?:requested|asap|issued)|^\s*reboot\b|\bmaint(?:enance)?\b|\bupgrad|\bupdat|"
                r"\breinstall|\bplanned\b|\bscheduled\b|\bprovision", _I), Verdict.PLANNED, ""),
)  # fmt: skip
_XID_IN_REASON = re.compile(r"\bxid\s*[:#=]?\s*(\d+)", _I)


class ReasonRules:
    """Reads a drain or down reason. `extra` are the operator's own (pattern, mode) rules, tried first;
    mode "skip" marks a reason as planned."""

    def __init__(self, extra: Iterable[tuple[re.Pattern[str], str]] = ()) -> None:
        self.extra = tuple(extra)

    def read(self, reason: str) -> Reading:
        if FAULTCAST_REASON.match(reason):
            return Reading(Verdict.PREDICTION)
        failed = FAULTCAST_FAILURE.match(reason)
        if failed:  # the service saw it happen: a failure, with the mode its evidence named
            if (failed.group(2) or "").lower() == "node_silent":
                # A collector crash or a network cut looks the same: counted, not guessed.
                return Reading(Verdict.UNEXPLAINED)
            mode = failed.group(3).lower()
            known = mode if mode in {m.value for m in FailureMode} else ""
            return Reading(Verdict.FAILURE, known, int(failed.group(1)) if failed.group(1) else None)
        for pattern, mode in self.extra:
            if pattern.search(reason):
                return Reading(Verdict.PLANNED) if mode == "skip" else Reading(Verdict.FAILURE, mode)
        named = _XID_IN_REASON.search(reason)
        if named:
            code = int(named.group(1))
            entry = lookup(code)
            if entry is not None and entry.kind is XidKind.FAILURE and entry.mode is not None:
                return Reading(Verdict.FAILURE, entry.mode, code)
            if entry is not None and entry.kind is XidKind.APPLICATION:
                return Reading(Verdict.APPLICATION, xid=code)
            if entry is not None and entry.kind is XidKind.INFORMATIONAL:
                return Reading(Verdict.INFORMATIONAL, xid=code)
        for pattern, verdict, mode in _RULES:
            if pattern.search(reason):
                return Reading(
                    verdict, mode, 79 if mode == FailureMode.DETACHMENT and "bus" in reason else None
                )
        return Reading(Verdict.UNEXPLAINED)


def parse_rule(text: str) -> tuple[re.Pattern[str], str]:
    """An operator's --reason 'REGEX=MODE' (split at the last "="); ValueError on a bad one."""
    pattern, sep, mode = text.rpartition("=")
    if not sep or not pattern or not mode:
        raise ValueError(f"{text!r}: expected REGEX=MODE, e.g. 'bad gpu=detachment' or 'burn-in=skip'")
    allowed = {m.value for m in FailureMode} | {"skip", "unknown"}
    if mode not in allowed:
        raise ValueError(f"{text!r}: mode {mode!r} is not one of {', '.join(sorted(allowed))}")
    try:
        return re.compile(pattern, re.IGNORECASE), mode
    except re.error as exc:
        raise ValueError(f"{text!r}: {exc}") from None


# -- sacctmgr show event ---------------------------------------------------------------------------


def read_sacctmgr_events(path: Path, zone: ZoneInfo) -> Iterator[NodeEvent]:
    """Node events from captured `sacctmgr show event` text (see the module docstring); cluster events
    (no node) are left out. Raises SlurmEventError naming file:line on a row it cannot read."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        yield from parse_sacctmgr_events(handle, str(path), zone)


def parse_sacctmgr_events(lines: Iterable[str], name: str, zone: ZoneInfo) -> Iterator[NodeEvent]:
    """As read_sacctmgr_events, from lines already in hand (`name` names them in errors)."""
    columns: list[str] | None = None
    spans: list[tuple[int, int]] | None = None
    pending_header: list[str] | None = None
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        where = f"{name}:{number}"
        if not line.strip():
            continue
        if pending_header is not None and set(line.strip()) <= {"-", " "}:
            spans = [m.span() for m in re.finditer(r"-+", line)]
            columns, pending_header = pending_header, None
            continue
        if columns is None and "TimeStart" in line and "NodeName" in line:
            if "|" in line:
                columns = [c.strip() for c in line.rstrip("|").split("|")]
            else:
                pending_header = line.split()
            continue
        if spans is not None and columns is not None:
            values = [line[a : (b if i + 1 < len(spans) else None)].strip() for i, (a, b) in enumerate(spans)]
        else:
            names = columns or list(SACCTMGR_FIELDS)
            values = _split_parsable(line, names, where)
        event = _event(dict(zip(columns or SACCTMGR_FIELDS, values, strict=False)), where, zone)
        if event is not None:
            yield event


def _split_parsable(line: str, names: list[str], where: str) -> list[str]:
    parts = line.split("|")
    if len(parts) > len(names) and parts[-1] == "":  # -p ends every field with "|"
        parts = parts[:-1]
    if len(parts) > len(names) and "Reason" in names:  # a reason holding "|": join it back
        at, extra = names.index("Reason"), len(parts) - len(names)
        parts = [*parts[:at], "|".join(parts[at : at + extra + 1]), *parts[at + extra + 1 :]]
    if len(parts) != len(names):
        raise SlurmEventError(
            f"{where}: expected {len(names)} '|'-separated fields ({'|'.join(names)}), got {len(parts)}: "
            f"{line[:120]!r} (capture with `sacctmgr -P show event format={','.join(SACCTMGR_FIELDS)}`)"
        )
    return parts


def _event(row: Mapping[str, str], where: str, zone: ZoneInfo) -> NodeEvent | None:
    for needed in ("NodeName", "TimeStart"):
        if needed not in row:
            raise SlurmEventError(f"{where}: the sacctmgr output has no {needed} column")
    node = row["NodeName"].strip()
    if not node:
        return None  # a cluster event
    return NodeEvent(
        parse_slurm_time(row["TimeStart"], zone, where),
        node,
        row.get("State", "").strip(),
        row.get("Reason", "").strip(),
        row.get("User", "").strip(),
        where,
    )


def parse_slurm_time(text: str, zone: ZoneInfo, where: str) -> float:
    """Unix seconds from a Slurm stamp (ISO local time, "%FT%T", as SLURM_TIME_FORMAT=standard prints)."""
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise SlurmEventError(
            f"{where}: {text.strip()!r} is not a Slurm time (YYYY-MM-DDTHH:MM:SS; unset SLURM_TIME_FORMAT "
            "when capturing)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return moment.timestamp()


# -- sinfo -R ------------------------------------------------------------------------------------------


def parse_sinfo_reasons(text: str, name: str, zone: ZoneInfo) -> Iterator[NodeEvent]:
    """Node events from `sinfo -R -N -h -o "%N|%H|%T|%U|%E"` output."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", 4)
        where = f"{name}:{number}"
        if len(parts) != 5:
            raise SlurmEventError(f"{where}: expected node|time|state|user|reason, got {line[:120]!r}")
        node, stamp, state, user, reason = (p.strip() for p in parts)
        if stamp in ("Unknown", "None", ""):
            continue  # a reason without a time cannot be placed
        yield NodeEvent(parse_slurm_time(stamp, zone, where), node, state, reason, user, where)


# -- live ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmQuery:
    """How to reach the cluster: the binaries, extra environment (SLURM_CONF) and a timeout per call."""

    env: Mapping[str, str]
    sacctmgr: str = "sacctmgr"
    sinfo: str = "sinfo"
    scontrol: str = "scontrol"
    timeout_s: float = 60.0


def query_slurm(query: SlurmQuery, start: str, end: str | None) -> tuple[list[NodeEvent], list[str]]:
    """Events from the live cluster: sacctmgr's history when accounting runs, and sinfo's current reasons.
    Returns (events, notes for the summary); raises SlurmEventError when sinfo itself cannot be run."""
    env = {**query.env, "TZ": "UTC"}
    utc = ZoneInfo("UTC")
    notes: list[str] = []
    events: list[NodeEvent] = []
    config = _run([query.scontrol, "show", "config"], env, query.timeout_s)
    storage = re.search(r"^AccountingStorageType\s*=\s*(\S+)", config, re.MULTILINE)
    if storage is not None and storage.group(1) == "accounting_storage/slurmdbd":
        window = [f"Start={start}"] if start else ["All_Time"]
        window += [f"End={end}"] if end else []
        argv = [query.sacctmgr, "-P", "show", "event", *window, f"format={','.join(SACCTMGR_FIELDS)}"]
        try:
            text = _run(argv, env, query.timeout_s)
        except SlurmEventError as exc:
            notes.append(f"sacctmgr show event failed, node history left out: {exc}")
        else:
            events += parse_sacctmgr_events(text.splitlines(), " ".join(argv[:4]), utc)
    else:
        kind = storage.group(1) if storage else "not shown by scontrol show config"
        notes.append(
            f"Slurm keeps no node history here (AccountingStorageType={kind}, no slurmdbd): only the reasons "
            "nodes are down or drained now were read (sinfo -R)"
        )
    text = _run([query.sinfo, "-R", "-N", "-h", "-o", SINFO_FORMAT], env, query.timeout_s)
    events += parse_sinfo_reasons(text, "sinfo -R", utc)
    return events, notes


def _run(argv: list[str], env: Mapping[str, str], timeout_s: float) -> str:
    try:
        result = subprocess.run(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmEventError(f"{' '.join(argv)} timed out after {timeout_s:g} s") from None
    except OSError as exc:
        raise SlurmEventError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if result.returncode != 0:
        message = " ".join((result.stderr.strip() or result.stdout.strip() or "no message").split())
        raise SlurmEventError(f"{' '.join(argv)} exited {result.returncode}: {message}")
    return result.stdout
