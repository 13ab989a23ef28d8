"""The sample journal: every sample the scorer took, on disk before its collector hears the ack.

The scorer's state (each GPU's windows and baselines) lives in memory; a node's state is saved now
and then (service/scoring_state.py), and what the node sent since is here. A restart, even after
kill -9, loads each node's saved state and replays the node's samples after it from this journal, so
that it scores on exactly as if it had never stopped. Samples are written with one `write` each to a
file opened for appending: once the call returns the bytes are the kernel's, which a killed process
cannot take back (a power cut can: the journal is not fsynced; a torn or damaged tail is detected by
its checksum and ends the replay of that segment, with a warning).

    <state-dir>/journal/000000000001.log, 000000000002.log, ...   segments, oldest first

A record: its length and CRC-32 (struct `!II`), then the node's name (2-byte length), the spool id and
sequence (8 bytes each) and the sample as a telemetry NodeSample message. A segment is closed at
`segment_bytes` and a new one begun; `forget_before(n)` deletes the segments older than n once every
node's saved state is newer than them. The journal holds at most `max_bytes` (a write past it is
refused like one the disk refuses: the service saves states to make room, see service/server.py).

What the directory holds is not trusted: a record that cannot be read whole (torn, zero-filled,
failing its checksum, too short for its own fields) ends its segment's replay; a segment is read one
record at a time, so that a huge or sparse one costs no more memory than a record (`_MAX_RECORD`); a
segment that cannot be read or deleted is logged and counted and the journal goes on. Names are
12 digits and the journal never writes one past them: a segment numbered `_RENUMBER_FROM` or higher
at start (planted: one new segment a second takes 3,000 years to get there), or named past 12
digits (an earlier version wrote those past 999999999999.log), makes it number its segments from 1
again, in their order, so that every segment is found and replayed in order; should a run still
reach the last name, it stays in that segment (logged) until the next start.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError

from faultcast import wire
from faultcast.readings import NodeSnapshot
from faultcast.v1 import telemetry_pb2 as tpb

log = logging.getLogger(__name__)

SEGMENT_BYTES = 64 << 20
_HEADER = struct.Struct("!II")  # record length (after the header), CRC-32 of the record
_KEY = struct.Struct("!H")  # the node name's length
_IDS = struct.Struct("!QQ")  # spool id, sequence
_NAME = re.compile(r"^(\d{12})\.log$")
_PAST_12 = re.compile(r"^([1-9]\d{12,})\.log$")  # what an earlier version wrote past the last name
_LAST_SEGMENT = 10**12 - 1  # the highest number a 12-digit name holds
_RENUMBER_FROM = 10**11  # a start finding a segment this high numbers them from 1 again
_MAX_RECORD = 64 << 20  # a length beyond this is damage, not a sample
MAX_BYTES = 64 << 30  # what the journal may hold by default


class JournalFull(OSError):  # noqa: N818 (a refusal like a full disk, not a bug)
    """A write the journal refuses because it holds `max_bytes` already."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One journalled sample: where it is (its segment) and what it was."""

    segment: int
    node: str
    spool_id: int
    sequence: int
    snapshot: NodeSnapshot


class SampleJournal:
    """Append-only segments of samples in `directory` (see the module docstring). `append` from the
    ingest path; `entries` at start; `forget_before` once saved states cover older segments."""

    def __init__(
        self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES, max_bytes: int = MAX_BYTES
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = self.segments()
        if existing and existing[-1] >= _RENUMBER_FROM:
            existing = self._renumber(existing)
        # Never append to a segment a killed run left: its tail may be torn.
        self.segment = (existing[-1] + 1) if existing else 1
        self._fd: int | None = None
        self._size = 0
        self.bytes = sum(self._size_of(n) for n in existing)  # what the segments hold, in all
        self.damaged = 0  # segments whose replay stopped at a torn or damaged record
        self.undeletable: set[int] = set()  # segments forgotten that could not be deleted
        self._at_last = False  # stayed in the last name's segment (said once)

    def segments(self) -> list[int]:
        """The numbers of the segments on disk, oldest first (those an earlier version named past 12
        digits among them)."""
        names = [p.name for p in self.directory.iterdir()]
        return sorted(int(m.group(1)) for n in names if (m := _NAME.match(n) or _PAST_12.match(n)))

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:012d}.log"

    def _size_of(self, segment: int) -> int:
        try:
            return self._path(segment).stat().st_size
        except OSError:
            return 0

    def _renumber(self, existing: list[int]) -> list[int]:
        """Number the segments 1, 2, ... in their order: the highest is near the last 12-digit name or
        past it (planted, or what an earlier version wrote after a planted one). Renamed lowest
        first, each to a number no higher than its own: no segment is overwritten, and a kill midway
        leaves them in order still."""
        log.warning(
            "journal %s holds segment %s, near or past the last 12-digit name (%d segment(s) named past "
            "12 digits, as an earlier version wrote them): its %d segment(s) are numbered from 1 again, "
            "in their order, and all are replayed",
            self.directory,
            self._path(existing[-1]).name,
            sum(1 for n in existing if n > _LAST_SEGMENT),
            len(existing),
        )
        for new, old in enumerate(existing, start=1):
            if new != old:
                os.replace(self._path(old), self._path(new))
        return list(range(1, len(existing) + 1))

    def append(self, snapshot: NodeSnapshot) -> int:
        """Write one taken sample (its spool id and sequence with it); returns the segment it is in.
        OSError when the disk refuses it (nothing of it counts as written: the caller must not
        acknowledge the sample)."""
        node = snapshot.node.encode()
        body = (
            _KEY.pack(len(node))
            + node
            + _IDS.pack(snapshot.spool_id & 0xFFFF_FFFF_FFFF_FFFF, snapshot.sequence)
            + wire.to_proto(snapshot).SerializeToString()
        )
        record = _HEADER.pack(len(body), zlib.crc32(body)) + body
        with self._lock:
            if self.bytes + len(record) > self.max_bytes:
                raise JournalFull(f"the journal holds {self.bytes} bytes, its limit is {self.max_bytes}")
            if self._fd is not None and self._size + len(record) > self.segment_bytes and self._size > 0:
                self._next()
            if self._fd is None:
                self._open()
            assert self._fd is not None
            written = os.write(self._fd, record)
            self.bytes += written
            if written != len(record):  # a short write: the rest of the segment cannot be trusted
                self._close()
                self.segment += 1
                raise OSError(f"journal: wrote {written} of {len(record)} bytes")
            self._size += written
            return self.segment

    def _next(self) -> None:
        """Close the segment being written and go on to the next number, unless it is the last
        name: no segment is ever named past 12 digits (a listing would not find it). Staying there
        loses nothing; that segment is kept until a start numbers the segments from 1 again."""
        if self.segment < _LAST_SEGMENT:
            self._close()
            self.segment += 1
        elif not self._at_last:
            self._at_last = True
            log.error(
                "journal %s is at its last segment name %s: it goes on writing there, and that segment "
                "is not forgotten, until the next start numbers the segments from 1 again",
                self.directory,
                self._path(self.segment).name,
            )

    def _open(self) -> None:
        if self.segment > _LAST_SEGMENT:  # a torn write or a planted name took the last one
            raise OSError(
                f"journal: no segment name left past {self._path(_LAST_SEGMENT).name} until a restart"
            )
        path = self._path(self.segment)
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            if path.exists() and not path.is_file():  # something else took its name: the next one
                self.segment += 1
            raise
        self._size = os.fstat(self._fd).st_size

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def rotate(self) -> int:
        """Begin a new segment now (what was written before is covered by states saved from now on);
        returns its number."""
        with self._lock:
            if self._fd is not None:
                self._next()
            return self.segment

    def entries(self, since: int = 0) -> Iterator[Entry]:
        """Every record of the segments numbered `since` and later, in the order written. A torn or
        damaged record ends its segment's replay (counted in `damaged`, logged)."""
        for segment in self.segments():
            if segment >= since:
                yield from self._read(segment)

    def _read(self, segment: int) -> Iterator[Entry]:
        """The segment's entries, read one record at a time: a huge or sparse segment costs no more
        memory than its largest record."""
        path = self._path(segment)
        at = size = 0
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                while at < size:
                    entry, problem = self._record(segment, file, size - at)
                    if entry is None:
                        self._ends(path, problem, at, size)
                        return
                    yield entry
                    at = file.tell()
        except OSError as exc:
            log.error(
                "journal segment %s cannot be read at byte %d (%s); its samples from there are not replayed",
                path,
                at,
                exc,
            )
            self.damaged += 1

    def _ends(self, path: Path, problem: str, at: int, size: int) -> None:
        self.damaged += 1
        log.warning(
            "journal segment %s ends in %s at byte %d of %d; the samples after it are not "
            "replayed: those acknowledged are lost to scoring (their node's alerts are judged "
            "afresh from its next samples), those not acknowledged come again from their collectors",
            path,
            problem,
            at,
            size,
        )

    def _record(self, segment: int, file: BinaryIO, left: int) -> tuple[Entry | None, str]:
        """The entry of the record `file` is at (`left` bytes of the segment from there), or None and
        what is wrong with it: any record that cannot be read whole ends its segment (a power cut
        leaves zeros, which read as an empty record whose checksum matches). A body is read only once
        its length is known to be a record's and within the segment: no length allocates more."""
        header = file.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None, "a torn record header"
        length, crc = _HEADER.unpack(header)
        if length == 0:
            return None, "an empty record (zeros, as a power cut leaves)"
        if length > _MAX_RECORD or _HEADER.size + length > left:
            return None, "a torn record"
        body = file.read(length)
        if len(body) != length:  # cut while being read
            return None, "a torn record"
        if zlib.crc32(body) != crc:
            return None, "a record whose checksum does not match"
        try:
            return self._entry(segment, body), ""
        except (struct.error, ValueError, wire.WireError, DecodeError) as exc:
            return None, f"a record that does not decode ({exc})"

    @staticmethod
    def _entry(segment: int, body: bytes) -> Entry:
        (name_length,) = _KEY.unpack_from(body, 0)
        if _KEY.size + name_length + _IDS.size > len(body):
            raise ValueError(f"its node name ({name_length} bytes) runs past the record")
        node = body[_KEY.size : _KEY.size + name_length].decode()
        spool, sequence = _IDS.unpack_from(body, _KEY.size + name_length)
        sample = tpb.NodeSample.FromString(body[_KEY.size + name_length + _IDS.size :])
        return Entry(segment, node, spool, sequence, wire.from_proto(sample, spool_id=spool))

    def forget_before(self, segment: int) -> int:
        """Delete the segments numbered below `segment` (never the one being written); returns how
        many were deleted."""
        with self._lock:
            limit = min(segment, self.segment)
        gone = 0
        for old in self.segments():
            if old >= limit:
                break
            size = self._size_of(old)
            try:
                self._path(old).unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:  # not a file of ours (a directory planted in its name), or no rights
                self._undeletable(old, exc)
                continue
            gone += 1
            with self._lock:
                self.bytes = max(0, self.bytes - size)
        return gone

    def _undeletable(self, segment: int, exc: OSError) -> None:
        """Logged once per segment: the journal goes on, that name stays until someone removes it."""
        if segment not in self.undeletable:
            self.undeletable.add(segment)
            log.error(
                "journal segment %s cannot be deleted (%s); it is left as it is, and the journal goes on",
                self._path(segment),
                exc,
            )

    def close(self) -> None:
        with self._lock:
            self._close()
