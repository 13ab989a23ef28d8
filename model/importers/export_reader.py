"""A streaming reader of Prometheus range-query exports: one series at a time, never a whole file.

An export is what `GET /api/v1/query_range` answers (`{"status": "success", "data": {"resultType":
"matrix", "result": [...]}}`), a JSON list of such answers, or a directory of `.json` files holding
either. `read_export` walks each file's JSON structure incrementally (a few MiB of text at a time)
and yields every series with its samples as two numpy arrays, so memory is bounded by the longest
single series, not by the export.

The structure around the samples (label sets, status, resultType) is decoded with the standard
library's decoder on small pieces. A series' `values` array (`[[unix_s, "value"], ...]`), which
is nearly all of an export, is cut out whole and parsed in bulk: the brackets and quotes are
dropped and the numbers read by pandas' C parser (about ten times json.loads). Anything that bulk
path does not accept exactly (a token that is not a number, a pair of another shape, non-ASCII)
is decoded by json.loads instead and judged by the caller, so the error messages are those of a
whole-document parse.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from faultcast.model.features.offline import DataError

_BLOCK = 1 << 22  # characters read at a time
_BULK_PAIRS = 256  # shorter series go through json.loads (pandas' per-call cost would dominate)
_VALUES_END = re.compile(r"\]\s*\]")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DROP = b'[]" \t\n\r'
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Series:
    """One element of a range-query answer's `data.result`."""

    source: str  # the file, and [i] for an answer in a list
    element: Any  # the element when it is not an object; None for an object
    labels: Any  # its `metric` member as decoded (None when absent)
    samples: tuple[np.ndarray, np.ndarray] | None  # (unix seconds, values) when parsed in bulk
    raw_values: Any  # otherwise its `values` member as decoded (None when absent or skipped)


Wanted = Callable[[Any], bool]
"""Whether a series whose label set is this one is to be parsed (False: its samples are skipped)."""


class _Text:
    """A JSON text read incrementally: the unread part of the file lies in `buf` from `pos`."""

    def __init__(self, handle: TextIO, name: str, block: int = _BLOCK) -> None:
        self.handle, self.name, self.block = handle, name, block
        self.buf, self.pos, self.eof = "", 0, False

    def more(self) -> bool:
        """Read another block, dropping what lies before `pos`; False at the end of the file."""
        if self.eof:
            return False
        try:
            chunk = self.handle.read(self.block)
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.name}: not JSON ({exc})") from exc
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def fail(self, what: str) -> DataError:
        return DataError(f"{self.name}: not JSON ({what})")

    def peek(self) -> str:
        """The next character that is not whitespace (not consumed); DataError at the end."""
        while True:
            match = _WHITESPACE.match(self.buf, self.pos)
            self.pos = match.end() if match else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                raise self.fail("unexpected end of the file")

    def at_end(self) -> bool:
        """True when nothing but whitespace is left."""
        try:
            self.peek()
        except DataError:
            return True
        return False

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r} at {self.buf[self.pos : self.pos + 20]!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, decoded."""
        while True:
            self.peek()
            try:
                decoded, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():  # perhaps only cut off by the end of the block
                    continue
                raise self.fail(str(exc)) from exc
            if end == len(self.buf) and self.more():  # a number may go on in the next block
                continue
            self.pos = end
            return decoded

    def members(self) -> Iterator[str]:
        """The keys of the object that starts here; the caller consumes each value."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise self.fail("an object key that is not a string")
            self.expect(":")
            yield key
            char = self.peek()
            self.pos += 1
            if char == "}":
                return
            if char != ",":
                raise self.fail(f"expected ',' or '}}', got {char!r}")

    def elements(self) -> Iterator[None]:
        """One step per element of the array that starts here; the caller consumes each element."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield None
            char = self.peek()
            self.pos += 1
            if char == "]":
                return
            if char != ",":
                raise self.fail(f"expected ',' or ']', got {char!r}")

    def pairs_text(self) -> str | None:
        """The text of the `[[t, "v"], ...]` array that starts here (consumed), or None (nothing
        consumed) when what starts here is not an array of arrays."""
        if self.peek() != "[":
            return None
        while True:  # the first non-blank character inside
            match = _WHITESPACE.match(self.buf, self.pos + 1)
            inner = match.end() if match else self.pos + 1
            if inner < len(self.buf) or not self.more():
                break
        if inner >= len(self.buf) or self.buf[inner] != "[":
            return None
        while True:
            end = _VALUES_END.search(self.buf, inner)
            if end is not None:
                text = self.buf[self.pos : end.end()]
                self.pos = end.end()
                return text
            # Search on from the last `]` read (the end may be split across blocks), not from the start.
            last = self.buf.rfind("]", inner)
            offset = (last if last >= 0 else inner) - self.pos
            if not self.more():
                raise self.fail("unexpected end of the file in a values array")
            inner = self.pos + offset


def parse_pairs(text: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(times, values) of a `[[t, "v"], ...]` text, or None when the bulk path cannot take it
    exactly (the caller then decodes it with json.loads)."""
    pairs = text.count("[") - 1
    if pairs < _BULK_PAIRS:
        return None
    try:
        data = text.encode("ascii")
    except UnicodeEncodeError:
        return None
    flat = data.translate(None, _DROP)
    if not flat or b",," in flat or flat.startswith(b",") or flat.endswith(b","):
        return None
    try:
        frame = pd.read_csv(
            io.BytesIO(flat.replace(b",", b"\n")),
            header=None,
            engine="c",
            dtype=np.float64,
            keep_default_na=False,
            na_values=["NaN"],
            skip_blank_lines=False,
        )
    except (ValueError, pd.errors.ParserError):
        return None
    numbers = frame.iloc[:, 0].to_numpy(np.float64)
    if len(numbers) != 2 * pairs or frame.shape[1] != 1:
        return None
    return numbers[0::2].copy(), numbers[1::2].copy()


def export_files(export: Path) -> list[Path]:
    """The files of an export (a file, or a directory's .json files in name order); DataError when
    there is none."""
    if export.is_dir():
        files = sorted(export.glob("*.json"))
        if not files:
            raise DataError(f"{export}: no .json files in the directory")
        return files
    if export.is_file():
        return [export]
    raise DataError(f"{export}: no such file or directory")


def read_export(
    export: Path, wanted: Wanted, responses: list[str], *, block_chars: int = _BLOCK
) -> Iterator[Series]:
    """Every series of every answer of the export, in file order; appends each answer's name to
    `responses` once it is read. Raises DataError on what is not a range-query answer. The files
    are read `block_chars` characters at a time."""
    for file in export_files(export):
        with file.open(encoding="utf-8", newline="") as handle:
            text = _Text(handle, str(file), block_chars)
            if text.peek() == "[":
                for i, _ in enumerate(text.elements()):
                    yield from _response(text, f"{file}[{i}]", wanted)
                    responses.append(f"{file}[{i}]")
            else:
                yield from _response(text, str(file), wanted)
                responses.append(str(file))
            if not text.at_end():
                raise text.fail(f"extra data after the document at {text.buf[text.pos : text.pos + 20]!r}")


def _response(text: _Text, source: str, wanted: Wanted) -> Iterator[Series]:
    """The series of one answer, checked the way a whole-answer parse would check it."""
    if text.peek() != "{":
        value = text.value()
        raise DataError(f"{source}: expected a Prometheus API response object, got {type(value).__name__}")
    status: Any = "success"
    error: Any = "no error given"
    has_result = False
    for key in text.members():
        if key == "status":
            status = text.value()
        elif key == "error":
            error = text.value()
        elif key == "data" and text.peek() == "{":
            if status != "success":
                raise DataError(f"{source}: the query failed ({status}): {error}")
            for series in _data(text, source, wanted):
                has_result = True
                if series is not None:
                    yield series
        else:
            text.value()
    if status != "success":
        raise DataError(f"{source}: the query failed ({status}): {error}")
    if not has_result:
        raise DataError(f"{source}: no data.result: not a Prometheus range-query response")


def _matrix_error(source: str, kind: Any) -> DataError:
    return DataError(
        f"{source}: resultType is {kind!r}, expected 'matrix' (export with /api/v1/query_range, "
        "not /api/v1/query)"
    )


def _data(text: _Text, source: str, wanted: Wanted) -> Iterator[Series | None]:
    """The series of a `data` object; yields None once when it has a `result` without any."""
    kind: Any = None
    has_result = False
    for key in text.members():
        if key == "resultType":
            kind = text.value()
            if kind != "matrix":
                raise _matrix_error(source, kind)
        elif key == "result":
            has_result = True
            if text.peek() != "[":
                text.value()
                raise DataError(f"{source}: data.result is not a list")
            yield None
            for _ in text.elements():
                yield _series(text, source, wanted, kind)
        else:
            text.value()
    if not has_result:
        raise DataError(f"{source}: no data.result: not a Prometheus range-query response")
    if kind != "matrix":
        raise _matrix_error(source, kind)


def _series(text: _Text, source: str, wanted: Wanted, kind: Any) -> Series:
    if text.peek() != "{":
        return Series(source, text.value(), None, None, None)
    labels: Any = None
    samples: tuple[np.ndarray, np.ndarray] | None = None
    raw: Any = None
    seen_labels = False
    for key in text.members():
        if key == "metric":
            labels, seen_labels = text.value(), True
        elif key == "values":
            pairs = text.pairs_text()
            if pairs is None:
                raw = text.value()
            elif seen_labels and not wanted(labels):
                raw = None  # skipped unread: the caller counts the series by its labels
            else:
                samples = parse_pairs(pairs)
                if samples is None:
                    try:
                        raw = json.loads(pairs)
                    except json.JSONDecodeError as exc:
                        raise text.fail(str(exc)) from exc
        else:
            text.value()
    if samples is None and raw is None and kind != "matrix":
        raise _matrix_error(source, kind)
    return Series(source, None, labels, samples, raw)
