"""A twin run exported the way a plain dcgm-exporter fleet reaches an operator: a Prometheus range-query
answer with seven of dcgm-exporter's default metrics at a 10-minute step, and some exporters frozen.

    .venv/bin/python bench/dcgm_export.py TWIN_DIR EXPORT.json [--step 600] \
        [--freeze NODE:GPU:START_H ...] [--freeze-hours 37] [--metrics NAME,NAME,...]

What it emulates (bench/healthy_dcgm.sh runs it):

- The metrics: seven fields that dcgm-exporter's etc/default-counters.csv enables (NVIDIA/dcgm-exporter
  at 00d6d34): GPU and memory temperature, power draw, SM clock, GPU utilisation, the last Xid, and
  uncorrectable remapped rows. The double-bit ECC counter DCGM_FI_DEV_ECC_DBE_VOL_TOTAL is commented
  out in that file (its whole ECC block is), so a default deployment does not export it; uncorrectable
  row remaps are its default-enabled stand-in on A100 and later. `--metrics` takes any other list of
  dcgm-exporter names the catalogue knows.
- The labels dcgm-exporter writes (gpu, UUID, pci_bus_id, device, modelName, Hostname,
  DCGM_FI_DRIVER_VERSION) plus what Prometheus adds (instance as the exporter's pod address and port,
  job); `instance` is deliberately not the node's name, as under Kubernetes.
- The cadence: Prometheus evaluates a range query at start + k x step, so every series holds the
  twin's sample at each 600 s step of the fleet's grid (one 60 s sample in ten).
- The resolution: dcgm-exporter prints integer temperatures, clocks, utilisation, Xid and row counts,
  and power in watts with milliwatt digits; values are rounded so, and written the way Prometheus
  writes floats ("61", not "61.0"). A missing twin value is left out, as the exporter leaves it out.
- Frozen exporters: from START_H hours into the run, for `--freeze-hours`, a GPU's every series repeats
  the last values it had before with new timestamps (what a hung dcgm-exporter behind a live scrape
  target looks like in Prometheus).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from faultcast.catalogue import by_name
from faultcast.dcgm import readable_names
from faultcast.model.features.offline import unix_seconds

DEFAULT_METRICS: tuple[str, ...] = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
)
"""Seven of dcgm-exporter's default-enabled fields (etc/default-counters.csv)."""

_DECIMALS: dict[str, int] = {"DCGM_FI_DEV_POWER_USAGE": 3}
"""Digits dcgm-exporter prints after the point; every other field here is an integer."""

DRIVER_VERSION = "535.161.08"


@dataclass(frozen=True)
class Freeze:
    """One GPU whose exporter stops updating `start_h` hours into the run for `hours` hours."""

    node: str
    gpu: int
    start_h: float
    hours: float


def _column_of(field: str) -> str:
    """The twin's column for a dcgm-exporter field name."""
    for named in readable_names().values():
        if named.name == field:
            return named.metric
    raise SystemExit(f"{field}: not a dcgm-exporter name the catalogue knows")


def _prometheus_float(value: float) -> str:
    """A sample value the way Prometheus writes it (Go's strconv 'f', -1 for these magnitudes)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _parse_freeze(text: str, hours: float) -> Freeze:
    node, gpu, start = text.rsplit(":", 2)
    return Freeze(node, int(gpu), float(start), hours)


def export(twin: Path, fields: tuple[str, ...], step_s: float, freezes: list[Freeze]) -> dict[str, Any]:
    """The range-query answer for `twin`'s telemetry: one series per GPU and field."""
    columns = {field: _column_of(field) for field in fields}
    table = pq.read_table(
        twin / "telemetry.parquet",
        columns=["timestamp", "node", "gpu", "uuid", "model", *sorted(set(columns.values()))],
    )
    frame = table.to_pandas()
    frame["time_s"] = unix_seconds(frame["timestamp"])
    start_s = float(json.loads((twin / "manifest.json").read_text())["config"]["start_unix_s"])
    on_step = np.isclose(np.mod(frame["time_s"].to_numpy() - start_s, step_s), 0.0)
    frame = frame[on_step]
    frozen = {(f.node, f.gpu): f for f in freezes}
    nodes = sorted(frame["node"].astype(str).unique())
    result: list[dict[str, Any]] = []
    for (node, gpu, uuid, model), rows in frame.groupby(["node", "gpu", "uuid", "model"], observed=True):
        node_index = nodes.index(str(node))
        labels = {
            "gpu": str(gpu),
            "UUID": str(uuid),
            "pci_bus_id": f"00000000:{0x07 + 0x40 * int(gpu):02X}:00.0",
            "device": f"nvidia{gpu}",
            "modelName": str(model),
            "Hostname": str(node),
            "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
            "instance": f"10.42.{node_index // 250}.{node_index % 250 + 2}:9400",
            "job": "dcgm-exporter",
        }
        times = rows["time_s"].to_numpy(np.float64)
        freeze = frozen.pop((str(node), int(gpu)), None)
        for field, column in columns.items():
            values = np.round(rows[column].to_numpy(np.float64), _DECIMALS.get(field, 0))
            if freeze is not None:
                values = _frozen(times, values, start_s, freeze)
            keep = np.isfinite(values)
            samples = [
                [float(t), _prometheus_float(v)] for t, v in zip(times[keep], values[keep], strict=True)
            ]
            if samples:
                result.append({"metric": {"__name__": field, **labels}, "values": samples})
    if frozen:
        raise SystemExit(f"no such GPU to freeze: {sorted(frozen)}")
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _frozen(times: np.ndarray, values: np.ndarray, start_s: float, freeze: Freeze) -> np.ndarray:
    """`values` with the freeze's span holding the last value reported before it."""
    begin = start_s + freeze.start_h * 3600.0
    span = (times >= begin) & (times < begin + freeze.hours * 3600.0)
    before = np.flatnonzero((times < begin) & np.isfinite(values))
    out = values.copy()
    out[span] = values[before[-1]] if len(before) else np.nan
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("twin", type=Path, help="a `faultcast simulate` output")
    parser.add_argument("out", type=Path, help="the range-query answer to write (JSON)")
    parser.add_argument("--step", type=float, default=600.0, help="the query's step in seconds")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="dcgm-exporter field names")
    parser.add_argument("--freeze", action="append", default=[], metavar="NODE:GPU:START_H")
    parser.add_argument("--freeze-hours", type=float, default=37.0)
    args = parser.parse_args()
    fields = tuple(f.strip() for f in args.metrics.split(",") if f.strip())
    for field in fields:
        by_name(_column_of(field))  # an unknown column fails here, before the twin is read
    freezes = [_parse_freeze(text, args.freeze_hours) for text in args.freeze]
    document = export(args.twin, fields, args.step, freezes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document))
    series = document["data"]["result"]
    samples = sum(len(s["values"]) for s in series)
    print(
        f"wrote {args.out}: {len(series)} series ({len(fields)} fields), {samples:,} samples at "
        f"{args.step:g} s; frozen: "
        + (
            ", ".join(f"{f.node} gpu {f.gpu} from {f.start_h:g} h for {f.hours:g} h" for f in freezes)
            or "none"
        )
    )


if __name__ == "__main__":
    main()
