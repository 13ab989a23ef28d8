"""`faultcast import-prometheus` at fleet scale: wall time, samples per second and peak memory.

    .venv/bin/python bench/importer.py --gpus 256 --days 2            # one size
    .venv/bin/python bench/importer.py --gpus 1024 --days 30          # the issue's target (dozens of GiB)

The bench writes a Prometheus export the way a real one is pulled out of Prometheus: a directory of
range-query answers, one file per metric and day (query_range answers at most 11,000 points a
series, so long histories come in pieces and every series is split across files by time). It holds
dcgm-exporter's default metrics (etc/default-counters.csv: the 20 fields plus its 5 profiling ones,
some of which the catalogue has no column for) for every GPU, and node_exporter's InfiniBand counters
(4 ports a node) and TCP retransmits for every node, at `--cadence` seconds. Values move the way real
ones do (power at milliwatt resolution, integer temperatures on a random walk, counters that count).

The import runs as a child process (the `faultcast import-prometheus` command, as an operator runs
it); its peak memory is the child's maximum resident set size (getrusage RUSAGE_CHILDREN), its time
the wall clock around it. The export and the data directory live in a temporary directory (or
`--keep DIR`), removed after.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# dcgm-exporter's etc/default-counters.csv (4.5.3-4.8.2), uncommented rows, and how their values move.
DCGM_DEFAULTS: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "clock",
    "DCGM_FI_DEV_MEM_CLOCK": "constant",
    "DCGM_FI_DEV_MEMORY_TEMP": "temperature",
    "DCGM_FI_DEV_GPU_TEMP": "temperature",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "rare_counter",
    "DCGM_FI_DEV_GPU_UTIL": "percent",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "percent",
    "DCGM_FI_DEV_ENC_UTIL": "zero",
    "DCGM_FI_DEV_DEC_UTIL": "zero",
    "DCGM_FI_DEV_XID_ERRORS": "zero",
    "DCGM_FI_DEV_FB_FREE": "memory",
    "DCGM_FI_DEV_FB_USED": "memory",
    "DCGM_FI_DEV_FB_RESERVED": "constant",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "energy",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "zero",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "zero",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "rare_counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "zero",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "ratio",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "power",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "power",
}
# node_exporter, per node: InfiniBand port counters (4 ports) and TCP retransmits.
NODE_SERIES: dict[str, str] = {
    "node_infiniband_symbol_error_total": "rare_counter",
    "node_infiniband_link_error_recovery_total": "rare_counter",
    "node_infiniband_port_errors_received_total": "rare_counter",
    "node_infiniband_port_data_received_bytes_total": "energy",
    "node_infiniband_state_id": "constant",
}
IB_PORTS = 4
START = 1_767_571_200  # 2026-01-05T00:00:00Z


def _values(kind: str, n: int, rng: np.random.Generator) -> list[str]:
    """`n` sample values of one series, as the exporter writes them."""
    if kind == "temperature":
        walk = np.clip(60 + np.cumsum(rng.integers(-1, 2, n)), 25, 90)
        return [str(v) for v in walk.tolist()]
    if kind == "power":
        return [f"{v:.3f}" for v in (350 + 50 * rng.random(n)).tolist()]
    if kind == "energy":
        return [str(v) for v in np.cumsum(rng.integers(9_000_000, 12_000_000, n)).tolist()]
    if kind == "rare_counter":
        return [str(v) for v in np.cumsum(rng.random(n) < 0.001).tolist()]
    if kind == "percent":
        return [str(v) for v in rng.integers(90, 101, n).tolist()]
    if kind == "ratio":
        return [f"{v:.6f}" for v in rng.random(n).tolist()]
    if kind == "clock":
        return [str(v) for v in rng.choice([1755, 1980], n).tolist()]
    if kind == "memory":
        return [str(v) for v in (40_000 + rng.integers(0, 100, n)).tolist()]
    return ["7" if kind == "constant" else "0"] * n


def _series_text(labels: dict[str, str], stamps: list[str], values: list[str]) -> str:
    pairs = '"],'.join(p + v for p, v in zip(stamps, values, strict=True))
    return f'{{"metric":{json.dumps(labels)},"values":[{pairs}"]]}}'


def write_export(
    folder: Path, gpus: int, gpus_per_node: int, days: float, cadence_s: float, seed: int
) -> int:
    """Write the export, one file per metric and day; return the number of samples."""
    rng = np.random.default_rng(seed)
    nodes = -(-gpus // gpus_per_node)
    steps_per_day = round(86_400 / cadence_s)
    total_steps = round(days * 86_400 / cadence_s)
    samples = 0
    for day in range(-(-total_steps // steps_per_day)):
        lo, hi = day * steps_per_day, min(total_steps, (day + 1) * steps_per_day)
        stamps = [f'[{START + k * cadence_s:.3f},"' for k in range(lo, hi)]
        for name, kind in {**DCGM_DEFAULTS, **NODE_SERIES}.items():
            parts = []
            for g in range(gpus if name.startswith("DCGM") else nodes):
                node = f"node-{(g // gpus_per_node if name.startswith('DCGM') else g):04d}"
                if name.startswith("DCGM"):
                    labels = {"__name__": name, "gpu": str(g % gpus_per_node), "UUID": f"GPU-{g:08d}",
                              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node, "job": "dcgm"}  # fmt: skip
                    parts.append(_series_text(labels, stamps, _values(kind, hi - lo, rng)))
                    continue
                ports = IB_PORTS if name.startswith("node_infiniband") else 1
                for port in range(ports):
                    labels = {"__name__": name, "instance": f"{node}:9100", "job": "node"}
                    if ports > 1:
                        labels |= {"device": f"mlx5_{port}", "port": "1"}
                    parts.append(_series_text(labels, stamps, _values(kind, hi - lo, rng)))
            samples += len(parts) * (hi - lo)
            body = ",".join(parts)
            (folder / f"{name}-day{day:03d}.json").write_text(
                f'{{"status":"success","data":{{"resultType":"matrix","result":[{body}]}}}}'
            )
    retrans = [
        _series_text(
            {"__name__": "node_netstat_Tcp_RetransSegs", "instance": f"node-{n:04d}:9100"},
            [f'[{START + k * cadence_s:.3f},"' for k in range(total_steps)],
            [str(v) for v in np.cumsum(rng.integers(0, 5, total_steps)).tolist()],
        )
        for n in range(nodes)
    ]
    samples += nodes * total_steps
    (folder / "node_netstat_Tcp_RetransSegs.json").write_text(
        f'{{"status":"success","data":{{"resultType":"matrix","result":[{",".join(retrans)}]}}}}'
    )
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--cadence", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        export, out = root / "export", root / "data"
        export.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        samples = write_export(export, args.gpus, args.gpus_per_node, args.days, args.cadence, args.seed)
        generated = time.perf_counter() - started
        export_bytes = sum(p.stat().st_size for p in export.iterdir())
        command = [str(Path(sys.executable).parent / "faultcast"), "import-prometheus", "--export", str(export),
                   "--out", str(out), "--spill-dir", str(root)]  # fmt: skip
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        manifest = json.loads((out / "manifest.json").read_text())
        written = sum(p.stat().st_size for p in out.iterdir())
    stream = manifest["streaming"]
    unused = ", ".join(f"{name} ({entry['series']})" for name, entry in manifest["not_used"].items())
    days, cadence = f"{args.days:g}", f"{args.cadence:g}"
    print(f"export: {args.gpus} GPUs ({manifest['config']['nodes']} nodes) x {days} days at {cadence} s")
    print(
        f"samples:             {samples:,} ({export_bytes / 2**20:,.0f} MiB of JSON, generated in {generated:.0f} s)"
    )
    print(
        f"telemetry rows:      {manifest['rows']['telemetry']:,}; network rows {manifest['rows']['network']:,}"
    )
    print(f"wall time:           {wall:.1f} s")
    print(f"samples per second:  {samples / wall:,.0f}")
    print(f"peak RSS:            {peak_mib:,.0f} MiB")
    print(
        f"spill:               {stream['spill_bytes'] / 2**20:,.0f} MiB; data written {written / 2**20:,.0f} MiB"
    )
    print(
        f"slices:              {stream['chunk_steps']} steps, {stream['row_groups']} row groups, at most "
        f"{stream['largest_chunk_rows']:,} grid rows and {stream['largest_read_samples']:,} samples at once"
    )
    print(f"not used:            {unused}")


if __name__ == "__main__":
    main()
