"""The connection slots of a peer-state server, which slow clients cannot hold against a standby.

A server keeps at most `size` connections at once (one thread each). A connection that has not yet
sent its whole request is only *waiting*: when every slot is taken, a newcomer takes the place of
the oldest waiting one, which is shut down. A standby sends its request as soon as it is connected,
so it waits for a round trip at most and is not pushed out; a client that drips its request, or
says nothing, is (and each is dropped anyway once the handshake's deadline passes). Only when every
slot is answering a request is a newcomer turned away.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Slots:
    """At most `size` connections at once; `take` on accepting, `answering` once the request is in,
    `release` when done (before the connection is closed)."""

    def __init__(self, size: int, *, evict_wait_s: float) -> None:
        if size < 1:
            raise ValueError("a server needs at least one connection slot")
        self._free = threading.BoundedSemaphore(size)
        self._evict_wait_s = evict_wait_s  # for the evicted connection's thread to give its slot back
        self._lock = threading.Lock()
        self._waiting: dict[socket.socket, None] = {}  # oldest first (dicts keep insertion order)
        self.evicted = 0

    def take(self, connection: socket.socket) -> bool:
        """A slot for `connection`, waiting for its request; when none is free, the slot of the oldest
        waiting connection (shut down). False when every slot is answering a request."""
        if not self._free.acquire(blocking=False):
            with self._lock:
                oldest = next(iter(self._waiting), None)
                if oldest is None:
                    return False
                del self._waiting[oldest]
                # Under the lock: its thread releases (under the lock) before it closes the socket, so
                # this shuts down that connection and never a later socket that reused its descriptor.
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)
            self.evicted += 1
            if not self._free.acquire(timeout=self._evict_wait_s):
                return False
        with self._lock:
            self._waiting[connection] = None
        return True

    def answering(self, connection: socket.socket) -> bool:
        """`connection` sent its whole request: it can no longer be pushed out. False when it was
        pushed out meanwhile (it must be dropped)."""
        with self._lock:
            if connection not in self._waiting:
                return False
            del self._waiting[connection]
            return True

    def release(self, connection: socket.socket) -> None:
        """`connection`'s slot is free again; call before closing it."""
        with self._lock:
            self._waiting.pop(connection, None)
        self._free.release()
