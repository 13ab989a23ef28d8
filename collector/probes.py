"""Latency probes to peer nodes: TCP connect round trips, like tcping.

ICMP echo needs a raw socket (root or CAP_NET_RAW); a TCP connect needs nothing, and the
three-way handshake costs one round trip, so the time `connect()` takes is the RTT. A refused
connection, a timeout, an unreachable network or a failed name lookup all count as a lost probe.

Each peer keeps a window of its last `window` probes; `stats()` reports the median and 99th
percentile of the successful round trips in the window, the fraction of the window that failed,
and the cumulative number of probes sent.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

# sshd listens on every node of a training cluster, so a bare host name probes port 22.
DEFAULT_PEER_PORT = 22

NAN = math.nan


@dataclass(frozen=True, slots=True)
class PeerStats:
    """One peer's window. Round trips are NaN when the window holds no successful probe."""

    p50_seconds: float
    p99_seconds: float
    loss_ratio: float  # failed / probes in the window; NaN before the first probe
    probes: int  # probes sent since the prober was made (cumulative)
    in_window: int  # probes the window holds now (at most `window`)
    last_error: str | None = None  # why the newest failed probe failed, for logs


def parse_peer(text: str, default_port: int = DEFAULT_PEER_PORT) -> tuple[str, int]:
    """Parse a `--peer` value: "host:port", "host", "[v6addr]:port", "[v6addr]" or a bare v6 address.

    A missing port means `default_port` (22, sshd). Raises ValueError on an empty host or a bad port.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad peer {text!r}: expected [address]:port")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:  # a name, an IPv4 address, or an unbracketed IPv6 address (no port possible)
        host, port_text = text, ""
    if not host:
        raise ValueError(f"bad peer {text!r}: empty host")
    if not port_text:
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad peer {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad peer {text!r}: port {port} out of range")
    return host, port


def peer_id(host: str, port: int) -> str:
    """The device id of a peer: "host:port", with IPv6 addresses bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no data."""
    if not ordered:
        return NAN
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class _Window:
    __slots__ = ("last_error", "probes", "samples")

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=size)  # RTT in seconds, NaN for a lost probe
        self.probes = 0
        self.last_error: str | None = None


class PeerProber:
    """Probes peers by TCP connect and keeps a window of round trips per peer.

    `probe_once()` probes every peer once, concurrently, so a dead peer delays the round by at
    most `timeout` (name lookups are not bounded by it). `start()` runs `probe_once` every
    `interval` seconds in a daemon thread until `close()`. All methods are thread-safe.
    """

    def __init__(
        self,
        peers: Sequence[tuple[str, int]],
        *,
        interval: float = 1.0,
        timeout: float = 1.0,
        window: int = 60,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1:
            raise ValueError("window must hold at least one probe")
        self.peers: tuple[tuple[str, int], ...] = tuple(dict.fromkeys(peers))
        self.interval = interval
        self.timeout = timeout
        self.window = window
        self._clock = clock
        self._ids = [peer_id(host, port) for host, port in self.peers]
        self._windows = {pid: _Window(window) for pid in self._ids}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        """True while the background thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _probe(self, host: str, port: int) -> tuple[float, str | None]:
        """One TCP connect round trip: (seconds, None) or (NaN, why it failed)."""
        try:
            family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(self.timeout)
                started = self._clock()
                sock.connect(address)
                return self._clock() - started, None
        except OSError as exc:  # refused, timed out, unreachable, lookup failed
            return NAN, f"{type(exc).__name__}: {exc}"

    def probe_once(self) -> None:
        """Probe every peer once and record the results."""
        if not self.peers:
            return
        if len(self.peers) == 1:
            results = [self._probe(*self.peers[0])]
        else:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        max_workers=min(32, len(self.peers)), thread_name_prefix="faultcast-probe"
                    )
                executor = self._executor
            results = list(executor.map(lambda peer: self._probe(*peer), self.peers))
        with self._lock:
            for pid, (rtt, error) in zip(self._ids, results, strict=True):
                win = self._windows[pid]
                win.samples.append(rtt)
                win.probes += 1
                if error is not None:
                    if error != win.last_error:
                        log.debug("probe to %s failed: %s", pid, error)
                    win.last_error = error

    def stats(self) -> dict[str, PeerStats]:
        """Each peer's window, keyed by device id ("host:port"), in the order the peers were given."""
        with self._lock:
            snapshot = [(pid, list(w.samples), w.probes, w.last_error) for pid, w in self._windows.items()]
        out: dict[str, PeerStats] = {}
        for pid, samples, probes, last_error in snapshot:
            ok = sorted(s for s in samples if not math.isnan(s))
            out[pid] = PeerStats(
                p50_seconds=_percentile(ok, 0.50),
                p99_seconds=_percentile(ok, 0.99),
                loss_ratio=(len(samples) - len(ok)) / len(samples) if samples else NAN,
                probes=probes,
                in_window=len(samples),
                last_error=last_error,
            )
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.probe_once()
            except Exception:  # a bug in one round must not end the probing
                log.exception("peer probe round failed")
            self._stop.wait(max(0.0, self.interval - (self._clock() - started)))

    def start(self) -> PeerProber:
        """Start probing every `interval` seconds in a daemon thread; returns self."""
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError("this prober is closed")
            if self._thread is not None:
                raise RuntimeError("this prober is already started")
            self._thread = threading.Thread(target=self._run, name="faultcast-prober", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread; waits for at most the round in flight (bounded by `timeout`). Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.timeout + 1.0)
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
