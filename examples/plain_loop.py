"""A plain PyTorch training loop, one process, protected by faultcast.

    python examples/plain_loop.py --snapshots /tmp/fc-plain --steps 200 --checkpoint-every 50
    FAULTCAST_TARGET=faultcast:50051 python examples/plain_loop.py --snapshots /tmp/fc-plain

With a service (`--target` or FAULTCAST_TARGET) a predicted fault on this node makes the loop snapshot
at the next agreement step; without one it only writes the periodic checkpoints of --checkpoint-every.
Run it again with the same --snapshots and it continues from the newest whole snapshot: model,
optimizer, scheduler, data position and random number generators, so the result is the same as if it
had never stopped. --stop-after N kills the process after N steps (no cleanup, like a node that dies)
to try that.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from faultcast.client import ResumableDistributedSampler, protect


def main() -> None:
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
    parser.add_argument("--stop-after", type=int, default=0, help="die after this many steps of this run")
    parser.add_argument("--final", type=Path, help="write the trained model's state dict here")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    dataset = TensorDataset(x, y)
    # One replica of a resumable sampler: it remembers the position inside the epoch.
    sampler = ResumableDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=2)
    # Its own generator: otherwise each new epoch's iterator draws a seed from the global RNG.
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, generator=torch.Generator())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.5)

    # The one faultcast line: a guard (when there is a service) plus snapshots of all of the above.
    protection = protect(
        args.target or None,  # no service: periodic checkpoints only
        args.snapshots,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        data=sampler,
        agree_every=args.agree_every,
        checkpoint_every=args.checkpoint_every,
    )
    step = start = protection.resume()  # 0, or the step of the newest whole snapshot
    epoch = sampler.epoch
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            optimizer.step()
            scheduler.step()
            step += 1
            protection.step_end(step)  # agree, snapshot if asked, checkpoint if due
            if step - start == args.stop_after:
                os._exit(3)  # a crash: no cleanup, the process is simply gone
            if step == args.steps:
                break
        else:
            epoch += 1
    protection.close()
    if args.final is not None:
        torch.save(model.state_dict(), args.final)
    stats = protection.stats
    summary = dict(resumed_from=start, steps=step, snapshots=stats.snapshots, checkpoints=stats.checkpoints)
    print(json.dumps(summary))  # for the tests, and to see where a rerun continues from


if __name__ == "__main__":
    main()
