#!/usr/bin/env bash
# Healthy production telemetry as a plain dcgm-exporter fleet delivers
# it (A100 nodes of 4 GPUs, 7 default metrics, a 10-minute query step, two exporters frozen for 37 h),
# imported, calibrated on its first two unlabelled days, then scored on the four days after. Nothing in
# the fleet fails, so every alert on days 2-6 is a false alarm; they are counted at the calibrated
# threshold and at the model's trained one.
#   bash bench/healthy_dcgm.sh MODEL_DIR [OUT_DIR]
set -euo pipefail
model=${1:?a trained model directory}
out=${2:-out/healthy-dcgm}
bin=.venv/bin
mkdir -p "$out"
# A healthy fleet at the real failure rate (checked below: the twin must record no failure).
[ -f "$out/twin/manifest.json" ] || "$bin/faultcast" simulate --world-seed 21 --seed 21 --nodes 12 \
  --gpus-per-node 4 --days 6 --acceleration 1 --h100-fraction 0 --out "$out/twin" > "$out/twin.log"
cat "$out/twin.log"
if [ "$(tail -n +2 "$out/twin/failures.csv" | wc -l)" -ne 0 ]; then
  echo "the twin recorded failures: not a healthy fleet" >&2
  exit 1
fi
# Seven default fields at a 600 s step; node-0003 gpu 1 freezes across the calibration cut (hours
# 30-67), node-0008 gpu 2 inside the scored days (hours 60-97).
"$bin/python" bench/dcgm_export.py "$out/twin" "$out/export.json" --step 600 \
  --freeze node-0003:1:30 --freeze node-0008:2:60 --freeze-hours 37 | tee "$out/export.log"
echo "timestamp,node,gpu,mode" > "$out/no-failures.csv"  # nothing failed: a header only
"$bin/faultcast" import-prometheus --export "$out/export.json" --failures "$out/no-failures.csv" \
  --out "$out/imported" 2>&1 | tee "$out/import.log"
"$bin/python" bench/slice_days.py "$out/imported" "$out/history" --from-day 0 --to-day 2
"$bin/python" bench/slice_days.py "$out/imported" "$out/after" --from-day 2 --to-day 6
# Two copies of the model: one calibrated on the history, one at the threshold training chose.
for copy in calibrated trained; do
  rm -rf "${out:?}/$copy" && cp -r "$model" "$out/$copy" && rm -f "$out/$copy/threshold.json"
done
# Calibrate on the history at the data's node size (4); should that fail (on 2026-12-05 calibrate reshaped
# the history to the model's 8 GPUs a node and crashed), fall back to what an operator would do: import
# the same export again at --gpus-per-node 8 (GPUs 4-7 absent) and calibrate on that.
if ! "$bin/faultcast" calibrate --model "$out/calibrated" --data "$out/history" \
  --failures "$out/no-failures.csv" --json "$out/calibrate.json" --apply > "$out/calibrate.log" 2>&1; then
  cat "$out/calibrate.log"
  echo "calibrate failed on the 4-GPU history: retrying on an import at --gpus-per-node 8" | tee "$out/calibrate-8.note"
  "$bin/faultcast" import-prometheus --export "$out/export.json" --failures "$out/no-failures.csv" \
    --gpus-per-node 8 --out "$out/imported-8" > "$out/import-8.log" 2>&1
  "$bin/python" bench/slice_days.py "$out/imported-8" "$out/history-8" --from-day 0 --to-day 2
  "$bin/faultcast" calibrate --model "$out/calibrated" --data "$out/history-8" \
    --failures "$out/no-failures.csv" --json "$out/calibrate.json" --apply > "$out/calibrate.log" 2>&1
else
  rm -f "$out/calibrate-8.note"
fi
cat "$out/calibrate.log"
for copy in calibrated trained; do
  "$bin/faultcast" score --model "$out/$copy" --data "$out/after" --csv "$out/alerts-$copy.csv" 2>&1 \
    | tee "$out/score-$copy.log"
done
# evaluate on a fleet without failures: recall has nothing to count, false alarms still do.
set +e
"$bin/faultcast" evaluate --model "$out/calibrated" --data "$out/after" --json "$out/evaluation.json" \
  > "$out/evaluate.log" 2>&1
echo "evaluate exit status: $?" >> "$out/evaluate.log"
set -e
cat "$out/evaluate.log"
# What the silence is worth: the model's risk on this telemetry against the same fleet's full twin
# telemetry (days 0-2, after the 6 h warm-up), and recall on the same fleet at acceleration 100, exported
# the same way (no frozen exporters) and imported with the twin's failure log, at the calibrated threshold.
"$bin/python" bench/slice_days.py "$out/twin" "$out/twin-history" --from-day 0 --to-day 2
"$bin/python" - "$out/trained" "$out/history" "$out/twin-history" <<'PY' 2>&1 | grep -v Warning | tee "$out/risk.log"
import sys
from pathlib import Path

import numpy as np

from faultcast.model.artifact import load
from faultcast.model.training.calibrate import opening_levels, score_history
from faultcast.model.features.offline import open_dataset

model = load(Path(sys.argv[1]))
for data in sys.argv[2:]:
    period = score_history(open_dataset(Path(data)), model).period
    risk, present = period.scores["model"], period.present
    seen = risk[present & ~np.isnan(risk)]
    top = opening_levels(risk, present, model.policy.k).max()
    q50, q99, q999 = np.quantile(seen, [0.5, 0.99, 0.999])
    print(f"risk on {data}: median {q50:.3g}, p99 {q99:.3g}, p99.9 {q999:.3g}, max {seen.max():.6g}; "
          f"highest level an alert could open at (k={model.policy.k}): {top:.6g}")
PY
[ -f "$out/failing-twin/manifest.json" ] || "$bin/faultcast" simulate --world-seed 21 --seed 21 --nodes 12 \
  --gpus-per-node 4 --days 6 --acceleration 100 --h100-fraction 0 --out "$out/failing-twin" > "$out/failing-twin.log"
cat "$out/failing-twin.log"
"$bin/python" bench/dcgm_export.py "$out/failing-twin" "$out/failing-export.json" --step 600
"$bin/faultcast" import-prometheus --export "$out/failing-export.json" --failures "$out/failing-twin/failures.csv" \
  --out "$out/failing-imported" > "$out/failing-import.log" 2>&1
"$bin/faultcast" evaluate --model "$out/calibrated" --data "$out/failing-imported" \
  --json "$out/failing-evaluation.json" 2>&1 | grep -v Warning | tee "$out/failing-evaluate.log"
for copy in calibrated trained; do
  echo "$copy: $(tail -n +2 "$out/alerts-$copy.csv" | wc -l) alerts on days 2-6 (4 days x 48 GPUs)"
done | tee "$out/summary.txt"
