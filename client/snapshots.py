"""Snapshots on disk: one directory per step, written by `torch.distributed.checkpoint`, complete only
once rank 0 has put a `COMPLETE.json` marker in it.

    <root>/step-000001200/.metadata, __0_0.distcp, ...   what torch.distributed.checkpoint writes
    <root>/step-000001200/COMPLETE.json                  {"step", "reason", "world_size", ...}

Rank 0 writes the marker (to a temporary name, fsync, rename) only after its save returned, and the
checkpoint's `.metadata` is written only after every rank reported its data written, so a directory
with the marker is whole. A job killed mid-write leaves a directory without it, which `latest()` never
picks and the next save of the same step clears first.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import async_save, save

if TYPE_CHECKING:
    from faultcast.client.train_state import StateDict

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
"""The file whose presence makes a snapshot directory whole."""
DCP_PAYLOAD = ".metadata"  # torch.distributed.checkpoint writes it last, on rank 0
"""The default payload: a snapshot written by torch.distributed.checkpoint."""
_NAME = re.compile(r"^step-(\d{9})$")


@dataclass(frozen=True)
class Snapshot:
    """A whole snapshot as its marker describes it: the step, its directory, why it was taken and by
    how many ranks (a different world size can restore the model and optimizer, not the per-rank part)."""

    step: int
    path: Path
    reason: str
    world_size: int
    payload: str = DCP_PAYLOAD  # what in `path` holds the state: DCP's files, or a framework's checkpoint

    @property
    def uri(self) -> str:
        """The directory as an absolute file:// URI, what an acknowledgement tells the service."""
        return self.path.resolve().as_uri()


class SnapshotStore:
    """The snapshot directory of one job. Every rank holds one; only rank 0 writes markers and prunes."""

    def __init__(self, root: str | os.PathLike[str], *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        self.root, self.keep = Path(root), keep
        self._writer: ThreadPoolExecutor | None = None  # writes staged alert snapshots, one at a time

    def path(self, step: int) -> Path:
        """The directory of `step`'s snapshot, whether or not it exists ("step-000001200")."""
        return self.root / f"step-{step:09d}"

    def complete(self) -> list[Snapshot]:
        """Whole snapshots, oldest first. A marker that does not parse or names another step is a
        damaged snapshot, and a step directory that leads out of the store (a symbolic link) is not
        the job's: each is logged and passed over."""
        found: list[Snapshot] = []
        if not self.root.is_dir():
            return found
        root = self.root.resolve()
        for child in self.root.iterdir():
            match = _NAME.match(child.name)
            if match is None or not (child / MARKER).is_file():
                continue
            if not child.resolve().is_relative_to(root):
                log.warning(
                    "faultcast: snapshot %s leads out of the store (to %s), skipped", child, child.resolve()
                )
                continue
            try:
                marker = json.loads((child / MARKER).read_text())
                snapshot = Snapshot(
                    int(marker["step"]),
                    child,
                    str(marker["reason"]),
                    int(marker["world_size"]),
                    str(marker.get("payload", DCP_PAYLOAD)),
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("faultcast: snapshot %s has an unreadable marker, skipped: %s", child, exc)
                continue
            if snapshot.step != int(match.group(1)) or not (child / snapshot.payload).exists():
                log.warning("faultcast: snapshot %s does not match its marker, skipped", child)
                continue
            found.append(snapshot)
        return sorted(found, key=lambda s: s.step)

    def latest(self) -> Snapshot | None:
        """The newest whole snapshot (see complete()), or None."""
        whole = self.complete()
        return whole[-1] if whole else None

    # -- writing (every rank calls these, in the same order) ---------------------------------------

    def prepare(self, step: int, rank: int, group: dist.ProcessGroup | None) -> Path:
        """Clear what a killed earlier attempt left at this step; all ranks leave together."""
        path = self.path(step)
        if rank == 0:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        if dist.is_initialized():
            dist.barrier(group=group)
        return path

    def save(
        self, state: StateDict, step: int, rank: int, group: dist.ProcessGroup | None, *, wait: bool
    ) -> Future[None] | None:
        """Write `state` for `step`: to completion when `wait`, else in the background (the
        returned future); `finish()` marks it complete once the write is done."""
        path = self.prepare(step, rank, group)
        if wait:
            save(state, checkpoint_id=path, process_group=group, no_dist=not dist.is_initialized())
            return None
        response = async_save(state, checkpoint_id=path, process_group=group)
        if isinstance(response, Future):
            return response
        return response.upload_completion  # an AsyncSaveResponse (with a staging future of its own)

    def write_staged(
        self, staged: StateDict, step: int, rank: int, group: dist.ProcessGroup | None
    ) -> Future[None]:
        """Write `staged` (a copy in host memory that training no longer touches: see
        peer_state.stage) for `step` on a thread of this store's; `prepare` runs first, here (it is
        collective). `finish()` marks it complete once the returned future is done."""
        path = self.prepare(step, rank, group)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="faultcast-snapshot")
        no_dist = not dist.is_initialized()
        return self._writer.submit(save, staged, checkpoint_id=path, process_group=group, no_dist=no_dist)

    def finish(
        self,
        step: int,
        rank: int,
        reason: str,
        world_size: int,
        payload: str = DCP_PAYLOAD,
        *,
        started_unix: float | None = None,
        staged_unix: float | None = None,
    ) -> Snapshot | None:
        """Rank 0: mark the snapshot of `step` complete and prune; other ranks: nothing. `payload`
        names what holds the state (a framework's own checkpoint, for the adapters); `started_unix`,
        when the save began, goes in the marker (what the snapshot blocked, for operators and the
        migration benchmark); `staged_unix`, when its blocking copy to host memory ended (the write
        went on in the background from there)."""
        if rank != 0:
            return None
        path = self.path(step)
        marker = {
            "step": step,
            "reason": reason,
            "world_size": world_size,
            "saved_unix": time.time(),
            "payload": payload,
        }
        if started_unix is not None:
            marker["started_unix"] = started_unix
        if staged_unix is not None:
            marker["staged_unix"] = staged_unix
        tmp = path / (MARKER + ".tmp")
        with tmp.open("w") as handle:
            json.dump(marker, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.rename(path / MARKER)
        _fsync_dir(path)
        self._prune()
        return Snapshot(step, path, reason, world_size, payload)

    def wait_whole(self, step: int, timeout_s: float) -> bool:
        """Whether the snapshot of `step` is marked whole within `timeout_s` (a rank other than 0,
        which does not write the marker, before it tells anyone of the snapshot)."""
        marker, waited, pause = self.path(step) / MARKER, threading.Event(), 0.05
        for _ in range(max(1, round(timeout_s / pause))):
            if marker.is_file():
                return True
            waited.wait(pause)
        return marker.is_file()

    def _prune(self) -> None:
        """Keep the newest `keep` whole snapshots; drop older whole ones and any partial one older
        than the newest whole one (a partial newer one may be a save still under way)."""
        whole = self.complete()
        for old in whole[: -self.keep]:
            shutil.rmtree(old.path, ignore_errors=True)
        if not whole:
            return
        newest = whole[-1].step
        for child in self.root.iterdir():
            match = _NAME.match(child.name)
            if match and int(match.group(1)) < newest and not (child / MARKER).exists():
                shutil.rmtree(child, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
