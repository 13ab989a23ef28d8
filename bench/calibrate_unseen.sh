#!/usr/bin/env bash
# A fleet unlike any training world (the
# independent family), calibrated on two unlabelled days of its own history, then judged on the following
# days: false alarms at acceleration 1 on days 2-7 of the same fleet, recall on its accelerated twin (the
# same world, 24 nodes x 14 days at acceleration 100) at the calibrated threshold.
#   SEED=3 BUDGET=2 bash bench/calibrate_unseen.sh MODEL_DIR [OUT_DIR]
# SEED: the independent fleet's seed, which also draws its world (3 is bench/worlds.sh's evaluation
# world; pick seeds no choice ever saw for a target figure). BUDGET: the false alarms per 1,000 GPU-days
# `faultcast calibrate` holds on the two days. When out/ceiling/independent-wSEED/model exists
# (`FAMILY=independent bash bench/ceiling.sh SEED`), the evaluation adds that in-world ceiling.
set -euo pipefail
model=${1:?a trained model directory}
seed=${SEED:-3}
suffix=$([ "$seed" = 3 ] || echo "-s$seed")  # seed 3 keeps the folders it always had
out=${2:-out/calibrate-unseen$suffix}
accelerated=out/lwo/independent$suffix
bin=.venv/bin
mkdir -p "$out" out/lwo
[ -f "$out/calm/manifest.json" ] || "$bin/faultcast" simulate --family independent --seed "$seed" --nodes 32 \
  --days 7 --acceleration 1 --out "$out/calm" > "$out/calm.log"
[ -f "$accelerated/manifest.json" ] || "$bin/faultcast" simulate --family independent --seed "$seed" --nodes 24 \
  --days 14 --acceleration 100 --out "$accelerated" > "$accelerated.log"
"$bin/python" bench/slice_days.py "$out/calm" "$out/history" --from-day 0 --to-day 2
"$bin/python" bench/slice_days.py "$out/calm" "$out/after" --from-day 2 --to-day 7
rm -rf "$out/model" && cp -r "$model" "$out/model" && rm -f "$out/model/threshold.json"
head -1 "$out/history/failures.csv" > "$out/no-failures.csv"  # unlabelled: every incident counts as false
"$bin/faultcast" calibrate --model "$out/model" --data "$out/history" --failures "$out/no-failures.csv" \
  --budget "${BUDGET:-2}" --json "$out/calibrate.json" --apply | tee "$out/calibrate.log"
reference=()
ceiling=out/ceiling/independent-w$seed/model
[ ! -f "$ceiling/manifest.json" ] || reference=(--reference "$accelerated=$ceiling")
/usr/bin/time -v "$bin/faultcast" evaluate --model "$out/model" --data "$accelerated" \
  --false-alarm-data "$out/after" "${reference[@]}" --resamples 500 --json "$out/evaluation.json" \
  2> "$out/evaluate.time" | tee "$out/evaluate.log"
