"""The service's archive of scored samples: its disk cost per GPU-day against `faultcast simulate`'s files
for the same twin (the same rows in the same schema), and its CPU cost per sample.

    .venv/bin/python bench/archive.py --nodes 8 --days 2

The twin's samples of every node are fed through `Archive.observe` as a fleet's arrive (nodes
interleaved, one sample a step), then written and every day settled (merged, sorted, one file per day);
the figures are the archive's settled files against the twin's telemetry.parquet and network.parquet.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from faultcast.demo.feed import twin_snapshots
from faultcast.service.archive.writer import Archive, ArchiveSettings
from faultcast.sim.config import FleetConfig
from faultcast.sim.live import TwinSource
from faultcast.sim.writer import simulate


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*.parquet")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    fleet = FleetConfig(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days, seed=args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        twin, where = Path(scratch) / "twin", Path(scratch) / "archive"
        simulate(fleet, twin)
        snapshots = [
            s
            for batch in zip(
                *(twin_snapshots(TwinSource(fleet, n), f"node-{n:04d}", 10**9) for n in range(fleet.nodes)),
                strict=False,
            )
            for s in batch
        ]
        archive = Archive(ArchiveSettings(where, fleet.cadence_s, settle_s=-1e9))
        started = time.process_time()
        for s in snapshots:
            archive.observe(s)
        archive.close()
        observed = time.process_time() - started
        started = time.process_time()
        archive.maintain()
        settled = time.process_time() - started
        gpu_days = archive.counts.rows * fleet.cadence_s / 86_400
        ours = _bytes(where / "telemetry.parquet") + _bytes(where / "network.parquet")
        theirs = _bytes(twin / "telemetry.parquet") + _bytes(twin / "network.parquet")
        print(
            f"fleet: {fleet.nodes} nodes x {fleet.gpus_per_node} GPUs x {fleet.days:g} days at {fleet.cadence_s:g} s"
        )
        print(
            f"samples observed: {len(snapshots):,}; GPU rows archived: {archive.counts.rows:,} "
            f"({gpu_days:.1f} GPU-days)"
        )
        print(
            f"archive: {ours / gpu_days / 1024:.1f} KiB per GPU-day ({ours:,} bytes, {len(archive.days())} days)"
        )
        print(f"simulate's files: {theirs / gpu_days / 1024:.1f} KiB per GPU-day ({theirs:,} bytes)")
        print(f"archive / simulate: {ours / theirs:.3f}")
        print(f"CPU: observe and write parts {observed / len(snapshots) * 1e6:.0f} us per node sample; "
              f"settling {settled:.2f} s ({settled / gpu_days * 1e3:.1f} ms per GPU-day)")  # fmt: skip


if __name__ == "__main__":
    main()
