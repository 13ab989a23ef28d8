"""Which failures have happened, from every sample as it is taken, from broken collector streams, and
from trainers' reports: the evidence behind FAILED events (service/failure_events.py builds them).

Samples: each node's newest sample is compared with its previous one (faultcast.failure_signs). A
GPU (or, for node-level evidence, the node) that failed is held for `hold_s` seconds of the service's
clock: the Xid 79 and the "GPU lost" that follow one failure, or every rank of a job reporting the
same death, give one FAILED event, not one per sample or per rank.

Silence: a collector's Push stream that ends without its goodbye (the collector's process killed,
the node gone, keepalive pings unanswered) starts the node's `silence_grace_s`; a node that opens no
new stream within it has gone silent. A stream closed cleanly (the collector stopping) is a goodbye,
never a failure. When streams of half the nodes or more break within one grace, it is the service or
its network that was cut off, not the nodes: none of them is called failed (a restart of the service
cuts every stream, and each node simply reconnects).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from faultcast.failure_signs import Evidence, FailureSign, failure_signs
from faultcast.readings import NodeSnapshot

DEFAULT_HOLD_S = 600.0
DEFAULT_SILENCE_GRACE_S = 2.0


class FailureWatch:
    """Finds failure evidence; thread-safe (ingest threads, the event loop and RPC threads call it)."""

    def __init__(
        self,
        *,
        hold_s: float = DEFAULT_HOLD_S,
        silence_grace_s: float = DEFAULT_SILENCE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if hold_s < 0 or silence_grace_s <= 0:
            raise ValueError(
                f"hold_s must be >= 0 and silence_grace_s > 0, got {hold_s} and {silence_grace_s}"
            )
        self.hold_s, self.silence_grace_s, self.clock = hold_s, silence_grace_s, clock
        self.wall_clock_ns = wall_clock_ns  # the time a silence is stamped with: no node clock speaks
        self._lock = threading.Lock()
        self._previous: dict[str, NodeSnapshot] = {}
        self._held: dict[tuple[str, int], tuple[float, int]] = {}  # (node, gpu) -> (until, its event id)
        self._streams: dict[str, int] = {}  # node -> Push streams open now
        self._broken: dict[str, float] = {}  # node -> when its last stream broke (clock), while none is open
        self._seen: set[str] = set()  # every node that opened a stream: the fleet a cut-off is half of
        self.folded = 0  # signs within a hold: counted, not published again
        self.cut_off = 0  # broken streams not called failures because many nodes broke at once

    # -- samples --------------------------------------------------------------------------------

    def observe(self, snapshot: NodeSnapshot) -> list[FailureSign]:
        """The signs in the node's newest sample not held already (one per GPU, or one for the node)."""
        with self._lock:
            previous = self._previous.get(snapshot.node)
            if previous is not None and snapshot.time_unix_nano < previous.time_unix_nano:
                return []  # a late sample (a spool replaying) is compared with nothing
            self._previous[snapshot.node] = snapshot
            return self._unheld(failure_signs(previous, snapshot))

    def _unheld(self, signs: list[FailureSign]) -> list[FailureSign]:
        """The first sign of each (node, gpu) not held (the lock held); the others are folded into it."""
        now, out, seen = self.clock(), [], set()
        for sign in signs:
            key = (sign.node, sign.gpu)
            held = self._held.get(key)
            if key in seen or (held is not None and held[0] > now):
                self.folded += 1
                continue
            seen.add(key)
            out.append(sign)
            # Held at once (its event's id comes when it is stored): what the next sample shows of the
            # same failure, before the event is written, is folded in too.
            self._held[key] = (now + self.hold_s, 0)
        return out

    def hold(self, sign: FailureSign, event_id: int) -> None:
        """The sign's FAILED event is stored as `event_id`: hold its GPU (or node) for hold_s."""
        with self._lock:
            self._held[(sign.node, sign.gpu)] = (self.clock() + self.hold_s, event_id)

    def held_on_node(self, node: str) -> int:
        """The newest FAILED event holding any GPU of the node, or the node, now; 0 when none."""
        with self._lock:
            now = self.clock()
            held = [event for (n, _), (until, event) in self._held.items() if n == node and until > now]
            return max(held, default=0)

    def streams_open(self, node: str) -> int:
        """The node's Push streams open now."""
        with self._lock:
            return self._streams.get(node, 0)

    def stream_opened(self, node: str) -> None:
        with self._lock:
            self._seen.add(node)
            self._streams[node] = self._streams.get(node, 0) + 1
            self._broken.pop(node, None)

    def stream_ended(self, node: str, *, goodbye: bool) -> None:
        """A Push stream of the node ended: `goodbye` when the collector closed it."""
        with self._lock:
            left = self._streams.get(node, 0) - 1
            if left > 0:
                self._streams[node] = left
                return
            self._streams.pop(node, None)
            if not goodbye:
                self._broken[node] = self.clock()

    def next_silence_check(self) -> float | None:
        """Seconds until the earliest broken stream's grace ends (None when none waits)."""
        with self._lock:
            if not self._broken:
                return None
            return max(0.0, min(self._broken.values()) + self.silence_grace_s - self.clock())

    def silent(self) -> list[FailureSign]:
        """Nodes whose stream broke at least silence_grace_s ago and that have not come back: gone
        silent, unless streams of half the nodes or more broke within one grace of each other."""
        with self._lock:
            now = self.clock()
            due = {n: at for n, at in self._broken.items() if now - at >= self.silence_grace_s}
            if not due:
                return []
            first = min(due.values())
            together = [n for n, at in self._broken.items() if at - first <= self.silence_grace_s]
            if len(together) >= 2 and 2 * len(together) >= len(self._seen):
                for node in together:  # the whole burst, decided once: its later nodes are cut off too
                    del self._broken[node]
                self.cut_off += len(together)
                return []
            for node in due:
                del self._broken[node]
            signs = [
                FailureSign(
                    node,
                    -1,
                    "",
                    Evidence.NODE_SILENT,
                    f"the node's collector stream broke {now - at:.1f} s ago and it has not come back",
                    self.wall_clock_ns(),
                )
                for node, at in due.items()
            ]
            return self._unheld(signs)
