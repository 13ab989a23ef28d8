"""`faultcast import-prometheus --url` against a real Prometheus holding a backfilled history: how long
the fetch takes, against importing the same answers from disk, and what the step summaries cost.

    .venv/bin/python bench/prometheus_url.py --gpus 16 --hours 24      # 10 s scrapes, 60 s step

The bench writes dcgm-exporter's default gauges the model reads inside a step (GPU temperature, power,
SM clock), three more defaults and the clock-event-reasons bitmask for `--gpus` GPUs (8 a node) at
`--scrape` seconds over `--hours` ending an hour ago, as OpenMetrics, backfills a TSDB with `promtool
tsdb create-blocks-from openmetrics`, starts `prometheus` on it, and runs as child processes:

1. `faultcast import-prometheus --url` (the fetch with the step summaries, then the import);
2. the same with `--export` on the fetch's own folder (the import alone, from disk): the difference is
   the fetch.

Time is the wall clock around each child; peak memory its own maximum resident set size (wait4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

FAULTCAST = str(Path(sys.executable).with_name("faultcast"))
GAUGES = {  # dcgm-exporter default name -> how its values move
    "DCGM_FI_DEV_GPU_TEMP": "temperature",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_SM_CLOCK": "clock",
    "DCGM_FI_DEV_MEMORY_TEMP": "temperature",
    "DCGM_FI_DEV_GPU_UTIL": "util",
    "DCGM_FI_DEV_FB_USED": "memory",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "mask",
}


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "temperature":
        return np.round(60 + np.cumsum(rng.normal(0, 0.2, n)).clip(-20, 20))
    if kind == "power":
        return np.round(500 + 150 * rng.random(n), 3)
    if kind == "clock":
        return np.where(rng.random(n) < 0.02, 1200.0, 1980.0)
    if kind == "util":
        return np.round(100 * rng.random(n))
    if kind == "memory":
        return np.full(n, 60_000.0)
    return np.where(rng.random(n) < 0.01, 0x80, 0x01).astype(np.float64)  # a rare power brake


def write_openmetrics(path: Path, gpus: int, start: int, samples: int, scrape_s: int, seed: int) -> int:
    """The history as OpenMetrics, family by family, series by series; returns the samples written."""
    rng = np.random.default_rng(seed)
    times = start + scrape_s * np.arange(samples)
    written = 0
    with path.open("w") as out:
        for name, kind in GAUGES.items():
            out.write(f"# TYPE {name} gauge\n")
            for g in range(gpus):
                labels = f'{{gpu="{g % 8}",UUID="GPU-{g:04d}",modelName="NVIDIA H100",Hostname="node{g // 8:03d}"}}'
                values = _values(kind, samples, rng)
                out.writelines(f"{name}{labels} {v:g} {t}\n" for v, t in zip(values, times, strict=True))
                written += samples
        out.write("# EOF\n")
    return written


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) of this child alone (wait4: promtool's is not counted) and its
    stdout."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{err.read()[-2000:]}")
        return wall, usage.ru_maxrss / 1024.0, out.read()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--scrape", type=int, default=10, help="seconds between scrapes (default 10)")
    parser.add_argument("--step", default="60s")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            raise SystemExit(f"{binary} is not installed (make system-deps)")
    with tempfile.TemporaryDirectory(prefix="faultcast-url-bench-") as folder:
        where = Path(folder)
        samples = int(args.hours * 3600 / args.scrape)
        end = (int(time.time()) // 3600 - 1) * 3600
        start = end - samples * args.scrape
        started = time.perf_counter()
        total = write_openmetrics(where / "history.om", args.gpus, start, samples, args.scrape, args.seed)
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(where / "history.om"), str(where / "tsdb")],
            check=True, capture_output=True,
        )  # fmt: skip
        (where / "history.om").unlink()
        print(f"backfilled {total:,} samples ({args.gpus} GPUs x {args.hours:g} h at {args.scrape} s) in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        (where / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
        port = _free_port()
        server = subprocess.Popen(
            ["prometheus", f"--config.file={where / 'prometheus.yml'}", f"--storage.tsdb.path={where / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("prometheus did not start") from None
                    time.sleep(0.2)
            url = f"http://127.0.0.1:{port}"
            window = ["--since", str(start), "--until", str(end), "--step", args.step]
            fetched = _child(
                [FAULTCAST, "import-prometheus", "--url", url, *window, "--out", str(where / "url")]
            )
            again = _child([FAULTCAST, "import-prometheus", "--export", str(where / "url" / "prometheus-export"),
                            "--interval", args.step, "--out", str(where / "disk")])  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=30)
        manifest = json.loads((where / "url" / "manifest.json").read_text())
        answers = len(list((where / "url" / "prometheus-export").glob("*.json")))
        size = sum(p.stat().st_size for p in (where / "url" / "prometheus-export").glob("*.json"))
        rows = manifest["rows"]["telemetry"]
        summarised = manifest["step_summaries"]["gpus"]
        print(fetched[2].strip().splitlines()[0])
        print(f"--url (fetch + import): {fetched[0]:.1f} s, peak {fetched[1]:.0f} MiB; {answers} answers, "
              f"{size / 2**20:.1f} MiB of JSON; {rows:,} rows, {total / fetched[0]:,.0f} raw samples/s")  # fmt: skip
        print(f"--export of the same answers (import alone): {again[0]:.1f} s, peak {again[1]:.0f} MiB")
        gauges = sorted({c.rsplit("_step_", 1)[0] for c in summarised if "_step_" in c})
        print(f"fetch alone (the difference): {fetched[0] - again[0]:.1f} s; step summaries on "
              f"{max(summarised.values()) if summarised else 0} GPUs of {', '.join(gauges)}")  # fmt: skip


if __name__ == "__main__":
    main()
