"""Filling a disk to the last byte: the small tmpfs the `small_disk` fixture (tests/conftest.py)
mounts, for the tests of what a full disk does."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fill(disk: Path) -> Path:
    """Write a file until the filesystem has no byte left; returns it (delete it to free the disk).
    A write refused for any other reason than a full disk is raised."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (4096, 512, 64, 1):  # the last partial blocks too
            _write_until_full(fd, size)
    finally:
        os.close(fd)
    return filler


def _write_until_full(fd: int, size: int) -> None:
    chunk = b"\0" * size
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
