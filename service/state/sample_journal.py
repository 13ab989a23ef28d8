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
node's saved state is newer than them.
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
_MAX_RECORD = 64 << 20  # a length beyond this is damage, not a sample


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

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = self.segments()
        # Never append to a segment a killed run left: its tail may be torn.
        self.segment = (existing[-1] + 1) if existing else 1
        self._fd: int | None = None
        self._size = 0
        self.damaged = 0  # segments whose replay stopped at a torn or damaged record

    def segments(self) -> list[int]:
        """The numbers of the segments on disk, oldest first."""
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:012d}.log"

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
            if self._fd is None or (self._size + len(record) > self.segment_bytes and self._size > 0):
                self._open_next()
            assert self._fd is not None
            written = os.write(self._fd, record)
            if written != len(record):  # a short write: the rest of the segment cannot be trusted
                self._close()
                self.segment += 1
                raise OSError(f"journal: wrote {written} of {len(record)} bytes")
            self._size += written
            return self.segment

    def _open_next(self) -> None:
        if self._fd is not None:
            self._close()
            self.segment += 1
        self._fd = os.open(self._path(self.segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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
                self._close()
                self.segment += 1
            return self.segment

    def entries(self, since: int = 0) -> Iterator[Entry]:
        """Every record of the segments numbered `since` and later, in the order written. A torn or
        damaged record ends its segment's replay (counted in `damaged`, logged)."""
        for segment in self.segments():
            if segment >= since:
                yield from self._read(segment)

    def _read(self, segment: int) -> Iterator[Entry]:
        path = self._path(segment)
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.error("journal segment %s cannot be read (%s); its samples are not replayed", path, exc)
            self.damaged += 1
            return
        at = 0
        while at < len(data):
            problem = ""
            if at + _HEADER.size > len(data):
                problem = "a torn record header"
            else:
                length, crc = _HEADER.unpack_from(data, at)
                body = data[at + _HEADER.size : at + _HEADER.size + length]
                if length > _MAX_RECORD or len(body) != length:
                    problem = "a torn record"
                elif zlib.crc32(body) != crc:
                    problem = "a record whose checksum does not match"
            if problem:
                self.damaged += 1
                log.warning(
                    "journal segment %s ends in %s at byte %d of %d; the samples after it are not "
                    "replayed: those acknowledged are lost to scoring (their node's alerts are judged "
                    "afresh from its next samples), those not acknowledged come again from their collectors",
                    path,
                    problem,
                    at,
                    len(data),
                )
                return
            at += _HEADER.size + length
            try:
                yield self._entry(segment, body)
            except (ValueError, wire.WireError, DecodeError) as exc:
                self.damaged += 1
                log.warning("journal segment %s holds a record that does not decode (%s): skipped", path, exc)

    @staticmethod
    def _entry(segment: int, body: bytes) -> Entry:
        (name_length,) = _KEY.unpack_from(body, 0)
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
            try:
                self._path(old).unlink()
                gone += 1
            except FileNotFoundError:
                continue
        return gone

    def close(self) -> None:
        with self._lock:
            self._close()
