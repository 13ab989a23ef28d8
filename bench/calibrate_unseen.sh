#!/usr/bin/env bash
# Issue 19's second target: a fleet unlike any training world (the independent family), calibrated on
# two unlabelled days of its own history, then judged on the following days: false alarms at
# acceleration 1 on days 2-7 of the same fleet, recall on its accelerated twin (bench/worlds.sh's
# evaluation data, the same seed) at the calibrated threshold.
#   bash bench/calibrate_unseen.sh MODEL_DIR [OUT_DIR]
set -euo pipefail
model=${1:?a trained model directory}
out=${2:-out/calibrate-unseen}
bin=.venv/bin
mkdir -p "$out"
[ -f "$out/calm/manifest.json" ] || "$bin/faultcast" simulate --family independent --seed 3 --nodes 32 --days 7 \
  --acceleration 1 --out "$out/calm" > "$out/calm.log"
[ -f out/lwo/independent/manifest.json ] || "$bin/faultcast" simulate --family independent --seed 3 --nodes 24 \
  --days 14 --acceleration 100 --out out/lwo/independent > out/lwo/independent.log
"$bin/python" bench/slice_days.py "$out/calm" "$out/history" --from-day 0 --to-day 2
"$bin/python" bench/slice_days.py "$out/calm" "$out/after" --from-day 2 --to-day 7
rm -rf "$out/model" && cp -r "$model" "$out/model" && rm -f "$out/model/threshold.json"
head -1 "$out/history/failures.csv" > "$out/no-failures.csv"  # unlabelled: every incident counts as false
"$bin/faultcast" calibrate --model "$out/model" --data "$out/history" --failures "$out/no-failures.csv" \
  --budget 2 --json "$out/calibrate.json" --apply | tee "$out/calibrate.log"
/usr/bin/time -v "$bin/faultcast" evaluate --model "$out/model" --data out/lwo/independent \
  --false-alarm-data "$out/after" --resamples 500 --json "$out/evaluation.json" 2> "$out/evaluate.time" \
  | tee "$out/evaluate.log"
