"""faultcast for the Hugging Face `Trainer`: a `TrainerCallback` that makes the Trainer save a checkpoint
when the service predicts a fault on one of the job's nodes, then acknowledges it.

    trainer = transformers.Trainer(..., callbacks=[FaultcastTrainerCallback("faultcast:50051")])
    trainer.train(resume_from_checkpoint=bool(transformers.trainer_utils.get_last_checkpoint(out)))

Every `agree_every` optimizer steps the processes agree (one all-reduce, MAX of a flag, when
torch.distributed is up) whether any node's guard holds a snapshot request; if so the callback sets
`control.should_save` and the Trainer writes its usual `checkpoint-<global_step>` directory under
`args.output_dir`: model, optimizer, scheduler, every process's RNG state and the trainer state, from
which `trainer.train(resume_from_checkpoint=...)` continues (skipping the batches already seen). Once
every process returned from the save, the guard acknowledges it with that directory as the URI.

The Trainer writes checkpoint directories in place: one cut off by a crash can look like the newest.
The snapshot taken here is acknowledged only after the save returned everywhere.

Needs `transformers` and `accelerate` (`pip install faultcast[huggingface]`).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import grpc
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from faultcast.client import identity, migration
from faultcast.client.agreement import Agreement, Vote
from faultcast.client.guard import Guard
from faultcast.v1 import alerts_pb2 as apb

log = logging.getLogger(__name__)


class FaultcastTrainerCallback(TrainerCallback):
    """Makes the Trainer save at an agreed step when a node of the job is predicted to fail, then
    acknowledges the checkpoint directory; with `target` None it does nothing. Pass it in `callbacks`."""

    def __init__(
        self,
        target: str | None,
        *,
        agree_every: int = 10,
        job_id: str | None = None,
        node: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        migration_wait_s: float = 300.0,
    ) -> None:
        """`target`: the faultcast service (None: the callback does nothing). `job_id` and `node`
        default to SLURM_JOB_ID / FAULTCAST_JOB_ID and SLURMD_NODENAME / the host name.
        `migration_wait_s`: after a snapshot whose acknowledgement drains the node, how long to hold
        still for the scheduler to move the job before training on. No I/O here."""
        if agree_every < 1:
            raise ValueError("agree_every must be at least 1")
        self.target, self.agree_every = target, agree_every
        self.job_id, self.node, self.credentials = job_id, node, credentials
        self.migration_wait_s = migration_wait_s
        self.guard: Guard | None = None  # on each node's local process zero, once training began
        self.agreement: Agreement | None = None
        self.snapshots: list[int] = []  # global steps of predictive snapshots
        self.acknowledgements: list[str] = []  # the service's replies
        self.held_s = 0.0
        self._requested: tuple[int, apb.Alert | None] | None = None  # agreed, not yet saved
        self._released = threading.Event()

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        """Start this node's guard (local process zero only) and the agreement. Collective."""
        # Every process: the process group (when distributed) is up by now.
        self.close()  # a guard left by an earlier train() with this callback
        self._released.clear()
        self._requested = None
        if self.target is None:
            return
        self.agreement = Agreement()
        node = identity.node_name(self.node)
        nodes = identity.all_gather_strings(node)
        if state.is_local_process_zero:
            job_id = identity.job_id(self.job_id)
            self.guard = Guard(
                self.target, job_id, [node], credentials=self.credentials, job_nodes=sorted(set(nodes))
            ).start()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        """Every `agree_every` steps, agree across processes whether to save now (sets should_save)."""
        if self.agreement is None or state.global_step % self.agree_every != 0:
            return
        alert = self.guard.pending() if self.guard is not None else None
        if self.agreement.agree(Vote(snapshot=alert is not None)).snapshot:
            control.should_save = True  # the Trainer saves right after this hook, at this step
            self._requested = (state.global_step, alert)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        """After an agreed save: acknowledge it and hold while the job is moved, if the service drains
        the node. Saves the Trainer makes on its own pass through untouched."""
        if self._requested is None or self.agreement is None:
            return
        step, alert = self._requested
        self._requested = None
        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every process's part (its RNG state, its shard) is written
        self.snapshots.append(state.global_step)
        expect_migration = False
        if self.guard is not None and alert is not None:
            path = Path(args.output_dir or ".") / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            uri = path.resolve().as_uri()
            expect_migration = migration.acknowledge(
                self.guard, state.global_step, uri, self.acknowledgements
            )
        if self.agreement.agree(Vote(migrate=expect_migration)).migrate:
            self._hold(step)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        """Stop the guard."""
        self.close()

    def close(self) -> None:
        """Stop the guard and end a hold under way (also done when training ends)."""
        self._released.set()
        if self.guard is not None:
            self.guard.close()
            self.guard = None

    def _hold(self, step: int) -> None:
        """Hold while the job is moved; if nothing comes within `migration_wait_s`, go on."""
        start = time.monotonic()
        migration.hold(self._released, step, self.migration_wait_s)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        self.held_s += time.monotonic() - start
        log.warning("faultcast: no migration came within %.0f s; training goes on", self.migration_wait_s)
