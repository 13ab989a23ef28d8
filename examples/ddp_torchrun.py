"""A DistributedDataParallel job under torchrun, protected by faultcast.

    torchrun --nproc_per_node 2 examples/ddp_torchrun.py --snapshots /shared/ckpt/my-job --steps 300
    FAULTCAST_TARGET=faultcast:50051 srun torchrun --nnodes 2 --nproc_per_node 8 ... examples/ddp_torchrun.py ...

NCCL on GPUs, gloo on CPUs. One process per node (local rank 0) holds the guard that watches the
node; every `--agree-every` steps all ranks agree whether any guard was asked for a snapshot, and then
all of them write it at that same step (torch.distributed.checkpoint, one shard per rank) into
--snapshots, which must be a directory every node sees. A restarted job continues from the newest whole
snapshot: model, optimizer, scheduler, each rank's data position and random number generators.
--stop-after N makes every rank die after N steps of this run, to try that.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from faultcast.client import ResumableDistributedSampler, protect


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--target", default=os.environ.get("FAULTCAST_TARGET"), help="faultcast service (host:port)"
    )
    parser.add_argument("--snapshots", type=Path, required=True, help="snapshot directory, on shared storage")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--agree-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="periodic checkpoints (0: none)")
    parser.add_argument("--stop-after", type=int, default=0, help="die after this many steps of this run")
    parser.add_argument("--final", type=Path, help="rank 0 writes the trained model's state dict here")
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address.
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)

    data = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 16, generator=data)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    dataset = TensorDataset(x, y)
    sampler = ResumableDistributedSampler(dataset, shuffle=True, seed=2)  # each rank its share, resumable
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, generator=torch.Generator())
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)

    protection = protect(
        args.target or None,  # no service: periodic checkpoints only
        args.snapshots,
        model=model,
        optimizer=optimizer,
        data=sampler,
        agree_every=args.agree_every,
        checkpoint_every=args.checkpoint_every,
    )
    step = start = protection.resume()  # collective: every rank loads the same snapshot
    epoch = sampler.epoch
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            logits = model(inputs.to(device))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.to(device))
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
            optimizer.step()
            step += 1
            protection.step_end(step)  # collective: call it on every rank after every step
            if step - start == args.stop_after:
                os._exit(3)  # a crash: no cleanup; torchrun sees the ranks die
            if step == args.steps:
                break
        else:
            epoch += 1
    protection.close()
    if dist.get_rank() == 0:
        if args.final is not None:
            torch.save(net.state_dict(), args.final)
        stats = protection.stats
        summary = dict(
            resumed_from=start, steps=step, snapshots=stats.snapshots, checkpoints=stats.checkpoints
        )
        print(json.dumps(summary))  # for the tests, and to see where a rerun continues from
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
