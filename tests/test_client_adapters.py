"""The Lightning and Hugging Face adapters against a real service: a twin node's HBM precursor opens an
alert, the job's callback snapshots at its next agreement step, the snapshot is whole on disk, and
the service records the acknowledgement and drains the node; the job then resumes from that snapshot
at the same global step with the same weights. Tested when the extras are installed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import torch

from faultcast.demo.feed import push, twin_snapshots
from faultcast.service.config import ServiceConfig
from faultcast.service.remediation.actuators import NoopActuator
from faultcast.service.rpc.validation import Limits
from faultcast.service.server import Service
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.schedule import Scenario
from faultcast.v1 import alerts_pb2 as apb

if TYPE_CHECKING:  # imported for real inside the tests, once importorskip found them
    import lightning.pytorch as pl

FLEET = FleetConfig(nodes=4, days=1.0, seed=77, acceleration=1.0)
NODE, GPU, FAIL_S = 2, 3, 10 * 3600.0
NAME = FLEET.node_name(NODE)
WAIT_S = 30.0
AGREE_EVERY = 5


@dataclass
class Alerting:
    """A running service that holds an open snapshot-and-migrate alert on NAME."""

    target: str
    service: Service
    actuator: NoopActuator


@pytest.fixture
def alerting(service_model: Path, tmp_path: Path) -> Iterator[Alerting]:
    actuator = NoopActuator()
    service = Service.open(
        service_model,
        tmp_path / "service",
        ServiceConfig(limits=Limits(max_future_s=0, max_age_s=0)),
        actuator=actuator,
    )
    port = service.start("127.0.0.1:0")
    try:
        # Five minutes before an HBM failure: the alert is stored, and a guard that subscribes later
        # is sent it from the durable log.
        source = TwinSource(FLEET, NODE, [Scenario("hbm_wear", NODE, GPU, FAIL_S, 40 * 60.0)])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            push(channel, NAME, twin_snapshots(source, NAME, int((FAIL_S - 5 * 60) / 60)))
        yield Alerting(f"127.0.0.1:{port}", service, actuator)
    finally:
        service.stop(0)


def check_remediated(alerting: Alerting, job_id: str, uri: str, replies: list[str]) -> None:
    """The acknowledgement reached the service: it drains the node and requeues the job, and records
    where the snapshot went."""
    assert len(replies) == 1
    assert f"drain {NAME}" in replies[0]
    assert alerting.service.remediator.wait_done(1, WAIT_S)
    seen = alerting.actuator.seen[0]
    assert (seen.node, seen.gpu, seen.job_id) == (NAME, GPU, job_id)
    assert seen.checkpoint_uri == uri


def pairs(count: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.Generator().manual_seed(1)
    x = torch.randn(count, 8, generator=data)
    return x, x @ torch.randn(8, 1, generator=data)


# -- Lightning -----------------------------------------------------------------------------------


def test_the_lightning_callback_snapshots_on_an_alert_and_the_job_resumes_from_it(
    alerting: Alerting, tmp_path: Path
) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from faultcast.client.lightning import FaultcastCallback, latest_checkpoint

    class Recorder(pl.Callback):
        """Waits (on train start) until the guard holds the service's alert, so the first agreement
        step certainly sees it; records the weights at train start and after each step."""

        def __init__(self, faultcast: FaultcastCallback | None) -> None:
            self.faultcast = faultcast
            self.alert: apb.Alert | None = None
            self.start_state: dict[str, torch.Tensor] = {}
            self.states: dict[int, dict[str, torch.Tensor]] = {}

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.start_state = clone(pl_module)
            if self.faultcast is not None:
                assert self.faultcast.guard is not None
                self.alert = self.faultcast.guard.wait_for_alert(WAIT_S)

        def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
            self.states[trainer.global_step] = clone(pl_module)

    snapshots = tmp_path / "snapshots"
    assert latest_checkpoint(snapshots) is None  # a fresh start
    callback = FaultcastCallback(
        alerting.target, snapshots, agree_every=AGREE_EVERY, job_id="job-l", node=NAME, migration_wait_s=0
    )
    recorder = Recorder(callback)
    fit_steps(regression(), [callback, recorder], steps=2 * AGREE_EVERY + 2)
    assert recorder.alert is not None
    assert recorder.alert.action == apb.RECOMMENDED_ACTION_SNAPSHOT_AND_MIGRATE
    assert callback.guard is None  # closed when fit tore down

    # One snapshot, at the first agreement step after the alert arrived, whole on disk.
    assert callback.snapshots == [AGREE_EVERY]
    step_dir = snapshots / f"step-{AGREE_EVERY:09d}"
    assert latest_checkpoint(snapshots) == str(step_dir / "lightning.ckpt")
    check_remediated(alerting, "job-l", step_dir.resolve().as_uri(), callback.acknowledgements)

    # A new job resumes from it at the same global step, with the weights it had then.
    resumed = FaultcastCallback(None, snapshots)
    again = Recorder(None)
    fit_steps(regression(), [resumed, again], steps=AGREE_EVERY + 2, ckpt=latest_checkpoint(snapshots))
    assert resumed.start_step == AGREE_EVERY
    assert min(again.states) == AGREE_EVERY + 1
    assert_same(again.start_state, recorder.states[AGREE_EVERY])
    assert not resumed.snapshots


def test_the_lightning_callback_checkpoints_periodically_and_skips_partial_snapshots(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from faultcast.client.lightning import FaultcastCallback, latest_checkpoint

    snapshots = tmp_path / "snapshots"
    callback = FaultcastCallback(None, snapshots, checkpoint_every=3, keep=2)
    fit_steps(regression(), [callback], steps=10)
    assert callback.checkpoints == [3, 6, 9]
    assert not callback.snapshots
    # keep=2: the oldest whole checkpoint is pruned.
    assert sorted(p.name for p in snapshots.iterdir()) == ["step-000000006", "step-000000009"]
    # A newer save cut off before its marker, and a marker naming another step, are passed over.
    (snapshots / "step-000000012").mkdir()
    (snapshots / "step-000000012" / "lightning.ckpt").write_bytes(b"half")
    damaged = snapshots / "step-000000015"
    damaged.mkdir()
    (damaged / "COMPLETE.json").write_text('{"step": 3, "reason": "x", "world_size": 1, "checkpoint": "x"}')
    assert latest_checkpoint(snapshots) == str(snapshots / "step-000000009" / "lightning.ckpt")

    resumed = FaultcastCallback(None, snapshots, checkpoint_every=3, keep=2)
    fit_steps(regression(), [resumed], steps=12, ckpt=latest_checkpoint(snapshots))
    assert resumed.start_step == 9
    assert resumed.checkpoints == [12]  # the step it resumed at is not written again
    assert latest_checkpoint(snapshots) == str(snapshots / "step-000000012" / "lightning.ckpt")


def regression() -> pl.LightningModule:
    """A linear regression as a LightningModule (defined here: lightning is imported only when present)."""
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    return Regression()


def fit_steps(
    module: pl.LightningModule, callbacks: list[pl.Callback], *, steps: int, ckpt: str | None = None
) -> None:
    import lightning.pytorch as pl

    x, y = pairs()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader, ckpt_path=ckpt)
    assert trainer.global_step == steps


def clone(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# -- Hugging Face --------------------------------------------------------------------------------


def test_the_hugging_face_callback_saves_on_an_alert_and_the_trainer_resumes_from_it(
    alerting: Alerting, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from faultcast.client.huggingface import FaultcastTrainerCallback

    class Recorder(TrainerCallback):
        """Waits (on train begin) until the guard holds the service's alert; records the global step
        training began at and the steps the Trainer saved at."""

        def __init__(self, faultcast: FaultcastTrainerCallback | None) -> None:
            self.faultcast = faultcast
            self.alert: apb.Alert | None = None
            self.began_at = -1
            self.saved: list[int] = []

        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            self.began_at = state.global_step
            if self.faultcast is not None:
                assert self.faultcast.guard is not None
                self.alert = self.faultcast.guard.wait_for_alert(WAIT_S)

        def on_save(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            self.saved.append(state.global_step)

    out = tmp_path / "out"

    def trainer(steps: int, callbacks: list[Any]) -> Trainer:
        args = TrainingArguments(
            output_dir=str(out),
            max_steps=steps,
            per_device_train_batch_size=16,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        return Trainer(model=Pairs.model(), args=args, train_dataset=Pairs(), callbacks=callbacks)

    callback = FaultcastTrainerCallback(
        alerting.target, agree_every=AGREE_EVERY, job_id="job-h", node=NAME, migration_wait_s=0
    )
    recorder = Recorder(callback)
    first = trainer(2 * AGREE_EVERY + 2, [callback, recorder])
    first.train()
    assert recorder.alert is not None
    assert callback.guard is None  # closed when training ended

    # save_strategy "no": the only checkpoint is the one the alert asked for, at the agreement step.
    assert callback.snapshots == recorder.saved == [AGREE_EVERY]
    checkpoint = out / f"checkpoint-{AGREE_EVERY}"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [checkpoint.name]
    assert (checkpoint / "trainer_state.json").is_file()
    check_remediated(alerting, "job-h", checkpoint.resolve().as_uri(), callback.acknowledgements)

    # The Trainer's own resume picks it up at that global step.
    again = Recorder(None)
    second = trainer(AGREE_EVERY + 2, [again])
    second.train(resume_from_checkpoint=True)
    assert again.began_at == AGREE_EVERY
    assert second.state.global_step == AGREE_EVERY + 2


class Pairs(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Regression pairs as the Trainer feeds them: a dict per example, the target under "labels"."""

    def __init__(self) -> None:
        self.x, self.y = pairs()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}

    @staticmethod
    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return Regressor()


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        prediction = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(prediction, labels), "logits": prediction}
