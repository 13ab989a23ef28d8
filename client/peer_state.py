"""A rank's staged snapshot, served from its host memory to the standby that takes the job over.

The alert snapshot's blocking part is a copy of the state to host memory (`stage`); the write to the
snapshot directory goes on in the background from that copy. When a standby may take the job over,
each rank also serves its copy over TCP (`PeerServer`), and the standby's rank of the same number
fetches it (`fetch`) instead of reading the written files: one stream from the old node's memory
rather than every node of the job reading shared storage at once. The snapshot directory is still
written whole first (the service hears SNAPSHOT_DONE only then), so a standby that cannot reach its
peer falls back to the files and loses nothing.

Where each rank listens, and its two secrets, are in the snapshot directory (PEERS.json, readable by
the job's user like the snapshot itself): a token a request must carry, and a key that never crosses
the network, with which the reply's description of the state (its structure, dtypes and shapes, and
the per-rank part) is signed (HMAC-SHA256). Someone who saw a request can ask again, not forge a
reply. Nothing here is unpickled: the per-rank part travels as the bytes the job sealed with its own
key (client/rank_part.py), which the standby verifies before it unpickles them. Tensor bytes follow
raw, in order.

Plain tensors only: a state holding DTensors or sharded tensors (FSDP) is not served, and its
standby reads the files.

Slow peers cannot stall either side. A fetch has one deadline for all of it (connect, request, the
description, every piece of every tensor), past which it fails and the standby reads the files. A
server drops a connection whose request is not whole within HANDSHAKE_S, however it is dripped, and
a standby's connection takes the slot of a client still dripping its request (client/peer_slots.py);
a fetch turned away by a full server tries again within its deadline.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from faultcast.client.deadline import Deadline
from faultcast.client.peer_slots import Slots

log = logging.getLogger(__name__)

PEERS = "PEERS.json"
"""In a snapshot directory: where each rank of the job that took it serves it, and with which key."""
PEER_HOST = "FAULTCAST_PEER_HOST"
"""The address a rank listens on and tells its standby to reach it at (default: every interface,
named by the host's name)."""
SERVE_S = 20.0
"""How long a handed-over rank goes on serving, at most, once the scheduler asked it to end (under
Slurm's default KillWait and torchrun's grace, both 30 s)."""
HANDSHAKE_S = 5.0  # a connection that has not sent its whole request by then is dropped
MAX_CONNECTIONS = 8  # at once; one per standby rank is what a hand-over needs
MAX_HEADER = 64 << 20  # the description of a state; a longer one is refused before it is read
_MAGIC = b"FCPEER1\n"
_KEY_BYTES = 32
_REQUEST = struct.Struct(f"!{len(_MAGIC)}s{_KEY_BYTES}sI")  # magic, token, rank
_LENGTH = struct.Struct("!Q")
_OK, _REFUSED = b"\x00", b"\x01"
_CHUNK = 16 << 20  # tensors are received straight into their storage, this much at a time
_RETRY_S = (0.02, 0.5)  # a fetch turned away by a full server tries again: first pause, longest pause


class PeerError(Exception):
    """The peer could not be reached, refused, or sent what does not verify."""


class NotServableError(ValueError):
    """The state holds something the peer protocol does not carry (a DTensor, an unknown object)."""


# -- staging ------------------------------------------------------------------------------------


def stage(state: Any) -> Any:
    """A copy of `state` in host memory that training can no longer change: torch's own stager (what
    `async_save` stages with), so DTensors and sharded tensors are copied as what they are; other
    leaves are shared (they are immutable: bytes, numbers, strings)."""
    staged = BlockingAsyncStager().stage(state)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    return staged


def nbytes(state: Any) -> int:
    """The bytes of every tensor and bytes leaf in `state`."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, bytes):
        return len(state)
    if isinstance(state, dict):
        return sum(nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(nbytes(v) for v in state)
    return 0


# -- the description of a state: JSON, tensors by index ------------------------------------------


def _describe(value: Any, tensors: list[torch.Tensor]) -> object:
    """`value` as JSON-able data; tensors are appended to `tensors` and named by their index.
    NotServableError for what cannot be described exactly."""
    if type(value) is torch.Tensor:  # a subclass (DTensor, ShardedTensor) carries placement we do not
        if value.is_cuda or not value.is_contiguous():
            raise NotServableError("a tensor not staged to host memory")
        tensors.append(value)
        return {"t": [len(tensors) - 1, str(value.dtype).removeprefix("torch."), list(value.shape)]}
    if isinstance(value, torch.Tensor):
        raise NotServableError(f"a {type(value).__name__} (sharded state is read from the files)")
    if isinstance(value, bool):
        return {"o": value}
    if isinstance(value, int):
        return {"i": str(value)}
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode("ascii")}
    if value is None:
        return {"n": 0}
    if isinstance(value, dict):
        return {"d": [[_describe(k, tensors), _describe(v, tensors)] for k, v in value.items()]}
    if isinstance(value, list):
        return {"l": [_describe(v, tensors) for v in value]}
    if isinstance(value, tuple):
        return {"u": [_describe(v, tensors) for v in value]}
    raise NotServableError(f"a {type(value).__name__} in the state")


def _rebuild(node: object, tensors: list[torch.Tensor]) -> Any:
    """What `_describe` described, its tensors taken from `tensors` by index."""
    if not isinstance(node, dict) or len(node) != 1:
        raise PeerError(f"the state's description has {node!r} where a value belongs")
    ((kind, body),) = node.items()
    match kind:
        case "t":
            return tensors[int(body[0])]
        case "o":
            return bool(body)
        case "i":
            return int(body)
        case "f":
            return float.fromhex(body)
        case "s":
            return str(body)
        case "b":
            return base64.b64decode(body)
        case "n":
            return None
        case "d":
            return {_rebuild(k, tensors): _rebuild(v, tensors) for k, v in body}
        case "l":
            return [_rebuild(v, tensors) for v in body]
        case "u":
            return tuple(_rebuild(v, tensors) for v in body)
    raise PeerError(f"the state's description has an unknown kind {kind!r}")


def _tensor_specs(node: object, found: list[tuple[str, list[int]]]) -> None:
    """Every tensor's (dtype, shape) in a description, in index order (they are numbered as met)."""
    if isinstance(node, dict):
        if set(node) == {"t"}:
            found.append((str(node["t"][1]), [int(n) for n in node["t"][2]]))
            return
        for body in node.values():
            _tensor_specs(body, found)
    elif isinstance(node, list):
        for item in node:
            _tensor_specs(item, found)


# -- serving ----------------------------------------------------------------------------------


class PeerServer:
    """Serves one rank's staged state to whoever presents the token (any number of times) until
    closed. `served` (or the event given) is set once a whole copy went out. Listens on `host`, else
    FAULTCAST_PEER_HOST, else every interface, and names that address (or the host's name) in
    `address`. NotServableError when the state cannot be sent."""

    def __init__(
        self, staged: Any, rank: int, *, host: str | None = None, served: threading.Event | None = None
    ) -> None:
        self.rank = rank
        self.token = secrets.token_bytes(_KEY_BYTES)
        self.key = secrets.token_bytes(_KEY_BYTES)
        self._tensors: list[torch.Tensor] = []
        header = json.dumps(_describe(staged, self._tensors), separators=(",", ":")).encode()
        self._header = header + hmac.new(self.key, header, "sha256").digest()
        self.served = served if served is not None else threading.Event()
        self.refused = 0
        bind = host or os.environ.get(PEER_HOST) or ""
        self._socket = socket.create_server((bind, 0))
        self.address = f"{bind or socket.gethostname()}:{self._socket.getsockname()[1]}"
        self._closed = threading.Event()
        self._slots = Slots(MAX_CONNECTIONS, evict_wait_s=HANDSHAKE_S)
        threading.Thread(target=self._accept, name=f"faultcast-peer-{rank}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            if self._closed.is_set() or not self._slots.take(connection):
                connection.close()  # closing, or every slot answers a request: the fetch tries again
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    @property
    def evicted(self) -> int:
        """Connections pushed out of their slot, before their request was whole, by a newer one."""
        return self._slots.evicted

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                self._answer(connection)
            except (OSError, PeerError, struct.error) as exc:
                log.warning("faultcast: serving rank %d's snapshot to a standby failed: %s", self.rank, exc)
            finally:
                self._slots.release(connection)

    def _answer(self, connection: socket.socket) -> None:
        # One deadline for the whole request: a client dripping it is dropped all the same.
        request = _receive(connection, _REQUEST.size, Deadline(HANDSHAKE_S))
        if not self._slots.answering(connection):
            return  # pushed out by a newer connection while its request came in
        magic, token, rank = _REQUEST.unpack(request)
        if magic != _MAGIC or not hmac.compare_digest(token, self.token) or rank != self.rank:
            self.refused += 1
            log.warning("faultcast: refused a request for rank %d's snapshot (wrong token or rank)", rank)
            connection.sendall(_REFUSED)
            return
        connection.settimeout(SERVE_S)  # for each piece: a large tensor goes out in several
        connection.sendall(_OK + _LENGTH.pack(len(self._header)) + self._header)
        for tensor in self._tensors:
            raw = _raw(tensor)
            for at in range(0, len(raw), _CHUNK):
                connection.sendall(raw[at : at + _CHUNK])
        self.served.set()

    def close(self) -> None:
        """Stop serving (a fetch under way still completes)."""
        self._closed.set()
        with contextlib.suppress(OSError):  # wakes the accepting thread (closing alone leaves it listening)
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()


def _raw(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (contiguous host tensors only; any dtype, bfloat16 too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def fetch(address: str, token: bytes, key: bytes, rank: int, *, timeout_s: float = SERVE_S) -> Any:
    """Rank `rank`'s staged state from the peer at `address` ("host:port"), asked for with `token`
    and checked with `key`, all of it within `timeout_s`; PeerError when it cannot be had whole and
    signed by then. A server that closes the connection before answering (every slot taken) is
    asked again, within the same deadline."""
    host, _, port = address.rpartition(":")
    deadline = Deadline(timeout_s)
    pause, retry = _RETRY_S[0], threading.Event()  # never set: its wait paces the next try
    while True:
        try:
            return _fetch_once(host, int(port), token, key, rank, deadline)
        except _TurnedAwayError as exc:
            if deadline.left() <= pause:
                raise PeerError(
                    f"fetching rank {rank}'s snapshot from {address}: turned away until the deadline "
                    f"of {timeout_s:g} s ({exc})"
                ) from exc
            log.info("faultcast: the peer at %s turned the fetch away (%s), trying again", address, exc)
            retry.wait(pause)
            pause = min(2 * pause, _RETRY_S[1])
        except TimeoutError as exc:
            raise PeerError(
                f"fetching rank {rank}'s snapshot from {address}: not whole within {timeout_s:g} s"
            ) from exc
        except (OSError, ValueError, struct.error) as exc:
            raise PeerError(f"fetching rank {rank}'s snapshot from {address}: {exc}") from exc


class _TurnedAwayError(Exception):
    """The server closed the connection before it answered the request: no slot was free."""


def _fetch_once(host: str, port: int, token: bytes, key: bytes, rank: int, deadline: Deadline) -> Any:
    address = f"{host}:{port}"
    left = deadline.left()
    if left <= 0:
        raise TimeoutError(f"past the deadline of {deadline.seconds:g} s")
    with socket.create_connection((host, port), timeout=left) as connection:
        try:
            deadline.bound(connection)
            connection.sendall(_REQUEST.pack(_MAGIC, token, rank))
            answer = _receive(connection, 1, deadline)
        except (ConnectionResetError, BrokenPipeError, _ClosedEarlyError) as exc:
            raise _TurnedAwayError(str(exc) or type(exc).__name__) from exc
        if answer != _OK:
            raise PeerError(f"the peer at {address} refused the request for rank {rank}")
        (length,) = _LENGTH.unpack(_receive(connection, _LENGTH.size, deadline))
        if not 32 < length <= MAX_HEADER:
            raise PeerError(f"the peer at {address} announces a description of {length} bytes")
        signed = _receive(connection, length, deadline)
        header, signature = signed[:-32], signed[-32:]
        if not hmac.compare_digest(signature, hmac.new(key, header, "sha256").digest()):
            raise PeerError(f"the state from {address} is not signed with its key")
        description = json.loads(header)
        specs: list[tuple[str, list[int]]] = []
        _tensor_specs(description, specs)
        tensors = [_receive_tensor(connection, dtype, shape, deadline) for dtype, shape in specs]
    return _rebuild(description, tensors)


def _receive_tensor(
    connection: socket.socket, dtype_name: str, shape: list[int], deadline: Deadline
) -> torch.Tensor:
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise PeerError(f"the peer sent a tensor of unknown dtype {dtype_name!r}")
    tensor = torch.empty(shape, dtype=dtype)
    _fill(connection, _raw(tensor), deadline)
    return tensor


def _receive(connection: socket.socket, size: int, deadline: Deadline) -> bytes:
    buffer = bytearray(size)
    _fill(connection, memoryview(buffer), deadline)
    return bytes(buffer)


class _ClosedEarlyError(PeerError):
    """The other side closed the connection before all that was due came."""


def _fill(connection: socket.socket, view: memoryview, deadline: Deadline) -> None:
    """Receive exactly len(view) bytes into `view` (straight into a tensor's storage, for one) before
    `deadline`: each receive gets only what is left of it (TimeoutError past it)."""
    got = 0
    while got < len(view):
        deadline.bound(connection)
        n = connection.recv_into(view[got : got + _CHUNK])
        if n == 0:
            raise _ClosedEarlyError("the peer closed the connection early")
        got += n


def same_layout(got: Any, like: Any) -> bool:
    """Whether `got` has `like`'s structure: the same keys and container kinds, and tensors of the
    same dtype and shape where `like` has tensors (what `restore` can take without failing half-way)."""
    if isinstance(like, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == like.dtype and got.shape == like.shape
    if isinstance(like, dict):
        return (
            isinstance(got, dict)
            and got.keys() == like.keys()
            and all(same_layout(got[k], v) for k, v in like.items())
        )
    if isinstance(like, (list, tuple)):
        return (
            type(got) is type(like)
            and len(got) == len(like)
            and all(same_layout(g, v) for g, v in zip(got, like, strict=True))
        )
    return type(got) is type(like) or (isinstance(got, (int, float)) and isinstance(like, (int, float)))


# -- where the peers are -------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """Where one rank serves its copy, and its secrets (see the module docstring)."""

    address: str
    token: bytes
    key: bytes

    @classmethod
    def of(cls, server: PeerServer) -> Peer:
        return cls(server.address, server.token, server.key)


def write_peers(directory: Path, peers: list[Peer]) -> None:
    """Rank 0: record every rank's peer in the snapshot directory, readable by the job's user only
    (written whole, then renamed)."""
    tmp = directory / (PEERS + ".tmp")
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(
            {"ranks": [{"address": p.address, "token": p.token.hex(), "key": p.key.hex()} for p in peers]},
            handle,
        )
    tmp.replace(directory / PEERS)


def read_peers(directory: Path) -> list[Peer] | None:
    """The peers of the snapshot in `directory`, by rank; None when it has none (or they cannot be read)."""
    try:
        ranks = json.loads((directory / PEERS).read_text())["ranks"]
        return [Peer(str(r["address"]), bytes.fromhex(r["token"]), bytes.fromhex(r["key"])) for r in ranks]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning(
            "faultcast: %s in %s is unreadable, the snapshot is read from the files: %s",
            PEERS,
            directory,
            exc,
        )
        return None


# -- ending a handed-over rank ---------------------------------------------------------------------


@contextlib.contextmanager
def termination_deferred(until: threading.Event, limit_s: float = SERVE_S) -> Iterator[None]:
    """While inside: a SIGTERM (the scheduler ending the handed-over job) waits until `until` is set
    or `limit_s` passes, then takes its ordinary course. Only in the main thread (signals go there)
    and only over a handler Python knows of (one set in C is left alone)."""
    installed = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or installed is None:
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        if not until.is_set():
            log.info("faultcast: SIGTERM deferred until the standby fetched this rank's snapshot")
            if not until.wait(limit_s):
                log.warning(
                    "faultcast: ending before the standby fetched this rank's snapshot (it reads the files)"
                )
        signal.signal(signal.SIGTERM, installed)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, installed)
