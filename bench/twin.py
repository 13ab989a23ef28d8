"""Fleet twin generation: wall time, CPU time and peak memory for a fleet x days run.

    .venv/bin/python bench/twin.py --nodes 128 --days 30      # the issue's 1,024 GPUs x 30 days at 60 s

Peak memory is the process's maximum resident set size (getrusage), which includes the
interpreter and imported libraries. The output folder is a temporary directory, removed after.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from faultcast.sim.config import FleetConfig
from faultcast.sim.writer import simulate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--acceleration", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    config = FleetConfig(nodes=args.nodes, gpus_per_node=args.gpus_per_node, days=args.days,
                         cadence_s=args.interval, seed=args.seed, acceleration=args.acceleration)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = time.perf_counter(), time.process_time()
        manifest = simulate(config, Path(tmp))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        sizes = {p.name: p.stat().st_size for p in Path(tmp).iterdir()}
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpus = config.nodes * config.gpus_per_node
    rows = manifest["rows"]
    print(f"fleet twin: {gpus} GPUs ({config.nodes} nodes) x {config.days:g} days at {config.cadence_s:g} s, "
          f"acceleration {config.acceleration:g}, seed {config.seed}")  # fmt: skip
    print(f"telemetry rows:      {rows['telemetry']:,}")
    print(f"network rows:        {rows['network']:,}")
    print(f"failures:            {rows['failures']} {manifest['failure_counts']}")
    print(f"wall time:           {wall:.1f} s")
    print(f"CPU time:            {cpu:.1f} s")
    print(f"GPU-rows per second: {rows['telemetry'] / wall:,.0f}")
    print(f"peak RSS:            {peak_mib:,.0f} MiB")
    print(f"telemetry.parquet:   {sizes['telemetry.parquet'] / 2**20:,.0f} MiB")
    print(f"network.parquet:     {sizes['network.parquet'] / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
