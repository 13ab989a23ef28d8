"""`faultcast failures`: the failure log the importer reads, built from what a cluster already records.

Sources: kernel logs (Xid lines, faultcast.model.importers.kernel_log), mapped to modes through NVIDIA's Xid catalogue
(faultcast.xid_catalogue); Slurm's node events and drain/down reasons (faultcast.model.importers.slurm_events).
DCGM health-check output is not read: NVIDIA publishes no stable schema for `dcgmi health -j`/`dcgmi diag
-j` ("That JSON has no published stable schema", DCGM docs, Diagnostic Errors), and a health check carries
the time it ran, not the time the fault struck; a failing check usually shows as an Xid or a drain anyway.

Floods: the driver repeats an Xid for as long as the fault lasts (GSP timeouts every few seconds, ECC
errors on every access) and operators see hundreds of thousands of lines for one broken GPU. Lines of one
(node, GPU, mode) belong to one failure while each comes within `gap_s` (default 1 h) of the one before;
the failure keeps the first line's time and text. A quiet gap of the window starts a new failure. Chaining
(rather than a fixed window after the first line) keeps a flood of days on an unrepaired GPU one failure
instead of one per hour; an hour of silence is longer than the driver's repeat and rate-limit periods
and shorter than a repair (reset, reboot, swap) and return to service, after which a new fault is new.
Reading is one line at a time; what is kept is one span per failure, so memory follows the number of
failures, not the size of the logs.

Merging: a Slurm event (node-level) of the same node and mode within the window of a kernel-log failure
is the same fault: one failure, at the earlier time, with the kernel log's GPU and Xid.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

from faultcast.model.importers.kernel_log import GpuMap, KernelLogSource, KernelLogStats, read_kernel_log
from faultcast.model.importers.slurm_events import (
    NodeEvent,
    ReasonRules,
    SlurmQuery,
    Verdict,
    query_slurm,
    read_sacctmgr_events,
)
from faultcast.schemas import FAILURE_FIELDS
from faultcast.xid_catalogue import XidKind, lookup

DEFAULT_GAP_S = 3600.0
"""Lines of one (node, GPU, mode) closer than this to the one before are one failure."""
UNKNOWN_MODE = "unknown"
"""The mode written for a fatal Xid or a drain whose cause no rule names (only with keep_unexplained)."""
_DESCRIPTION_CHARS = 300


@dataclass(frozen=True, slots=True)
class Failure:
    """One row of the failure log."""

    time_s: float
    node: str
    gpu: int | None  # None: the whole node (or the GPU was unknown)
    uuid: str
    mode: str
    xid: int | None
    description: str

    def row(self) -> dict[str, str]:
        """The row as FAILURE_FIELDS; precursor_s is empty: a real log does not know it."""
        moment = dt.datetime.fromtimestamp(self.time_s, tz=dt.UTC)
        return {
            "timestamp": moment.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "node": self.node,
            "gpu": "" if self.gpu is None else str(self.gpu),
            "uuid": self.uuid,
            "mode": self.mode,
            "xid": "" if self.xid is None else str(self.xid),
            "precursor_s": "",
            "description": self.description,
        }


@dataclass
class _Span:
    start_s: float
    end_s: float
    lines: int
    xid: int | None
    uuid: str
    text: str  # the first line's source and text
    gpu_unknown: bool = False  # a kernel-log failure whose GPU the map did not know
    slurm: str = ""  # the Slurm reason merged into it
    kernel: bool = False  # seen in a kernel log


_Key = tuple[str, int | None, str]  # node, GPU (None: node-level), mode


class FailureBook:
    """Failures by (node, GPU, mode), each a span of lines no further than `gap_s` apart."""

    def __init__(self, gap_s: float = DEFAULT_GAP_S) -> None:
        if not gap_s > 0:
            raise ValueError("the dedupe window must be positive")
        self.gap_s = gap_s
        self._spans: dict[_Key, list[_Span]] = {}
        self._starts: dict[_Key, list[float]] = {}
        self._last: dict[_Key, int] = {}

    def add(self, key: _Key, time_s: float, *, xid: int | None, uuid: str, text: str,
            gpu_unknown: bool = False, kernel: bool = False) -> None:  # fmt: skip
        """One line (or event) of failure `key` at `time_s`."""
        spans = self._spans.setdefault(key, [])
        starts = self._starts.setdefault(key, [])
        last = self._last.get(key, -1)
        if 0 <= last < len(spans) and self._touches(spans[last], time_s):  # the usual case: in file order
            at = last
        else:
            at = bisect.bisect_right(starts, time_s) - 1
            if at >= 0 and self._touches(spans[at], time_s):
                pass
            elif at + 1 < len(spans) and self._touches(spans[at + 1], time_s):
                at += 1
            else:
                at += 1
                spans.insert(at, _Span(time_s, time_s, 0, xid, uuid, text, gpu_unknown, kernel=kernel))
                starts.insert(at, time_s)
        span = spans[at]
        span.lines += 1
        if time_s < span.start_s:
            span.start_s, span.xid, span.text = time_s, xid if xid is not None else span.xid, text
            starts[at] = time_s
        span.end_s = max(span.end_s, time_s)
        span.uuid = span.uuid or uuid
        self._last[key] = self._merge_neighbours(spans, starts, at)

    def merge_node_event(self, node: str, mode: str, time_s: float, text: str) -> bool:
        """Fold a node-level event into a kernel-log failure of the same node and mode within the window
        (its GPU, Xid and text stay, its time becomes the earlier one); False when there is none (then add
        the event as its own node-level failure)."""
        best: tuple[float, _Key, int] | None = None
        for key, spans in self._spans.items():
            if key[0] != node or key[2] != mode:
                continue
            for i, span in enumerate(spans):
                if span.kernel and self._touches(span, time_s):
                    distance = abs(span.start_s - time_s)
                    if best is None or distance < best[0]:
                        best = (distance, key, i)
        if best is None:
            return False
        _, key, i = best
        spans, starts = self._spans[key], self._starts[key]
        span = spans[i]
        span.start_s = min(span.start_s, time_s)
        starts[i] = span.start_s
        span.slurm = span.slurm or text
        self._last[key] = self._merge_neighbours(spans, starts, i)
        return True

    def failures(self) -> list[Failure]:
        """Every failure, in time order (node, then GPU, on ties)."""
        out: list[Failure] = []
        for (node, gpu, mode), spans in self._spans.items():
            for span in spans:
                text = span.text
                if span.lines > 1:
                    until = dt.datetime.fromtimestamp(span.end_s, tz=dt.UTC).isoformat(timespec="seconds")
                    text += f" [{span.lines} lines until {until.replace('+00:00', 'Z')}]"
                if span.slurm:
                    text += f"; also {span.slurm}"
                out.append(Failure(span.start_s, node, gpu, span.uuid, mode, span.xid, _trim(text)))
        out.sort(key=lambda f: (f.time_s, f.node, -1 if f.gpu is None else f.gpu, f.mode))
        return out

    def gpu_unknown(self) -> int:
        """Kernel-log failures written node-level because the GPU map did not know the bus."""
        return sum(s.gpu_unknown for spans in self._spans.values() for s in spans)

    def _touches(self, span: _Span, time_s: float) -> bool:
        return span.start_s - self.gap_s <= time_s <= span.end_s + self.gap_s

    def _merge_neighbours(self, spans: list[_Span], starts: list[float], at: int) -> int:
        while at + 1 < len(spans) and spans[at + 1].start_s - self.gap_s <= spans[at].end_s:
            _absorb(spans[at], spans.pop(at + 1))
            starts.pop(at + 1)
        while at > 0 and spans[at].start_s - self.gap_s <= spans[at - 1].end_s:
            _absorb(spans[at - 1], spans.pop(at))
            starts.pop(at)
            at -= 1
        return at


def _absorb(into: _Span, other: _Span) -> None:
    if other.start_s < into.start_s:
        into.start_s, into.text, into.xid = other.start_s, other.text, other.xid
    into.end_s = max(into.end_s, other.end_s)
    into.lines += other.lines
    into.uuid = into.uuid or other.uuid
    into.slurm = into.slurm or other.slurm
    into.gpu_unknown = into.gpu_unknown or other.gpu_unknown
    into.kernel = into.kernel or other.kernel


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DESCRIPTION_CHARS else text[: _DESCRIPTION_CHARS - 3] + "..."


# -- building the log ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildOptions:
    """What `faultcast failures` reads and how."""

    kernel_logs: Sequence[KernelLogSource] = ()
    gpu_map: GpuMap = field(default_factory=GpuMap)
    slurm_files: Sequence[Path] = ()
    from_slurm: SlurmQuery | None = None
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    start_s: float | None = None
    end_s: float | None = None
    slurm_start: str = ""  # as sacctmgr reads it (Start=...); "" for All_Time
    slurm_end: str = ""
    gap_s: float = DEFAULT_GAP_S
    nodes: frozenset[str] | None = None
    rules: ReasonRules = field(default_factory=ReasonRules)
    keep_unexplained: bool = False


@dataclass
class Report:
    """What went in and what came out, for the summary."""

    kernel: KernelLogStats = field(default_factory=KernelLogStats)
    xids: Counter[tuple[XidKind, int]] = field(default_factory=Counter)  # lines by (kind, code)
    unknown_xids: Counter[int] = field(default_factory=Counter)
    failure_lines: int = 0
    kernel_failures: int = 0
    unknown_buses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (node, bus) lines
    gpu_unknown: int = 0
    slurm_events: int = 0
    slurm_verdicts: Counter[Verdict] = field(default_factory=Counter)
    unexplained_reasons: Counter[str] = field(default_factory=Counter)
    slurm_merged: int = 0
    slurm_failures: int = 0
    other_nodes: int = 0  # lines and events on nodes outside --nodes
    outside_window: int = 0  # failures before --start or after --end
    modes: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


def build(options: BuildOptions) -> tuple[list[Failure], Report]:
    """Reads every source and returns the failures (time order) and the report."""
    report = Report()
    book = FailureBook(options.gap_s)
    uuids: dict[tuple[str, str], str] = {}
    for source in options.kernel_logs:
        _read_kernel(source, options, book, uuids, report)
    report.kernel_failures = len(book.failures())
    report.gpu_unknown = book.gpu_unknown()
    events: list[NodeEvent] = []
    for path in options.slurm_files:
        events += read_sacctmgr_events(path, options.zone)
    if options.from_slurm is not None:
        live, notes = query_slurm(options.from_slurm, options.slurm_start, options.slurm_end or None)
        events += live
        report.notes += notes
    before = len(book.failures())
    for event in sorted(events, key=lambda e: e.time_s):
        _add_event(event, options, book, report)
    report.slurm_failures = len(book.failures()) - before
    report.notes += report.kernel.assumptions
    failures = []
    for failure in book.failures():
        if (options.start_s is not None and failure.time_s < options.start_s) or (
            options.end_s is not None and failure.time_s > options.end_s
        ):
            report.outside_window += 1
            continue
        failures.append(failure)
        report.modes[failure.mode] += 1
    return failures, report


def _read_kernel(
    source: KernelLogSource,
    options: BuildOptions,
    book: FailureBook,
    uuids: dict[tuple[str, str], str],
    report: Report,
) -> None:
    for line in read_kernel_log(source, report.kernel, uuids):
        if options.nodes is not None and line.node not in options.nodes:
            report.other_nodes += 1
            continue
        entry = lookup(line.xid)
        if entry is None:
            report.unknown_xids[line.xid] += 1
            continue
        report.xids[(entry.kind, line.xid)] += 1
        if entry.kind is XidKind.FAILURE and entry.mode is not None:
            mode = entry.mode.value
        elif entry.kind is XidKind.UNMAPPED and options.keep_unexplained:
            mode = UNKNOWN_MODE
        else:
            continue
        report.failure_lines += 1
        known = options.gpu_map.gpu(line.node, line.bus)
        uuid = uuids.get((line.node, line.bus), "")
        if known is None:
            report.unknown_buses[(line.node, line.bus)] += 1
        gpu = None if known is None else known[0]
        uuid = uuid or ("" if known is None else known[1])
        book.add((line.node, gpu, mode), line.time_s, xid=line.xid, uuid=uuid,
                 text=f"kernel log {line.where}: {line.text}", gpu_unknown=known is None, kernel=True)  # fmt: skip


def _add_event(event: NodeEvent, options: BuildOptions, book: FailureBook, report: Report) -> None:
    report.slurm_events += 1
    if options.nodes is not None and event.node not in options.nodes:
        report.other_nodes += 1
        return
    reading = options.rules.read(event.reason)
    report.slurm_verdicts[reading.verdict] += 1
    mode = reading.mode
    if reading.verdict is Verdict.UNEXPLAINED:
        report.unexplained_reasons[event.reason or "(no reason)"] += 1
        if not options.keep_unexplained:
            return
        mode = UNKNOWN_MODE
    elif reading.verdict is not Verdict.FAILURE:
        return
    text = f"slurm {event.where}: {event.state} {event.reason!r} by {event.user or '?'}"
    if book.merge_node_event(event.node, mode, event.time_s, text):
        report.slurm_merged += 1
        return
    book.add((event.node, None, mode), event.time_s, xid=reading.xid, uuid="", text=text)


def write_failures(path: Path, failures: Iterable[Failure]) -> int:
    """Writes the log (FAILURE_FIELDS, in the given order); returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(FAILURE_FIELDS))
        writer.writeheader()
        for failure in failures:
            writer.writerow(failure.row())
            count += 1
    return count


def describe(out: Path, failures: Sequence[Failure], report: Report, options: BuildOptions) -> str:
    """The summary printed after a build: what was read, what became failures, what was skipped and why."""
    modes = ", ".join(f"{m} {n}" for m, n in report.modes.most_common()) or "none"
    lines = [f"wrote {out}: {len(failures)} failures ({modes})"]
    k = report.kernel
    if options.kernel_logs:
        lines.append(
            f"kernel logs: {k.lines:,} lines read in {len(options.kernel_logs)} files, {k.xid_lines:,} Xid lines; "
            f"{report.failure_lines:,} failure lines became {report.kernel_failures:,} failures "
            f"(one per node, GPU and mode while lines come within {options.gap_s:g} s of each other)"
        )
        for kind, label in ((XidKind.APPLICATION, "skipped, application Xids (not hardware)"),
                            (XidKind.INFORMATIONAL, "skipped, informational Xids (warnings, precursors)"),
                            (XidKind.UNMAPPED, "fatal Xids naming no faultcast mode" + (
                                " (written as 'unknown')" if options.keep_unexplained else
                                " (not written; --keep-unexplained writes them as 'unknown')"))):  # fmt: skip
            counts = {code: n for (kd, code), n in report.xids.items() if kd is kind}
            if counts:
                lines.append(f"  {label}: {sum(counts.values()):,} lines ({_by_code(counts)})")
        if report.unknown_xids:
            lines.append(
                f"  unknown Xids (not in faultcast's catalogue, not written): {sum(report.unknown_xids.values()):,} "
                f"lines ({_by_code(report.unknown_xids)})"
            )
        if k.unparseable:
            lines.append(f"  unreadable Xid lines: {k.unparseable:,} (first: {k.first_unparseable})")
        if report.gpu_unknown:
            buses = ", ".join(f"{n} {b}" for (n, b), _ in report.unknown_buses.most_common(5))
            lines.append(
                f"  node-level because the GPU was unknown: {report.gpu_unknown} failures (no --gpu-map entry "
                f"for {buses}{', ...' if len(report.unknown_buses) > 5 else ''})"
            )
    if options.slurm_files or options.from_slurm is not None:
        verdicts = report.slurm_verdicts
        lines.append(
            f"slurm: {report.slurm_events} node events; {verdicts[Verdict.FAILURE]} name a cause "
            f"({report.slurm_merged} of them the same fault as a kernel-log failure); "
            f"{report.slurm_failures} failures added"
        )
        skipped = [
            (Verdict.PREDICTION, "faultcast's own drains (predictions, not failures)"),
            (Verdict.PLANNED, "planned maintenance"),
            (Verdict.APPLICATION, "application Xids"),
            (Verdict.INFORMATIONAL, "informational Xids"),
        ]
        for verdict, label in skipped:
            if verdicts[verdict]:
                lines.append(f"  skipped, {label}: {verdicts[verdict]}")
        if report.unexplained_reasons:
            top = ", ".join(f"{r!r} {n}" for r, n in report.unexplained_reasons.most_common(5))
            action = (
                "written as 'unknown'"
                if options.keep_unexplained
                else (
                    "skipped; name their mode with --reason 'REGEX=MODE' or write them with --keep-unexplained"
                )
            )
            lines.append(f"  reasons naming no cause ({action}): {verdicts[Verdict.UNEXPLAINED]} ({top})")
    if report.other_nodes:
        lines.append(f"left out, on nodes outside --nodes: {report.other_nodes:,} lines and events")
    if report.outside_window:
        lines.append(f"left out, outside --start/--end: {report.outside_window} failures")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _by_code(counts: dict[int, int] | Counter[int]) -> str:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"Xid {code}: {n:,}" for code, n in ranked)


_RANGE = re.compile(r"^(?P<head>[^\[\]]*)\[(?P<body>[^\[\]]+)\](?P<tail>[^\[\]]*)$")


def expand_hostlist(text: str) -> list[str]:
    """Node names from a Slurm-style list: "gpu[01-03,07],login1" -> gpu01, gpu02, gpu03, gpu07, login1.
    ValueError on a malformed one."""
    names: list[str] = []
    for part in re.split(r",(?![^\[]*\])", text):
        part = part.strip()
        if not part:
            continue
        found = _RANGE.match(part)
        if found is None:
            if "[" in part or "]" in part:
                raise ValueError(f"{part!r} is not a node name or a node[range] expression")
            names.append(part)
            continue
        for item in found["body"].split(","):
            low, sep, high = item.partition("-")
            if not low.isdigit() or (sep and not high.isdigit()):
                raise ValueError(f"{part!r}: {item!r} is not a number or a range")
            for number in range(int(low), int(high if sep else low) + 1):
                names.append(f"{found['head']}{number:0{len(low)}d}{found['tail']}")
    return names
