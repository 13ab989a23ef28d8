"""A migration's measured costs: the file `bench/migration.py` writes (schema faultcast.migration_costs/1),
checked, and mapped to the job simulation's costs.

The mapping (docs/goodput.md, "Measured costs"): the snapshot costs the chosen path's blocking part;
the migration costs the rest of the time that path blocked training; a crash restart costs the
requeue path's restart (what a crash also pays once it is noticed); a periodic checkpoint costs its
blocking part (an asynchronous save's host copy). The prescheduled path is chosen when the file has
it. Crash detection and the inspection of a drained node are not measured: they come from the caller.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultcast.goodput.engine import JobCosts

SCHEMA = "faultcast.migration_costs/1"
REQUEUE = "requeue"
PRESCHEDULED = "prescheduled"
# JobCosts fields the file does not measure: the caller's flags give them.
UNMEASURED = ("detect_s", "drain_s")


@dataclass(frozen=True, slots=True)
class PathCosts:
    """How one way of moving the job off a doomed node went, in seconds and bytes."""

    name: str  # requeue or prescheduled
    snapshot_blocking_s: float  # the alert's snapshot blocked training this long (host copy)
    blocked_s: float  # last step on the doomed node to first step after the move, snapshot included
    alert_to_first_step_s: float
    bytes_moved: float
    restart_s: float | None  # requeue: job ended to first step elsewhere (scheduler, start, init, load)
    spare_ready_s: float | None  # prescheduled: alert to the replacement waiting
    load_s: float | None  # prescheduled: the replacement's load of the snapshot
    # The migration's snapshot written whole after its host copy, before it is acknowledged (part of
    # blocked_s; files written before the write went to the background do not have it: 0).
    snapshot_write_s: float = 0.0

    @property
    def after_snapshot_s(self) -> float:
        """What the move blocked training beyond the snapshot: the engine's migration."""
        return self.blocked_s - self.snapshot_blocking_s


@dataclass(frozen=True, slots=True)
class MeasuredCosts:
    """One measured costs file: where it came from, the job it measured and what each path cost."""

    source: str  # the file's path
    measured_at: str
    command: str
    ranks: int
    state_bytes: float
    parameters: float
    requeue: PathCosts
    prescheduled: PathCosts | None
    react_s: float  # alert to the snapshot starting
    checkpoint_blocking_s: float  # a periodic (asynchronous) checkpoint blocks training this long
    copy_bytes_per_s: float  # measured state bytes / time of the host copy
    load_bytes_per_s: float  # measured state bytes / time of the load
    unknown_keys: tuple[str, ...]  # keys the schema does not know, ignored (dotted paths)
    write_bytes_per_s: float | None = None  # measured state bytes / time of the snapshot's write

    @property
    def path(self) -> PathCosts:
        """The path the job would take: prescheduled when measured, else requeue."""
        return self.prescheduled if self.prescheduled is not None else self.requeue

    @property
    def restart_s(self) -> float:
        """A crash restart once the crash is noticed: the requeue path's restart."""
        assert self.requeue.restart_s is not None  # the parser requires it on the requeue path
        return self.requeue.restart_s

    def job_costs(self, detect_s: float, drain_s: float, evident_detect_s: float | None = None) -> JobCosts:
        """The engine's costs: measured ones from the file, crash detection and drain from the caller."""
        return JobCosts(
            checkpoint_s=self.checkpoint_blocking_s,
            snapshot_s=self.path.snapshot_blocking_s,
            detect_s=detect_s,
            restart_s=self.restart_s,
            migrate_s=self.path.after_snapshot_s,
            react_s=self.react_s,
            drain_s=drain_s,
            evident_detect_s=evident_detect_s,
        )

    def to_json(self) -> dict[str, object]:
        """Where the costs came from, for a report's JSON."""
        return {
            "file": self.source,
            "schema": SCHEMA,
            "measured_at": self.measured_at,
            "command": self.command,
            "path": self.path.name,
            "job": {"ranks": self.ranks, "state_bytes": self.state_bytes, "parameters": self.parameters},
            "unknown_keys": list(self.unknown_keys),
        }


def load(path: Path) -> MeasuredCosts:
    """Read and check a costs file; ValueError naming the file and the key for anything wrong."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the costs file: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    try:
        return parse(data, str(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def parse(data: object, source: str) -> MeasuredCosts:
    """Check a decoded costs file; ValueError naming the key that is missing or wrong."""
    unknown: list[str] = []
    top = _Object(data, "", unknown)
    schema = top.text("schema")
    if schema != SCHEMA:
        raise ValueError(f"schema is {schema!r}, expected {SCHEMA!r}")
    job = top.child("job")
    ranks = job.integer("ranks")
    state_bytes = job.number("state_bytes", positive=True)
    parameters = job.number("parameters", positive=True)
    job.done()
    paths = top.child("paths")
    requeue = _path(paths.child(REQUEUE), REQUEUE)
    prescheduled = _path(paths.child(PRESCHEDULED), PRESCHEDULED) if paths.has(PRESCHEDULED) else None
    paths.done()
    bandwidth = top.child("bandwidth_bytes_per_s")
    copy_bytes_per_s = bandwidth.number("snapshot_copy", positive=True)
    load_bytes_per_s = bandwidth.number("load", positive=True)
    # The snapshot's write (later files): shown, not scaled (the estimate takes storage's bandwidth).
    write_bytes_per_s = bandwidth.number("snapshot_write") if bandwidth.has("snapshot_write") else None
    bandwidth.done()
    measured_at, command, react_s = top.text("measured_at"), top.text("command"), top.number("react_s")
    # The checkpoint interval (Young/Daly) needs a checkpoint that costs something.
    checkpoint_blocking_s = top.number("checkpoint_blocking_s", positive=True)
    top.done()
    return MeasuredCosts(
        source=source,
        measured_at=measured_at,
        command=command,
        ranks=ranks,
        state_bytes=state_bytes,
        parameters=parameters,
        requeue=requeue,
        prescheduled=prescheduled,
        react_s=react_s,
        checkpoint_blocking_s=checkpoint_blocking_s,
        copy_bytes_per_s=copy_bytes_per_s,
        load_bytes_per_s=load_bytes_per_s,
        write_bytes_per_s=write_bytes_per_s,
        unknown_keys=tuple(unknown),
    )


def _path(obj: _Object, name: str) -> PathCosts:
    snapshot = obj.number("snapshot_blocking_s")
    blocked = obj.number("blocked_s")
    if blocked < snapshot:
        raise ValueError(
            f"{obj.key('blocked_s')} ({blocked:g} s) is less than its snapshot_blocking_s ({snapshot:g} s)"
        )
    write = obj.number("snapshot_write_s") if obj.has("snapshot_write_s") else 0.0
    if snapshot + write > blocked:
        raise ValueError(
            f"{obj.key('blocked_s')} ({blocked:g} s) is less than its snapshot's copy and write "
            f"({snapshot:g} s + {write:g} s)"
        )
    requeue = name == REQUEUE
    path = PathCosts(
        name=name,
        snapshot_blocking_s=snapshot,
        blocked_s=blocked,
        alert_to_first_step_s=obj.number("alert_to_first_step_s"),
        bytes_moved=obj.number("bytes_moved"),
        restart_s=obj.number("restart_s") if requeue else None,
        spare_ready_s=None if requeue else obj.number("spare_ready_s"),
        load_s=None if requeue else obj.number("load_s"),
        snapshot_write_s=write,
    )
    obj.done()
    return path


class _Object:
    """One JSON object of the file: typed reads by key, errors that name the dotted key, and the keys
    nobody read collected as unknown."""

    def __init__(self, data: object, where: str, unknown: list[str]) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"{where or 'the file'} must be a JSON object, got {type(data).__name__}")
        self._data: dict[str, Any] = data
        self._where = where
        self._read: set[str] = set()
        self._unknown = unknown

    def key(self, name: str) -> str:
        """The dotted key of `name` in the file."""
        return f"{self._where}.{name}" if self._where else name

    def has(self, name: str) -> bool:
        return name in self._data

    def _get(self, name: str) -> object:
        if name not in self._data:
            raise ValueError(f"missing required key {self.key(name)}")
        self._read.add(name)
        return self._data[name]

    def child(self, name: str) -> _Object:
        return _Object(self._get(name), self.key(name), self._unknown)

    def text(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise ValueError(f"{self.key(name)} must be a string, got {value!r}")
        return value

    def number(self, name: str, positive: bool = False) -> float:
        value = self._get(name)
        # bool is an int in Python, never a measurement.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{self.key(name)} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "positive" if positive else ">= 0"
            raise ValueError(f"{self.key(name)} must be a finite number {bound}, got {value}")
        return float(value)

    def integer(self, name: str) -> int:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{self.key(name)} must be a whole number >= 1, got {value!r}")
        return value

    def done(self) -> None:
        """Record the keys of this object nobody read."""
        self._unknown.extend(self.key(k) for k in self._data if k not in self._read)
