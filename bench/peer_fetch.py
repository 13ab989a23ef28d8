"""What the hand-over's bytes cost, apart from the job around them: one rank's state of --mb MB
staged to host memory, fetched from a PeerServer over this host's loopback, and written and read
back with torch.distributed.checkpoint (what the standby does without a peer), each --runs times in
the same process; medians and MB/s.

    .venv/bin/python bench/peer_fetch.py --mb 256 --runs 5

Loopback is no network: the fetch figure is the protocol's own cost (copies, framing, the receiver
filling fresh tensors) on this machine's memory bandwidth, the ceiling for a NIC, not a NIC.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

from faultcast.client import peer_state


def _state(mb: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(mb * (1 << 20) // 4, generator=generator), "b": torch.zeros(32)},
        "faultcast/rank0": pickle.dumps({"step": 1}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    state = _state(args.mb)
    size = peer_state.nbytes(state)
    times: dict[str, list[float]] = {"stage": [], "fetch": [], "write": [], "read": []}
    for _ in range(args.runs):
        started = time.perf_counter()
        staged = peer_state.stage(state)
        times["stage"].append(time.perf_counter() - started)

        server = peer_state.PeerServer(staged, 0, host="127.0.0.1")
        started = time.perf_counter()
        fetched = peer_state.fetch(server.address, server.token, server.key, 0)
        times["fetch"].append(time.perf_counter() - started)
        server.close()
        assert torch.equal(fetched["model"]["w"], state["model"]["w"])  # type: ignore[index]

        directory = Path(tempfile.mkdtemp(prefix="fc-peer-bench-"))
        try:
            started = time.perf_counter()
            save(staged, checkpoint_id=directory, no_dist=True)
            times["write"].append(time.perf_counter() - started)
            target = _state(0)
            target["model"]["w"] = torch.empty_like(state["model"]["w"])  # type: ignore[index]
            started = time.perf_counter()
            load(target, checkpoint_id=directory, no_dist=True)
            times["read"].append(time.perf_counter() - started)
        finally:
            shutil.rmtree(directory)
    print(f"state {size / 1e6:.1f} MB, {args.runs} runs, medians:")
    for name, values in times.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {name:6s} {median:.3f} s  {size / median / 1e9:.2f} GB/s  (runs: {each})")


if __name__ == "__main__":
    main()
