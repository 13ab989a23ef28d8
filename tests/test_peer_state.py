"""A rank's staged snapshot served to its standby (client/peer_state.py): the copy is decoupled from
training, comes back bit for bit over a real socket, is refused without the key, is never used
when its signature does not verify, and a handed-over rank's SIGTERM waits until its copy went out."""

from __future__ import annotations

import math
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from faultcast.client import peer_state
from faultcast.client.train_state import RANK_KEY, TrainState


def _trained_state() -> dict[str, object]:
    """A TrainState's save dict after one Adam step (0-dim step tensors, betas tuples, the pickled
    rank part), plus the odd leaves a state may hold."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 6)).sum().backward()
    optimizer.step()
    state: dict[str, object] = TrainState(model=model, optimizer=optimizer).to_save(7, 1, bytes(32))
    state["odd"] = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "nan": math.nan,
        "big": 2**70,
        "flags": (True, None, "text"),
        3: [1.5, b"\x00\xff"],
    }
    return state


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and a == b


def test_the_staged_copy_comes_back_bit_for_bit_and_training_no_longer_touches_it() -> None:
    state = _trained_state()
    staged = peer_state.stage(state)
    assert _equal(staged, state)
    weight = state["model"]["0.weight"]  # type: ignore[index]
    weight.add_(1.0)  # training goes on after the copy
    assert not torch.equal(staged["model"]["0.weight"], weight)

    server = peer_state.PeerServer(staged, rank=1, host="127.0.0.1")
    try:
        fetched = peer_state.fetch(server.address, server.token, server.key, 1)
    finally:
        server.close()
    assert _equal(fetched, staged)
    assert server.served.is_set()
    assert peer_state.nbytes(fetched) == peer_state.nbytes(staged) > 0
    assert isinstance(fetched[RANK_KEY.format(rank=1)], bytes)
    assert peer_state.same_layout(fetched, staged)
    moved = dict(fetched, model={**fetched["model"], "0.weight": torch.zeros(2, 2)})
    assert not peer_state.same_layout(moved, staged)


def test_a_request_without_the_token_or_for_another_rank_is_refused_and_nothing_is_sent() -> None:
    server = peer_state.PeerServer(peer_state.stage({"w": torch.ones(4)}), rank=0, host="127.0.0.1")
    try:
        with pytest.raises(peer_state.PeerError, match="refused"):
            peer_state.fetch(server.address, server.key, server.key, 0)  # the key is not the token
        with pytest.raises(peer_state.PeerError, match="refused"):
            peer_state.fetch(server.address, server.token, server.key, 1)
        assert server.refused == 2
        assert not server.served.is_set()
    finally:
        server.close()
    with pytest.raises(peer_state.PeerError):  # gone: the standby reads the files instead
        peer_state.fetch(server.address, server.token, server.key, 0, timeout_s=5)


def test_a_description_that_does_not_verify_is_never_used() -> None:
    server = peer_state.PeerServer(
        peer_state.stage({"w": torch.ones(4), "r": b"pickled"}), 0, host="127.0.0.1"
    )
    try:
        # Someone who saw a request knows the token, not the key: what they sign does not verify.
        with pytest.raises(peer_state.PeerError, match="not signed"):
            peer_state.fetch(server.address, server.token, server.token, 0)
        # What a tamperer between the nodes would do: change the description, keep the signature.
        header = server._header
        server._header = header[:10] + b"X" + header[11:]
        with pytest.raises(peer_state.PeerError, match="not signed"):
            peer_state.fetch(server.address, server.token, server.key, 0)
    finally:
        server.close()


def test_a_peer_announcing_a_huge_description_is_refused_before_anything_is_allocated() -> None:
    impostor = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = impostor.accept()
        with connection:
            connection.recv(1024)
            connection.sendall(b"\x00" + struct.pack("!Q", 1 << 62))

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(peer_state.PeerError, match="announces a description"):
            peer_state.fetch(f"127.0.0.1:{impostor.getsockname()[1]}", bytes(32), bytes(32), 0)
    finally:
        impostor.close()


def test_a_fetch_takes_the_slot_of_a_silent_connection_and_silent_ones_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_state, "HANDSHAKE_S", 0.5)
    server = peer_state.PeerServer(peer_state.stage({"w": torch.ones(4)}), rank=0, host="127.0.0.1")
    host, port = server.address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port))) for _ in range(peer_state.MAX_CONNECTIONS)]
    try:
        # Every slot is taken by a client that says nothing: the fetch takes the oldest one's.
        fetched = peer_state.fetch(server.address, server.token, server.key, 0)
        assert torch.equal(fetched["w"], torch.ones(4))
        assert server.served.wait(10)
        assert server.evicted == 1
        for idle in silent:  # the oldest pushed out, each other dropped after the handshake time
            idle.settimeout(30)
            assert idle.recv(1) == b""
    finally:
        for idle in silent:
            idle.close()
        server.close()


def test_sharded_state_is_staged_as_it_is_and_read_from_the_files_not_served(tmp_path: Path) -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=(tmp_path / "store").as_uri())
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
        staged = peer_state.stage({"model": {"w": sharded}})
        copy = staged["model"]["w"]
        assert isinstance(copy, DTensor)
        assert torch.equal(copy.to_local(), sharded.to_local())
        sharded.to_local().add_(1.0)
        assert not torch.equal(copy.to_local(), sharded.to_local())
        with pytest.raises(peer_state.NotServableError, match="DTensor"):
            peer_state.PeerServer(staged, 0, host="127.0.0.1")
    finally:
        dist.destroy_process_group()


def test_sharded_or_unknown_objects_are_not_served() -> None:
    class Opaque:
        pass

    with pytest.raises(peer_state.NotServableError, match="Opaque"):
        peer_state.PeerServer({"thing": Opaque()}, 0, host="127.0.0.1")


def test_peers_round_trip_and_an_unreadable_file_means_the_files_are_read(tmp_path: Path) -> None:
    key = bytes(range(32))
    peers = [peer_state.Peer("a:1", key, key[::-1]), peer_state.Peer("b:2", key[::-1], key)]
    peer_state.write_peers(tmp_path, peers)
    assert (tmp_path / peer_state.PEERS).stat().st_mode & 0o777 == 0o600
    assert peer_state.read_peers(tmp_path) == peers
    assert peer_state.read_peers(tmp_path / "none") is None
    (tmp_path / peer_state.PEERS).write_text("{not json")
    assert peer_state.read_peers(tmp_path) is None


_DEFERRED = textwrap.dedent(
    """
    import logging, signal, sys, threading
    from faultcast.client import peer_state

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if sys.argv[2] == "own":  # the job's own handler, which must still run in the end
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    served = threading.Event()
    threading.Thread(target=lambda: sys.stdin.readline() and served.set(), daemon=True).start()
    with peer_state.termination_deferred(served, limit_s=float(sys.argv[1])):
        print("ready", flush=True)
        threading.Event().wait(120)
    print("not reached", flush=True)
    """
)


@pytest.mark.parametrize(("served", "handler"), [(True, "default"), (False, "default"), (True, "own")])
def test_a_handed_over_ranks_sigterm_waits_until_its_copy_went_out(served: bool, handler: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _DEFERRED, "60" if served else "0.2", handler],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stderr is not None
    assert child.stdin is not None
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGTERM)
    assert "SIGTERM deferred" in child.stderr.readline()  # in the handler, waiting
    if served:
        with pytest.raises(subprocess.TimeoutExpired):  # still alive: it waits for the copy to go out
            child.wait(timeout=1.0)
        child.stdin.write("served\n")
        child.stdin.flush()
    # Then it ends as the scheduler asked, through the handler it had before.
    assert child.wait(timeout=60) == (7 if handler == "own" else -signal.SIGTERM)
    rest = child.stderr.read()
    assert ("before the standby fetched" in rest) is not served
    assert child.stdout.read() == ""
