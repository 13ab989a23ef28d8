"""The job's own secret: a key in its snapshot store with which it signs what it pickles there.

Created once, by whichever rank comes first: each writes a key of its own to a temporary file (mode
0600) and hard-links it into place; a link never replaces a file, so the first wins and the others
read it, whole, even on a shared filesystem. Read back only from a regular file, not through a
symbolic link, owned by this user and readable by no one else.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

KEY_FILE = "JOB_KEY"
"""In a snapshot store's root: the job's signing key (32 random bytes, mode 0600)."""
KEY_BYTES = 32


class JobKeyError(RuntimeError):
    """The job's key file is not one this job could have written (or cannot be written)."""


def job_key(root: Path) -> bytes:
    """The signing key of the job whose snapshot store is `root`, created there if it has none.
    JobKeyError when the file there is not the job's own (see the module docstring)."""
    path = root / KEY_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{KEY_FILE}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another rank's key is in place: everyone uses that one
        except OSError as exc:
            raise JobKeyError(f"cannot put the job's key in place at {path} (a hard link): {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symbolic link
        raise JobKeyError(f"the job's key {path} cannot be opened as a plain file: {exc}") from exc
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise JobKeyError(f"the job's key {path} is not a regular file")
        if status.st_uid != os.geteuid():
            raise JobKeyError(f"the job's key {path} belongs to uid {status.st_uid}, not this job's user")
        if status.st_mode & 0o077:
            raise JobKeyError(
                f"the job's key {path} has mode {stat.S_IMODE(status.st_mode):04o}: others may read or "
                "change it (it must be 0600)"
            )
        key = handle.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise JobKeyError(f"the job's key {path} holds {len(key)} bytes, not {KEY_BYTES}")
    return key
