"""faultcast for PyTorch Lightning: a `Callback` that takes a snapshot when the service predicts a fault
on one of the job's nodes, and `latest_checkpoint` to resume from the newest whole one.

    callback = FaultcastCallback("faultcast:50051", "/ckpt/my-job")
    trainer = lightning.pytorch.Trainer(callbacks=[callback], ...)
    trainer.fit(model, data, ckpt_path=latest_checkpoint("/ckpt/my-job"))

Every `agree_every` optimizer steps the ranks agree (one all-reduce) whether any node's guard holds a
snapshot request; if so every rank calls `trainer.save_checkpoint` at that step. The checkpoint lands in
the same layout as the generic hook's snapshots (`faultcast.client.snapshots`):

    <directory>/step-000001200/lightning.ckpt    what trainer.save_checkpoint wrote (a file, or a
                                                 directory for sharded strategies)
    <directory>/step-000001200/COMPLETE.json     {"step", "reason", "world_size", "payload", ...}

Global rank 0 writes the marker (temporary name, fsync, rename) only after `save_checkpoint` returned on
every rank, so a directory with the marker is whole; then the guard acknowledges the snapshot and the
service drains the node.

What a Lightning checkpoint restores: model, optimizers, LR schedulers, loop progress (the global step,
the epoch), callbacks' state and precision scaler. What it does not: Python's, NumPy's and torch's
random number generators (a resumed run draws different dropout masks and noise than an uninterrupted
one would have), and the position inside an epoch unless the dataloader itself is stateful (has
`state_dict`/`load_state_dict`); a plain `DataLoader` starts the interrupted epoch over. For a resume that
is bit for bit, use the generic hook `faultcast.client.protect`.

Needs `lightning` (`pip install faultcast[lightning]`); the `pytorch_lightning` package is a separate
namespace whose Trainer does not run `lightning.pytorch` callbacks.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

import grpc
import lightning.pytorch as pl

from faultcast.client import identity, migration
from faultcast.client.guard import Guard
from faultcast.client.snapshots import SnapshotStore
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "lightning.ckpt"
"""The name of the Lightning checkpoint inside a snapshot's step directory (the marker's payload)."""


class FaultcastCallback(pl.Callback):
    """Saves a Lightning checkpoint on every rank at an agreed step when a node of the job is predicted
    to fail (and every `checkpoint_every` steps when set), marks it whole and acknowledges it. Resume
    with `trainer.fit(..., ckpt_path=latest_checkpoint(directory))`."""

    def __init__(
        self,
        target: str | None,
        directory: str | os.PathLike[str],
        *,
        agree_every: int = 10,
        checkpoint_every: int = 0,
        keep: int = 2,
        job_id: str | None = None,
        node: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        migration_wait_s: float = 300.0,
    ) -> None:
        """`target`: the faultcast service (None: only the periodic checkpoints of `checkpoint_every`).
        `job_id` and `node` default to SLURM_JOB_ID / FAULTCAST_JOB_ID and SLURMD_NODENAME / the host
        name. `migration_wait_s`: after a snapshot whose acknowledgement drains the node, how long to
        hold still for the scheduler to move the job before training on. No I/O here."""
        if agree_every < 1:
            raise ValueError("agree_every must be at least 1")
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        self.target, self.directory = target, Path(directory)
        self.agree_every, self.checkpoint_every, self.keep = agree_every, checkpoint_every, keep
        self.job_id, self.node, self.credentials = job_id, node, credentials
        self.migration_wait_s = migration_wait_s
        self.guard: Guard | None = None  # on each node's local rank 0, once fit has set up
        self.snapshots: list[int] = []  # steps of predictive snapshots
        self.checkpoints: list[int] = []  # steps of periodic checkpoints
        self.acknowledgements: list[str] = []  # the service's replies
        self.held_s = 0.0
        self.start_step = 0  # the global step training (re)started at: a resumed run's checkpoint step
        self._store = SnapshotStore(self.directory, keep=keep)  # for its step-directory naming
        self._last_step = -1
        self._released = threading.Event()

    # -- Lightning's hooks ---------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """For fit: start this node's guard (local rank 0 only). Collective."""
        # Runs on every rank after the process group is up, so gathering the node names is safe.
        if stage != "fit":
            return
        self.close()  # a guard left by an earlier fit with this callback
        self._released.clear()
        if self.target is None:
            return
        node = identity.node_name(self.node)
        nodes = identity.all_gather_strings(node)
        if trainer.local_rank == 0:
            job_id = identity.job_id(self.job_id)
            self.guard = Guard(
                self.target, job_id, [node], credentials=self.credentials, job_nodes=sorted(set(nodes))
            ).start()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Note the step training (re)starts at; no snapshot is taken of it."""
        self.start_step = self._last_step = trainer.global_step  # no snapshot of the step it resumed at

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        """After each optimizer step: every `agree_every` steps agree whether to snapshot, else take a
        due periodic checkpoint. Collective."""
        step = trainer.global_step
        if step == self._last_step:
            return  # gradient accumulation: no optimizer step since the last batch
        self._last_step = step
        if step % self.agree_every == 0:
            alert = self.guard.pending() if self.guard is not None else None
            if trainer.strategy.reduce_boolean_decision(alert is not None, all=False):
                self._snapshot_for_alert(trainer, step, alert)
                return
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            self._save(trainer, step, "periodic")
            self.checkpoints.append(step)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """After fit: stop the guard and end a hold."""
        if stage == "fit":
            self.close()

    def close(self) -> None:
        """Stop the guard and end a hold under way (also done when fit tears down)."""
        self._released.set()
        if self.guard is not None:
            self.guard.close()
            self.guard = None

    # -- snapshots ------------------------------------------------------------------------------

    def _snapshot_for_alert(self, trainer: pl.Trainer, step: int, alert: apb.Alert | None) -> None:
        reason = f"alert {alert.id} on {alert.node} gpu {alert.gpu}" if alert is not None else "alert"
        path = self._save(trainer, step, reason)
        self.snapshots.append(step)
        expect_migration = False
        if self.guard is not None and alert is not None:
            uri = path.resolve().as_uri()
            expect_migration = migration.acknowledge(self.guard, step, uri, self.acknowledgements)
        if trainer.strategy.reduce_boolean_decision(expect_migration, all=False):
            self._hold(trainer, step)

    def _save(self, trainer: pl.Trainer, step: int, reason: str) -> Path:
        """Collective: every rank calls `save_checkpoint`; global rank 0 clears what a killed earlier
        attempt left, then marks the snapshot complete once the save returned everywhere."""
        path = self._store.path(step)
        if trainer.is_global_zero:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        trainer.strategy.barrier("faultcast-prepare")
        # Ends with a barrier: every rank's part is written when it returns.
        trainer.save_checkpoint(path / CHECKPOINT_NAME, weights_only=False)
        self._store.finish(step, trainer.global_rank, reason, trainer.world_size, payload=CHECKPOINT_NAME)
        trainer.strategy.barrier("faultcast-complete")
        return path

    def _hold(self, trainer: pl.Trainer, step: int) -> None:
        """Hold while the job is moved; if nothing comes within `migration_wait_s`, go on."""
        start = time.monotonic()
        migration.hold(self._released, step, self.migration_wait_s)
        trainer.strategy.barrier("faultcast-hold")
        self.held_s += time.monotonic() - start
        log.warning("faultcast: no migration came within %.0f s; training goes on", self.migration_wait_s)


def latest_checkpoint(directory: str | os.PathLike[str]) -> str | None:
    """The checkpoint of the newest whole snapshot under `directory`, for `trainer.fit(ckpt_path=...)`;
    None when there is none (a fresh start). Directories without a marker (a save cut off) and markers
    that do not parse are passed over."""
    whole = [s for s in SnapshotStore(directory).complete() if s.payload == CHECKPOINT_NAME]
    return str(whole[-1].path / CHECKPOINT_NAME) if whole else None
