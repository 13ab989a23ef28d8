"""A tiny LightningModule trained with the faultcast Lightning callback.

    pip install 'faultcast[lightning]'
    python examples/lightning_callback.py --snapshots /tmp/fc-lightning --steps 200 --checkpoint-every 50
    FAULTCAST_TARGET=faultcast:50051 python examples/lightning_callback.py --snapshots /tmp/fc-lightning
    torchrun --nproc_per_node 2 examples/lightning_callback.py --devices 2 --snapshots /shared/fc-lightning

With a service (`--target` or FAULTCAST_TARGET) a predicted fault on this node makes every rank save a
Lightning checkpoint at the next agreement step; --checkpoint-every adds periodic ones. Run it again
with the same --snapshots and `trainer.fit(ckpt_path=latest_checkpoint(...))` continues from the newest
whole snapshot at the same global step. Lightning restores model, optimizer and loop progress, not the
random number generators nor, with a plain DataLoader, the position inside an epoch.

The last line printed is a JSON summary: the step it resumed from, the step it ended at, and the steps
of the snapshots and checkpoints it took.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from faultcast.client.lightning import FaultcastCallback, latest_checkpoint


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--target", default=os.environ.get("FAULTCAST_TARGET"), help="faultcast service (host:port)"
    )
    parser.add_argument("--snapshots", type=Path, required=True, help="snapshot directory of this job")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--agree-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="periodic checkpoints (0: none)")
    parser.add_argument("--devices", type=int, default=1, help="processes on this node (DDP when more)")
    parser.add_argument("--final", type=Path, help="write the trained model's state dict here")
    args = parser.parse_args(argv)

    torch.manual_seed(0)  # the initial weights
    data = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)
    )

    callback = FaultcastCallback(
        args.target or None,
        args.snapshots,
        agree_every=args.agree_every,
        checkpoint_every=args.checkpoint_every,
    )
    trainer = pl.Trainer(
        max_steps=args.steps,
        devices=args.devices,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,  # faultcast's callback writes the checkpoints here
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    resume = latest_checkpoint(args.snapshots)  # None on the first run
    model = Regression()
    trainer.fit(model, loader, ckpt_path=resume)
    summary = {
        "resumed_from": callback.start_step,  # the global step the checkpoint restored (0: fresh)
        "steps": trainer.global_step,
        "snapshots": callback.snapshots,
        "checkpoints": callback.checkpoints,
    }
    if trainer.is_global_zero:
        if args.final is not None:
            torch.save(model.state_dict(), args.final)
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
