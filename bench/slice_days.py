"""Cut a data directory to a span of its days: what a fleet's history up to some day looked like.

`faultcast calibrate` reads a fleet's recent history and the evaluation then judges the days after
it; on a twin both come from one run, cut here into [start, end) days (rows, failures and manifest).
    .venv/bin/python bench/slice_days.py SRC DST --from-day 0 --to-day 2
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from faultcast.model.features.offline import open_dataset, unix_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--from-day", type=float, default=0.0)
    parser.add_argument("--to-day", type=float, required=True)
    args = parser.parse_args()
    data = open_dataset(args.src)
    start = data.start_s + args.from_day * 86_400.0
    end = data.start_s + args.to_day * 86_400.0
    if args.dst.exists():
        shutil.rmtree(args.dst)
    args.dst.mkdir(parents=True)
    for name in ("telemetry.parquet", "network.parquet"):
        if not (args.src / name).is_file():
            continue
        source = pq.ParquetFile(args.src / name)
        writer = None
        for group in range(source.num_row_groups):
            table = source.read_row_group(group)
            seconds = pc.divide(pc.cast(table["timestamp"], "int64"), 1_000_000_000)
            keep = pc.and_(pc.greater_equal(seconds, int(start)), pc.less(seconds, int(end)))
            part = table.filter(keep)
            if part.num_rows == 0:
                continue
            writer = writer or pq.ParquetWriter(args.dst / name, part.schema)
            writer.write_table(part)
        if writer is not None:
            writer.close()
    with (
        (args.src / "failures.csv").open(newline="") as src,
        (args.dst / "failures.csv").open("w", newline="") as dst,
    ):
        reader = csv.DictReader(src)
        writer_csv = csv.DictWriter(dst, fieldnames=reader.fieldnames or [])
        writer_csv.writeheader()
        for row in reader:
            when = unix_seconds(pd.Series([pd.Timestamp(row["timestamp"])]))[0]
            if start <= when < end:
                writer_csv.writerow(row)
    manifest = json.loads((args.src / "manifest.json").read_text())
    manifest["config"]["start_unix_s"] = start
    manifest["config"]["days"] = args.to_day - args.from_day
    manifest["sliced_from"] = {"path": str(args.src), "from_day": args.from_day, "to_day": args.to_day}
    (args.dst / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {args.dst}: days {args.from_day:g}-{args.to_day:g} of {args.src}")


if __name__ == "__main__":
    main()
