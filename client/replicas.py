"""State kept in peers' memory: every `every` steps each rank stages its state to host memory and sends a
copy to a buddy rank on another node (another rack when the topology is given), so that losing one
node loses only the steps since the last replica, and no storage is read to get them back.

    replicas = BuddyReplicas(state, job_key, every=50, root="/dev/shm/faultcast", job_id=job)
    start = replicas.restore() or resume_from_files()
    for step in range(start, total):
        train_step(step)
        replicas.step_end(step + 1)
    replicas.close()

Where the copies live: in host memory (`root` is a tmpfs, /dev/shm by default) under one folder per
job and node, not in the training processes: a rank's processes may be restarted (torchrun restarts
every worker when one fails) and what they held is still there. Each rank keeps its own two newest
parts (own/) and the two newest parts of every rank whose buddy it is (holds/): a node lost while a
replica was on its way leaves the one before whole everywhere. The memory cost per rank is four times
its serialised state in host memory (two of its own, two of its sender's) when every node runs as
many ranks; a rank that is the buddy of several (nodes of uneven size) holds two per sender. While a
replica is being made, two more transient copies (the staged state and its bytes). Nothing here is
removed when the job ends: delete the job's folder then (a job's own clean-up, or a tmpfs per job).
A folder under `root` that is not private (made by another user, a symbolic link, others may write
it) is not used: the replicas go to a folder beside it whose name only the job knows (from its key),
with a warning. Temporary files of a replica killed on its way are removed when the job starts again.

Replicas degrade, they never end training: a part that cannot be written (host memory full), a
sender announcing a size that is negative or beyond `max_part_bytes`, or sending fewer bytes than it
announced (each part ends in a trailer giving its length), is not kept, counted in `stats` (`failed`,
`refused`) and warned about once; the step before stays the newest whole one and the next replica
tries again. Room for a part is reserved before it is received (a full tmpfs is then a refusal, not
a SIGBUS while writing into the mapping). A sender that sends more bytes than it announced aborts
the receiving process inside gloo itself: this code never does.

What blocks training: the copy of the state to host memory at the step (`stage`), and, only when the
previous replica is still on its way at the next one, the wait for it. Serialising, sending (one
gloo group of its own, point to point) and writing run on a background thread.

`restore()` (collective, after a restart, in the world the job runs in now, same size as before):
every rank says which parts its node holds; the newest step whose every part is held somewhere is
chosen; each rank reads its part from its own node where it is there, else the rank holding it sends
it. None when no step is whole (two neighbouring nodes lost, another world size): read the files.
A rank's part is the state `TrainState.to_save` gives it, rank part sealed with the job's key and
verified before it is unpickled, loaded with `torch.load(weights_only=True)`.

Plain tensors only: a state holding DTensors or sharded tensors (FSDP) is not replicated (a warning
says so) and restores from its files.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import logging
import math
import os
import queue
import re
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from faultcast.client import identity, peer_state
from faultcast.client.train_state import StateDict, TrainState

log = logging.getLogger(__name__)

DEFAULT_ROOT = f"/dev/shm/faultcast-{os.geteuid()}"  # noqa: S108 (host memory on purpose: a tmpfs)
"""Where the replicas live by default: host memory, one folder per user (the job's folder in it is
private: mode 0700, this user's, never a symbolic link; see `_home` when it is not)."""
_NICE = 10  # the replica thread's CPU priority below training's (serialising and writing yield to steps)
_PART = re.compile(r"^step-(\d+)\.pt$")
_PARTIAL = re.compile(r"^\.step-(\d+)\.pt\.partial$")
_TRAILER = struct.Struct("<8sQ")  # every part ends with: magic, the length of what precedes it
_MAGIC = b"fcpart01"
_BOUND_FACTOR, _BOUND_SLACK = 4, 64 * 2**20  # the default bound on a sender's part, from this rank's own


@dataclass
class ReplicaStats:
    """What the replicas cost and did, for logs and the bench."""

    made: int = 0  # replicas sent (each rank's own count)
    blocked_s: float = 0.0  # training time spent in step_end: staging and waiting for the previous one
    waited_s: float = 0.0  # of which waiting for the previous replica still on its way
    bytes_sent: int = 0
    bytes_held: int = 0  # own newest part and the parts held for others, on disk (host memory)
    restored_step: int | None = None
    fetched_from_peer: int = 0  # parts a restore received from another node
    bytes_fetched: int = 0  # and their bytes
    failed: int = 0  # parts not written (own or held): host memory full, a folder gone, the exchange broken
    refused: int = 0  # senders' parts refused: a size out of bounds announced, fewer bytes sent
    stale_removed: int = 0  # temporary files of replicas killed on their way, removed at the start
    seconds: list[float] = field(default_factory=list)  # each replica's background time (wall)
    cpu_seconds: list[float] = field(default_factory=list)  # and the replica thread's CPU time for it


def buddies(nodes: Sequence[str], racks: Mapping[str, str] | None = None) -> list[int]:
    """For every rank (ranks' node names in rank order), the rank its replica goes to: the rank of
    the same local index on the next node in ring order, skipping nodes of the same rack when
    another rack exists. -1 when the job has one node (no buddy)."""
    order = list(dict.fromkeys(nodes))
    ranks_on = {node: [r for r, n in enumerate(nodes) if n == node] for node in order}
    out = []
    for rank, node in enumerate(nodes):
        if len(order) == 1:
            out.append(-1)
            continue
        start = order.index(node)
        ring = [order[(start + k) % len(order)] for k in range(1, len(order))]
        rack = (racks or {}).get(node)
        elsewhere = [n for n in ring if rack is None or (racks or {}).get(n) != rack]
        target = (elsewhere or ring)[0]
        local = ranks_on[node].index(rank)
        out.append(ranks_on[target][local % len(ranks_on[target])])
    return out


class BuddyReplicas:
    """Periodic replicas of each rank's state on a buddy rank of another node (see the module)."""

    def __init__(
        self,
        state: TrainState,
        key: bytes,
        *,
        every: int,
        job_id: str,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        node: str | None = None,
        racks: Mapping[str, str] | None = None,
        max_part_bytes: int | None = None,
    ) -> None:
        """`key`: the job's signing key (the rank part's seal); `every`: steps between replicas;
        `node`: this rank's node name (default: the scheduler's); `racks`: node name to rack, when
        the topology is known; `max_part_bytes`: the largest part taken from a sender (default: four
        times this rank's own part and 64 MiB, for ranks whose parts differ more, pipeline stages).
        Collective: every rank constructs it at the same point."""
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        if not dist.is_initialized():
            raise ValueError("buddy replicas need torch.distributed initialised (a job of several nodes)")
        self.state, self.key, self.every, self.max_part_bytes = state, key, every, max_part_bytes
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.node = identity.node_name(node)
        self.nodes = identity.all_gather_strings(self.node)
        self.buddy = buddies(self.nodes, racks)
        self.senders = [r for r, b in enumerate(self.buddy) if b == self.rank]
        self.folder = _home(Path(root), _safe(job_id), _safe(self.node), key)
        self.stats = ReplicaStats()
        self._warned: set[str] = set()
        self._largest_own = 0  # bytes of this rank's largest own part so far (the bound on senders')
        self.stats.stale_removed = _sweep(self.folder, *self._writers())
        self._group = dist.new_group(backend="gloo")  # its own: never interleaved with training's
        self._jobs: queue.Queue[tuple[int, StateDict] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._staged_step: int | None = None
        self._staged_at: float | None = None  # time.monotonic() of the newest staging
        self._thread = threading.Thread(target=self._run, name="faultcast-replicas", daemon=True)
        self._thread.start()
        if self.buddy[self.rank] < 0:
            log.warning("faultcast: a job on one node has no buddy: replicas stay on this node only")

    # -- training's side ----------------------------------------------------------------------------

    def step_end(self, step: int) -> None:
        """After `step` steps: every `every` steps, stage the state and hand it to the replica thread."""
        if step % self.every:
            return
        self.replicate(step)

    def since_last_s(self) -> float:
        """Seconds since the newest replica was staged (inf before the first)."""
        return time.monotonic() - self._staged_at if self._staged_at is not None else math.inf

    def replicate(self, step: int) -> None:
        """Collective: stage the state after `step` steps now and hand it to the replica thread (a
        warning's extra replica; nothing when this step was staged already)."""
        if step == self._staged_step:
            return
        self._staged_step, self._staged_at = step, time.monotonic()
        started = time.perf_counter()
        self._idle.wait()  # the previous replica is still on its way: every rank waits alike
        waited = time.perf_counter() - started
        staged = peer_state.stage(self.state.to_save(step, self.rank, self.key))
        self._idle.clear()
        self._jobs.put((step, staged))
        self.stats.waited_s += waited
        self.stats.blocked_s += time.perf_counter() - started

    def wait(self) -> None:
        """Block until the replica on its way is done (for tests and a clean end); whether it is
        whole, `stats` says."""
        self._idle.wait()

    def close(self) -> None:
        """Finish the replica on its way and stop the thread; the replicas stay in host memory."""
        self._idle.wait()
        self._jobs.put(None)
        self._thread.join()

    # -- the replica thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # Linux: a thread's own nice value; training's threads go first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)
        while (job := self._jobs.get()) is not None:
            step, staged = job
            started, cpu_started = time.perf_counter(), time.thread_time()
            try:
                self._replicate(step, staged)
            except Exception as exc:  # the exchange broke: this replica is lost, training goes on
                self._trouble("exchange", "failed", f"the replica of step {step} failed on its way: {exc!r}")
            finally:
                self.stats.seconds.append(time.perf_counter() - started)
                self.stats.cpu_seconds.append(time.thread_time() - cpu_started)
                del job, staged  # the staged copy's memory goes back before the next one is made
                self._idle.set()

    def _replicate(self, step: int, staged: StateDict) -> None:
        """Write this rank's part into host memory, send it to the buddy straight from there, and
        receive the parts held for others straight into theirs (no copy in between). Every rank
        goes through the same messages whatever fails on its side (a size of 0: no part this time;
        a refusal: the part is not sent), so no peer waits for a message that never comes."""
        own = self.folder / "own" / f"rank-{self.rank}"
        size = self._write_own(own, step, staged)
        announced = self._exchange_sizes(size)
        incoming: dict[int, _Incoming] = {}
        try:
            for sender, claimed in announced.items():
                part = self._room_for(sender, step, claimed, size)
                if part is not None:
                    incoming[sender] = part
            taken = self._exchange_verdicts(set(incoming), size)
            works = [dist.irecv(part.tensor, src=s, group=self._group) for s, part in incoming.items()]
            if taken:
                payload = torch.from_file(
                    str(own / f"step-{step}.pt"), shared=False, size=size, dtype=torch.uint8
                )
                works.append(dist.isend(payload, dst=self.buddy[self.rank], group=self._group))
            _wait_all(works)
            if size and not taken and self.buddy[self.rank] >= 0:
                self._trouble(
                    "untaken", "failed", f"the buddy took no part of step {step} (no room, or refused)"
                )
            for sender, part in incoming.items():
                if not part.whole():
                    self._trouble("short", "refused", f"rank {sender} sent fewer bytes than it announced")
                    continue
                try:
                    part.settle()
                except OSError as exc:
                    self._trouble("hold", "failed", f"the part of rank {sender} was not kept: {exc}")
        finally:
            for part in incoming.values():
                part.discard()  # nothing left of a part refused, failed or cut short
        self.stats.made += int(size > 0 and (taken or self.buddy[self.rank] < 0))
        self.stats.bytes_sent += size if taken else 0
        self.stats.bytes_held = _bytes_under(self.folder)

    def _write_own(self, own: Path, step: int, staged: StateDict) -> int:
        """This rank's part of `step` written whole into host memory; its size, or 0 when it could not
        be written (nothing of it is left: the previous part stays the newest)."""
        try:
            size = _write(own, step, lambda partial: _save(staged, partial))
        except Exception as exc:  # a full tmpfs raises from torch.save as RuntimeError, not only OSError
            self._trouble("own", "failed", f"this rank's part of step {step} was not written: {exc}")
            return 0
        self._largest_own = max(self._largest_own, size)
        return size

    def _exchange_sizes(self, size: int) -> dict[int, int]:
        """Send the size of this rank's part to its buddy (0: none this time); the sizes its senders
        announce, by sender."""
        sizes = {s: torch.zeros(1, dtype=torch.int64) for s in self.senders}
        works = [dist.irecv(t, src=s, group=self._group) for s, t in sizes.items()]
        if self.buddy[self.rank] >= 0:
            works.append(dist.isend(torch.tensor([size]), dst=self.buddy[self.rank], group=self._group))
        _wait_all(works)
        return {s: int(t.item()) for s, t in sizes.items()}

    def _room_for(self, sender: int, step: int, claimed: int, own_size: int) -> _Incoming | None:
        """Room in host memory for the part `sender` announced, reserved; None when it announced
        none, a size out of bounds (refused: nothing is allocated for it) or there is no room."""
        if claimed == 0:
            return None  # the sender has no part this time (its own write failed)
        bound = self._bound(own_size)
        if not _TRAILER.size < claimed <= bound:
            self._trouble(
                "size", "refused", f"rank {sender} announced {claimed} bytes (at most {bound} taken)"
            )
            return None
        try:
            return _Incoming(self.folder / "holds" / f"rank-{sender}", step, claimed)
        except OSError as exc:  # ENOSPC: host memory full
            self._trouble("hold", "failed", f"no room for the part of rank {sender} ({claimed} bytes): {exc}")
            return None

    def _bound(self, own_size: int) -> int:
        """The largest part taken from a sender."""
        if self.max_part_bytes is not None:
            return self.max_part_bytes
        return _BOUND_FACTOR * max(own_size, self._largest_own) + _BOUND_SLACK

    def _exchange_verdicts(self, taking: set[int], size: int) -> bool:
        """Tell each sender whether its part is taken (room reserved); whether the buddy takes this
        rank's part (it is then sent)."""
        works = [dist.isend(torch.tensor([int(s in taking)]), dst=s, group=self._group) for s in self.senders]
        verdict = torch.zeros(1, dtype=torch.int64)
        if self.buddy[self.rank] >= 0:
            works.append(dist.irecv(verdict, src=self.buddy[self.rank], group=self._group))
        _wait_all(works)
        return size > 0 and bool(verdict.item())

    def _trouble(self, kind: str, counter: str, message: str) -> None:
        """A replica degraded: counted (`stats.failed` or `stats.refused`), warned about the first
        time of each kind and at debug level after that (a full tmpfs fails every replica)."""
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        if kind in self._warned:
            log.debug("faultcast: replicas: %s", message)
            return
        self._warned.add(kind)
        log.warning("faultcast: replicas: %s; training goes on (counted in the replicas' stats)", message)

    def _writers(self) -> tuple[list[Path], list[Path]]:
        """The folders of the node's folder this rank writes into, and those some rank of this node
        writes into (own/ of each rank on the node, holds/ of each rank whose buddy is on it)."""
        here = {r for r, n in enumerate(self.nodes) if n == self.node}
        mine = [Path("own", f"rank-{self.rank}")] + [Path("holds", f"rank-{s}") for s in self.senders]
        node = [Path("own", f"rank-{r}") for r in here]
        node += [Path("holds", f"rank-{s}") for s, b in enumerate(self.buddy) if b in here]
        return mine, node

    # -- restore ----------------------------------------------------------------------------------------

    def restore(self, newer_than: int = -1) -> int | None:
        """Collective, before training: load the newest step whose every part is held on some node
        (each rank's own part from its node where it is, else sent by the rank holding it); the step
        to continue from, or None when no step is whole here or none is newer than `newer_than` (a
        snapshot in the files at that step: read it instead)."""
        self.wait()
        held = {"node": self.node, "parts": _held(self.folder)}
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, held)
        holder: dict[tuple[int, int], int] = {}  # (rank, step) -> the lowest rank on a node holding it
        for rank, seen in enumerate(everyone):
            for part in seen["parts"]:
                holder.setdefault((part[0], part[1]), rank)
        if any(rank >= self.world_size for rank, _ in holder):
            log.warning("faultcast: the replicas here were made by a larger world: reading the files")
            return None
        steps = {step for (_, step) in holder}
        whole = [s for s in steps if all((r, s) in holder for r in range(self.world_size))]
        if not whole:
            log.warning("faultcast: no step has every rank's replica on a live node: reading the files")
            return None
        step = max(whole)
        if step <= newer_than:
            return None
        mine = self._gather_part(step, holder, everyone)
        loaded = torch.load(io.BytesIO(mine), weights_only=True)
        restored = self.state.restore(loaded, self.rank, self.key)
        self.stats.restored_step = step
        log.info("faultcast: restored step %d from replicas in host memory", step)
        return restored

    def _gather_part(self, step: int, holder: dict[tuple[int, int], int], everyone: list[Any]) -> bytes:
        """This rank's part of `step`: read here when its node holds it, else received from the rank
        holding it; and the parts this rank must send to ranks whose node lacks theirs. Every rank
        goes through the same plan in the same order, so every send meets its receive."""
        mine: bytes | None = None
        for rank in range(self.world_size):
            if [rank, step] in everyone[rank]["parts"]:  # its own node holds it: read there
                if rank == self.rank:
                    mine = _read(self.folder, rank, step)
                continue
            source = holder[(rank, step)]
            if source == self.rank:
                data = torch.frombuffer(bytearray(_read(self.folder, rank, step)), dtype=torch.uint8)
                dist.send(torch.tensor([data.numel()]), dst=rank, group=self._group)
                dist.send(data, dst=rank, group=self._group)
            elif rank == self.rank:
                size = torch.zeros(1, dtype=torch.int64)
                dist.recv(size, src=source, group=self._group)
                data = torch.empty(int(size.item()), dtype=torch.uint8)
                dist.recv(data, src=source, group=self._group)
                mine = data.numpy().tobytes()
                self.stats.fetched_from_peer += 1
                self.stats.bytes_fetched += len(mine)
        if mine is None:
            raise RuntimeError(f"rank {self.rank}: no part of step {step} reached it")
        return mine


def _wait_all(works: Sequence[dist.Work | None]) -> None:
    for work in works:
        if work is not None:  # None only for a rank outside the group, which these never are
            work.wait()


def _home(root: Path, job: str, node: str, key: bytes) -> Path:
    """The node's replica folder: root/job/node, when root and root/job are private (`_private`).
    Else (another user made root first, a symbolic link, others may write it, it cannot be made) a
    folder beside root whose name only the job knows (from its key: no one can make it first, and a
    restart of the job finds it), else a fresh one under the temporary folder (a restarted process
    does not find its replicas there). Never raises: a folder that cannot be written at all fails
    each replica, counted."""
    digest = hmac.new(key, b"faultcast replicas " + job.encode(), hashlib.sha256).hexdigest()[:16]
    for base in (root, root.parent / f"{root.name}-{digest}"):
        try:
            folder = _private(_private(base) / job) / node
        except (OSError, ValueError) as exc:
            log.warning("faultcast: replicas: the folder %s is not used: %s", base, exc)
            continue
        if base != root:
            log.warning("faultcast: replicas: using %s instead (a restart of the job finds it)", base)
        return folder
    for parent in (root.parent, None):
        with contextlib.suppress(OSError):
            fresh = Path(tempfile.mkdtemp(prefix=f"{root.name}-", dir=parent))
            log.warning("faultcast: replicas: using %s (a restarted process will not find them)", fresh)
            return fresh / job / node
    log.warning("faultcast: replicas: no private folder could be made: no replica will be kept")
    return root / job / node


def _sweep(folder: Path, mine: Sequence[Path], node: Sequence[Path]) -> int:
    """Remove the temporary files replicas killed on their way left under the node's `folder`: in
    the folders this rank writes (`mine`: it writes nothing yet) and in those no rank of the node
    writes (`node` lists those some rank does: another world's ranks); of this user, named as this
    module names them. A rank of the node that writes its folders now is never touched. Their count."""
    written = set(node)
    removed = 0
    for kind in ("own", "holds"):
        with contextlib.suppress(OSError):
            for rank_dir in (folder / kind).iterdir():
                relative = rank_dir.relative_to(folder)
                if relative in written and relative not in mine:
                    continue
                removed += _remove_partials(rank_dir)
    if removed:
        log.info("faultcast: replicas: removed %d temporary files of replicas killed on their way", removed)
    return removed


def _remove_partials(rank_dir: Path) -> int:
    removed = 0
    with contextlib.suppress(OSError):
        for entry in rank_dir.iterdir():
            with contextlib.suppress(OSError):
                if _PARTIAL.match(entry.name) and entry.lstat().st_uid == os.geteuid():
                    entry.unlink()
                    removed += 1
    return removed


def _private(folder: Path) -> Path:
    """`folder`, created mode 0700 if missing; ValueError unless it is a real folder of this user that
    no one else may read or write (replicas hold the job's weights, loaded back without question)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = folder.lstat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o077:
        raise ValueError(
            f"the replica folder {folder} must be a folder of this user with mode 0700 (it is "
            f"{stat.filemode(status.st_mode)}, uid {status.st_uid}): remove it or give another root"
        )
    return folder


def _safe(name: str) -> str:
    """A name as one path component."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


class _Incoming:
    """A part on its way from a peer, received straight into its file in host memory (mapped), made
    whole (renamed) only once all of it is there. Its room is reserved first: on a full tmpfs that is
    an OSError here, where writing into a mapping of a sparse file would be a SIGBUS."""

    def __init__(self, folder: Path, step: int, size: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.step, self.size = folder, step, size
        self.partial = folder / f".step-{step}.pt.partial"
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            self.partial.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self._mapped: torch.Tensor | None = torch.from_file(
            str(self.partial), shared=True, size=size, dtype=torch.uint8
        )

    @property
    def tensor(self) -> torch.Tensor:
        """The part's room, mapped: what is received goes straight there."""
        assert self._mapped is not None, "the part was settled or discarded"
        return self._mapped

    def whole(self) -> bool:
        """Whether all the announced bytes came: the part's trailer is at its very end (fewer bytes
        leave the reserved room's zeros there)."""
        magic, length = _TRAILER.unpack(self.tensor[-_TRAILER.size :].numpy().tobytes())
        return bool(magic == _MAGIC and length == self.size - _TRAILER.size)

    def settle(self) -> None:
        self._mapped = None  # unmapped before the rename
        _settle(self.folder, self.step, self.partial)

    def discard(self) -> None:
        """Nothing left of the part unless it was settled."""
        self._mapped = None
        self.partial.unlink(missing_ok=True)


def _save(staged: StateDict, partial: Path) -> None:
    """A part: the state as torch.save writes it, then the trailer giving its length."""
    with partial.open("wb") as out:
        torch.save(staged, out)
        out.write(_TRAILER.pack(_MAGIC, out.tell()))


def _write(folder: Path, step: int, save: Callable[[Path], object]) -> int:
    """The part of `step`, written whole by `save` (into a temp file, then renamed); its size. When
    it fails, the temp file is removed (host memory given back) and the error raised."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".step-{step}.pt.partial"
    try:
        save(partial)
        size = partial.stat().st_size
        _settle(folder, step, partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return size


def _settle(folder: Path, step: int, partial: Path) -> None:
    """The part whole under its name; of the older parts the newest is kept (a node lost while the
    new replica was on its way leaves that one whole everywhere)."""
    partial.replace(folder / f"step-{step}.pt")
    older = sorted(
        int(m.group(1)) for f in folder.iterdir() if (m := _PART.match(f.name)) and int(m.group(1)) < step
    )
    for old in older[:-1]:
        (folder / f"step-{old}.pt").unlink(missing_ok=True)


def _held(folder: Path) -> list[list[int]]:
    """[[rank, step], ...] of every whole part this node holds (own/ and holds/)."""
    out: list[list[int]] = []
    for kind in ("own", "holds"):
        for rank_dir in sorted((folder / kind).glob("rank-*")):
            for part in rank_dir.iterdir():
                match = _PART.match(part.name)
                if match:
                    out.append([int(rank_dir.name.removeprefix("rank-")), int(match.group(1))])
    return out


def _read(folder: Path, rank: int, step: int) -> bytes:
    """The state's bytes of a whole part (its trailer checked and left off)."""
    for kind in ("own", "holds"):
        path = folder / kind / f"rank-{rank}" / f"step-{step}.pt"
        if path.is_file():
            with path.open("rb") as part:
                size = part.seek(0, os.SEEK_END)
                part.seek(max(size - _TRAILER.size, 0))
                magic, length = _TRAILER.unpack(part.read(_TRAILER.size).rjust(_TRAILER.size, b"\0"))
                if magic != _MAGIC or length != size - _TRAILER.size:
                    raise ValueError(f"the replica {path} is damaged (its trailer does not give its length)")
                part.seek(0)
                return part.read(length)
    raise FileNotFoundError(f"no part of rank {rank} at step {step} under {folder}")


def _bytes_under(folder: Path) -> int:
    """The replicas' bytes in the node's folder. The other ranks of the node prune their own parts
    meanwhile: a part gone between the listing and its size counts nothing."""
    total = 0
    for part in folder.rglob("step-*.pt"):
        with contextlib.suppress(FileNotFoundError):
            total += part.stat().st_size
    return total
