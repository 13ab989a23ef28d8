"""Directories named on the command line, checked before any work: an input that is not there is
refused in one line naming its flag (the caller exits 2), and an output is created with its parents
(or, where the command writes it only at its end, checked to be creatable), or refused in one line
saying why it cannot be."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

Given = Iterable[tuple[str, Path | None]]  # (flag, path), the path None when the flag was not given


def _named(given: Given) -> Iterator[tuple[str, Path]]:
    """The (flag, path) pairs of the flags that were given."""
    return ((flag, path) for flag, path in given if path is not None)


def refuse(command: str, message: str) -> int:
    """Print `faultcast COMMAND: MESSAGE` on stderr, one line; returns 2 (bad usage)."""
    print(f"faultcast {command}: {message}", file=sys.stderr)
    return 2


def missing_input(given: Given) -> str | None:
    """Why the first input directory cannot be read ("--data /x: no such directory"), else None."""
    for flag, path in _named(given):
        if not path.exists():
            return f"{flag} {path}: no such directory"
        if not path.is_dir():
            return f"{flag} {path}: not a directory"
    return None


def missing_file(given: Given) -> str | None:
    """Why the first input file cannot be read ("--costs /x: no such file"), else None."""
    for flag, path in _named(given):
        if not path.exists():
            return f"{flag} {path}: no such file"
        if path.is_dir():
            return f"{flag} {path}: a directory, not a file"
    return None


def uncreatable(given: Given) -> str | None:
    """Why the first output directory could not be created when the command writes it, else None:
    the path is a file, or its nearest existing ancestor is not a directory this user may write."""
    for flag, path in _named(given):
        if path.exists():
            if not path.is_dir():
                return f"{flag} {path}: not a directory (a file is there)"
            continue
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{flag} {path}: cannot be created ({ancestor} is a file)"
        if not os.access(ancestor, os.W_OK | os.X_OK):
            return f"{flag} {path}: cannot be created ({ancestor} is not writable)"
    return None


def create(given: Given) -> str | None:
    """Create each output directory with its parents; why the first could not be, else None."""
    for flag, path in _named(given):
        why = uncreatable([(flag, path)])
        if why is not None:
            return why
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"{flag} {path}: cannot be created ({exc.strerror})"
    return None


def create_parents(given: Given) -> str | None:
    """Create the directory each output file goes in; why the first could not be, else None."""
    for flag, path in _named(given):
        why = create([(flag, path.parent)])
        if why is not None:
            return f"{flag} {path}: its directory {why.removeprefix(f'{flag} ')}"
    return None
