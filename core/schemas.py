"""The data files every fleet source writes and every reader expects (the twin's `faultcast simulate`,
`faultcast import` from Prometheus, a real failure log): column names and Arrow types.

    telemetry.parquet  one row per GPU per step: timestamp, node, gpu, uuid, model, then the catalogue's
                       GPU metrics (counters float64, gauges float32); the twin's add each step's summary
    network.parquet    one row per node per step: timestamp, node, then the rolled-up network metrics
    failures.csv       the failure log: FAILURE_FIELDS, gpu empty for a node-level failure

Each of the two tables is either a file or a directory of Parquet files (a rolling archive's day
files, possibly one level deeper) read in the order of their names as one table
(model/features/parquet_parts.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from faultcast.catalogue import Scope, metrics_for
from faultcast.rollup import NETWORK_COLUMNS, NETWORK_WIDE, is_wide
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARY_COLUMNS

GPU_COLUMNS = [m.name for m in metrics_for(Scope.GPU)]
"""telemetry.parquet's metric columns, in catalogue order (after its five identity columns)."""
TIMESTAMP = pa.timestamp("ns", tz="UTC")
"""The Arrow type of every `timestamp` column: nanoseconds, UTC."""
_DICT = pa.dictionary(pa.int32(), pa.string())

TELEMETRY_SCHEMA = pa.schema(
    [("timestamp", TIMESTAMP), ("node", _DICT), ("gpu", pa.int16()), ("uuid", _DICT), ("model", _DICT)]
    + [(m.name, pa.float64() if is_wide(m) else pa.float32()) for m in metrics_for(Scope.GPU)]
)
"""telemetry.parquet: one row per GPU per step."""
SUMMARY_FIELDS = [pa.field(SCRAPES_COLUMN, pa.int16()), *(pa.field(c, pa.float32()) for c in SUMMARY_COLUMNS)]
"""The Arrow fields of a step's summary (faultcast.step_summary): its scrapes, then SUMMARY_COLUMNS."""
SUMMARISED_TELEMETRY_SCHEMA = pa.schema([*TELEMETRY_SCHEMA, *SUMMARY_FIELDS])
"""telemetry.parquet from a source that knows what happened inside each step (the twin): the step's
last scrape as in TELEMETRY_SCHEMA, then its summary (faultcast.step_summary)."""
NETWORK_SCHEMA = pa.schema(
    [("timestamp", TIMESTAMP), ("node", _DICT)]
    + [(name, pa.float64() if name in NETWORK_WIDE else pa.float32()) for name in NETWORK_COLUMNS]
)
"""network.parquet: one row per node per step, the node's devices rolled up (faultcast.rollup)."""
FAILURE_FIELDS = ("timestamp", "node", "gpu", "uuid", "mode", "xid", "precursor_s", "description")
"""failures.csv's header, in order; `mode` is a FailureMode value, `gpu` and `uuid` empty for a node-level
failure. `precursor_s` is how long the failure's precursor ran before it, in seconds (0: it had none, so no
model could see it coming); empty where the log does not know (a real fleet's log), and logs written before
December 2026 lack the column."""

# Keys of a data manifest's "config" renamed since data was first written: old name -> current name.
_RENAMED_CONFIG_KEYS = {"interval_s": "cadence_s"}  # December 2026: the cadence got one name


def current_data_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A data directory's manifest.json with its "config" under today's key names, so data written
    before a rename reads (and compares) like data written after it."""
    config = manifest.get("config")
    if not isinstance(config, Mapping):
        return dict(manifest)
    return {**manifest, "config": {_RENAMED_CONFIG_KEYS.get(k, k): v for k, v in config.items()}}
