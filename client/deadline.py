"""One deadline for a whole exchange over a socket.

A socket's own timeout bounds each call: a peer that sends one byte just before it runs out keeps
the exchange going as long as it likes. A `Deadline` gives every call only what is left of the
exchange's time, so a dripping peer cannot stretch it.
"""

from __future__ import annotations

import socket
import time


class Deadline:
    """`seconds` from now (monotonic clock). `bound(connection)` before each socket call gives it
    what is left; TimeoutError (an OSError, like the socket's own timeout) once nothing is."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline must be in the future, not {seconds!r} s away")
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (negative once past)."""
        return self._at - time.monotonic()

    def bound(self, connection: socket.socket) -> None:
        """Give `connection`'s next call what is left of the deadline; TimeoutError when past it."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(f"past the deadline of {self.seconds:g} s")
        connection.settimeout(left)
