"""Which failures have happened, from every sample as it is taken, from broken collector streams, and
from trainers' reports: the evidence behind FAILED events (service/failure_events.py builds them).

Samples: each node's newest sample is compared with its previous one (faultcast.failure_signs), never
across a restart of its collector: a node whose collector said goodbye, or that fell silent, starts
again from its next sample (a port still down after a repair is no new failure).

Holds: a failure is held for `hold_s` seconds of the service's clock, so that what follows it gives one
FAILED event, not one per sample or per rank. The hold is keyed by what it holds (`hold_key`): a GPU
holds every sign of that GPU (the Xid 79 and the "GPU lost" of one failure); node-level evidence holds
only evidence of its own kind on the node (a port down, the node silent, a trainer's report). So a
trainer's report never hides the node's hardware evidence: a port that goes down, or a collector that
falls silent, after a job reported a dead rank raises its own FAILED event (and drains the node). A
trainer's report does fold into the failure already held on its node (ReportFailure answers with it).

Silence: a collector's Push stream that ends without its goodbye (the collector's process killed,
the node gone, keepalive pings unanswered) starts the node's `silence_grace_s`; a node that opens no
new stream within it has gone silent. A stream closed cleanly (the collector stopping) is a goodbye,
never a failure.

Cut-offs: when the streams of half the nodes or more break within one grace and stay broken, it is the
service or its network that was cut off, not the nodes: none of them is called failed then (a restart of
the service cuts every stream, and each node simply reconnects). Only nodes that broke and stayed broken
count: a node whose stream comes back within the grace is no part of a cut, so the decision waits until
every stream of the burst has been broken for a full grace (at most one grace more). A node whose
streams broke FLAP_BREAKS times within FLAP_WINDOW_S is flapping: logged, counted, shown
(faultcast_flapping_nodes), and never counted towards a cut-off while fewer than half the nodes flap
(when half the fleet or more flaps, it is the service's network that flaps, and their breaks are a
cut-off). A cut-off stands only while the nodes it was decided on stay clear of flapping: a node
away longer than a grace for the first time cannot be told from a cut node when the cut is decided,
so when one of them is found flapping later (even after it came back) the cut is decided again
without it, and when the rest is no cut the nodes of it still away are silent at once. So a minority
of misbehaving collectors cannot make a real death look like a cut-off for more than their third
break, nor longer than CUT_REJOIN_S in any case.

A node of a cut-off that has not come back CUT_REJOIN_S after some node was first heard again after
the cut (at once when a stream was open when the cut was decided) is silent after all: a cut-off
postpones the verdict, it does not forget the node. That moment is taken once and never moved, so
a node whose stream breaks and reopens cannot put the verdict off. The verdict is given only once
some node has been heard at or after its time: while no node at all is heard (every collector of the
fleet hung at once looks the same as the service cut off), nothing is called failed.

Bound: a node whose collector hangs or dies is NODE_SILENT within keepalive (2.5 x keepalive_s, the
stream's end) + silence_grace_s; up to one grace more when other streams broke within its grace; and
CUT_REJOIN_S after some node is first heard again when half the fleet broke with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from faultcast.failure_signs import Evidence, FailureSign, drains_node, failure_signs
from faultcast.readings import NodeSnapshot

log = logging.getLogger(__name__)

DEFAULT_HOLD_S = 600.0
DEFAULT_SILENCE_GRACE_S = 2.0
FLAP_BREAKS = 3  # broken streams of one node within FLAP_WINDOW_S that make it a flapping node
FLAP_WINDOW_S = 60.0
CUT_REJOIN_S = 30.0
"""How long a node of a cut-off has to come back once some node is heard: collectors back off at
most 10 s (+-20%) between tries, so one alive has reconnected well within this."""

HoldKey = tuple[str, int, str]


def hold_key(sign: FailureSign) -> HoldKey:
    """What a sign's hold holds: its GPU (every sign on it that drains the node), or on the node its own
    kind of evidence. An Xid that drains nothing (94) holds only its like: a worse failure of the GPU
    after it still drains the node."""
    if sign.gpu < 0:
        return (sign.node, sign.gpu, sign.evidence.value)
    return (sign.node, sign.gpu, "gpu" if drains_node(sign) else "restart_app")


class FlapListener(Protocol):
    """Hears a node start and stop flapping (the service's metrics)."""

    def flapping(self, node: str, now_flapping: bool, nodes_flapping: int) -> None:
        """`node` started (or stopped) flapping; `nodes_flapping` flap now."""


class _NoListener:
    def flapping(self, node: str, now_flapping: bool, nodes_flapping: int) -> None:
        pass


@dataclass
class _Cut:
    """A burst of broken streams taken for the service cut off, until its nodes are back or judged."""

    counted: frozenset[str]  # the nodes that made it a cut (its burst less the flapping nodes)
    fleet: int  # the nodes seen when it was decided: what it was half of
    away: dict[str, float]  # node -> when its stream broke, while it has not come back
    heard: float | None  # when some node was first heard after the decision; never moved later


class FailureWatch:
    """Finds failure evidence; thread-safe (ingest threads, the event loop and RPC threads call it)."""

    def __init__(
        self,
        *,
        hold_s: float = DEFAULT_HOLD_S,
        silence_grace_s: float = DEFAULT_SILENCE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        flaps: FlapListener | None = None,
    ) -> None:
        if hold_s < 0 or silence_grace_s <= 0:
            raise ValueError(
                f"hold_s must be >= 0 and silence_grace_s > 0, got {hold_s} and {silence_grace_s}"
            )
        self.hold_s, self.silence_grace_s, self.clock = hold_s, silence_grace_s, clock
        self.wall_clock_ns = wall_clock_ns  # the time a silence is stamped with: no node clock speaks
        self._lock = threading.Lock()
        self._previous: dict[str, NodeSnapshot] = {}
        self._held: dict[HoldKey, tuple[float, int]] = {}  # hold_key -> (until, its event id)
        self._streams: dict[str, int] = {}  # node -> Push streams open now
        self._broken: dict[str, float] = {}  # node -> when its last stream broke (clock), while none is open
        self._cuts: list[_Cut] = []  # the cut-offs some of whose nodes have not come back
        self._seen: set[str] = set()  # every node that opened a stream: the fleet a cut-off is half of
        self._heard_until = float("-inf")  # when the last open stream ended (while none is open)
        self._breaks: dict[str, deque[float]] = {}  # node -> when its streams broke, within FLAP_WINDOW_S
        self._flapping: set[str] = set()
        self.flaps: FlapListener = flaps or _NoListener()
        self.folded = 0  # signs within a hold: counted, not published again
        self.cut_off = 0  # broken streams not called failures because many nodes broke at once
        self.flapped = 0  # times a node started flapping

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
        """The first sign of each hold key not held (the lock held); the others are folded into it."""
        now, out, seen = self.clock(), [], set()
        for sign in signs:
            key = hold_key(sign)
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
            self._held[hold_key(sign)] = (self.clock() + self.hold_s, event_id)

    def held_on_node(self, node: str) -> int:
        """The newest FAILED event holding anything on the node now (a GPU, a kind of node-level
        evidence, a trainer's report); 0 when none."""
        with self._lock:
            now = self.clock()
            held = [event for (n, _, _), (until, event) in self._held.items() if n == node and until > now]
            return max(held, default=0)

    def streams_open(self, node: str) -> int:
        """The node's Push streams open now."""
        with self._lock:
            return self._streams.get(node, 0)

    def flapping(self) -> list[str]:
        """The nodes flapping now."""
        with self._lock:
            self._forget_flaps(self.clock())
            return sorted(self._flapping)

    def stream_opened(self, node: str) -> None:
        with self._lock:
            self._seen.add(node)
            now = self.clock()
            self._streams[node] = self._streams.get(node, 0) + 1
            self._broken.pop(node, None)
            for cut in self._cuts:
                cut.away.pop(node, None)
                if cut.heard is None:
                    cut.heard = now  # the first node heard after the cut: its rejoin time starts
            self._cuts = [cut for cut in self._cuts if cut.away]

    def stream_ended(self, node: str, *, goodbye: bool) -> None:
        """A Push stream of the node ended: `goodbye` when the collector closed it."""
        with self._lock:
            left = self._streams.get(node, 0) - 1
            if left > 0:
                self._streams[node] = left
                return
            self._streams.pop(node, None)
            now = self.clock()
            if not self._streams:
                self._heard_until = now
            if goodbye:
                self._previous.pop(node, None)  # its collector stopped: perhaps for a reboot or a repair
                return
            self._broken[node] = now
            self._breaks.setdefault(node, deque()).append(now)
            self._forget_flaps(now)
            if node not in self._flapping and len(self._breaks[node]) >= FLAP_BREAKS:
                self._flapping.add(node)
                self.flapped += 1
                log.warning(
                    "node %s is flapping: its collector's stream broke %d times within %.0f s; it is not "
                    "counted towards a cut-off of the service while it flaps",
                    node,
                    len(self._breaks[node]),
                    FLAP_WINDOW_S,
                )
                self.flaps.flapping(node, True, len(self._flapping))

    def _forget_flaps(self, now: float) -> None:
        """Drop breaks older than FLAP_WINDOW_S; a node with fewer than FLAP_BREAKS left flaps no more."""
        for node in list(self._breaks):
            times = self._breaks[node]
            while times and now - times[0] > FLAP_WINDOW_S:
                times.popleft()
            if len(times) < FLAP_BREAKS and node in self._flapping:
                self._flapping.discard(node)
                log.info("node %s flaps no more", node)
                self.flaps.flapping(node, False, len(self._flapping))
            if not times:
                del self._breaks[node]

    def next_silence_check(self) -> float | None:
        """Seconds until silent() may have something to decide (None when no stream is broken)."""
        with self._lock:
            now = self.clock()
            if self._decidable(now) or any(self._cut_over(cut, now) for cut in self._cuts):
                return 0.0
            waits = [at + self.silence_grace_s - now for at in self._broken.values()]
            waits += [cut.heard + CUT_REJOIN_S - now for cut in self._cuts if cut.heard is not None]
            future = [w for w in waits if w > 0]
            if future:
                return min(future)
            return None  # nothing broken, or cut-off nodes waiting for some node to be heard again

    def silent(self) -> list[FailureSign]:
        """Nodes whose stream broke at least silence_grace_s ago and that have not come back: gone
        silent, unless the streams of half the nodes or more broke within one grace of each other and
        stayed broken (then they are watched CUT_REJOIN_S more, see the module's docstring)."""
        with self._lock:
            now = self.clock()
            self._forget_flaps(now)
            found: dict[str, float] = {}
            while self._decidable(now):
                first = min(self._broken.values())
                burst = {n: at for n, at in self._broken.items() if at - first <= self.silence_grace_s}
                counted = frozenset(burst) - self._uncounted()
                if not self._is_cut(counted, len(self._seen)):
                    for node, at in burst.items():  # a flapping node within its grace waits for it
                        if now - at >= self.silence_grace_s:
                            del self._broken[node]
                            found[node] = at
                    continue
                for node in burst:  # the whole burst, decided once: its later nodes too
                    del self._broken[node]
                heard = now if self._streams else None  # some node is heard as it is decided
                self._cuts.append(_Cut(counted, len(self._seen), burst, heard))
                self.cut_off += len(burst)
                log.warning(
                    "the streams of %d of %d nodes broke together and stayed broken: taken for the "
                    "service being cut off, not as %d failures; a node not back %.0f s after others "
                    "are heard again is called silent",
                    len(counted),
                    len(self._seen),
                    len(counted),
                    CUT_REJOIN_S,
                )
            for cut in [cut for cut in self._cuts if self._cut_over(cut, now)]:
                self._cuts.remove(cut)
                found.update(cut.away)
                if not self._is_cut(cut.counted - self._uncounted(), cut.fleet):
                    log.warning(
                        "nodes taken for a cut-off of the service flap (%s): it was no cut-off, and "
                        "the %d of its nodes still away are silent",
                        ", ".join(sorted(cut.counted & self._uncounted())),
                        len(cut.away),
                    )
            for node in found:
                self._previous.pop(node, None)  # what it sends when it is back is compared anew
            signs = [
                FailureSign(
                    node,
                    -1,
                    "",
                    Evidence.NODE_SILENT,
                    f"the node's collector stream broke {now - at:.1f} s ago and it has not come back",
                    self.wall_clock_ns(),
                )
                for node, at in found.items()
            ]
            return self._unheld(signs)

    def _uncounted(self) -> set[str]:
        """The nodes no cut-off counts (the lock held): the flapping ones, while fewer than half the
        fleet flaps (when half or more flap, it is the service's network that flaps)."""
        return self._flapping if 2 * len(self._flapping) < len(self._seen) else set()

    @staticmethod
    def _is_cut(counted: frozenset[str], fleet: int) -> bool:
        return len(counted) >= 2 and 2 * len(counted) >= fleet

    def _cut_over(self, cut: _Cut, now: float) -> bool:
        """Whether the cut's nodes still away are silent now (the lock held): it is no cut without
        the nodes found flapping since, or CUT_REJOIN_S have passed since some node was first heard
        after it and some node has been heard since then."""
        if not self._is_cut(cut.counted - self._uncounted(), cut.fleet):
            return True
        if cut.heard is None:
            return False
        heard_last = now if self._streams else self._heard_until
        return heard_last >= cut.heard + CUT_REJOIN_S

    def _decidable(self, now: float) -> bool:
        """Whether the earliest broken stream's burst can be decided now (the lock held): its first
        node's grace is over, and every node of it that counts towards a cut-off has stayed broken a
        full grace (one that comes back within its grace is no part of a cut)."""
        if not self._broken:
            return False
        first = min(self._broken.values())
        if now - first < self.silence_grace_s:
            return False
        uncounted = self._uncounted()
        return all(
            now - at >= self.silence_grace_s
            for n, at in self._broken.items()
            if at - first <= self.silence_grace_s and n not in uncounted
        )
