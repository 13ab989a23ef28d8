#!/usr/bin/env bash
# The held-out evaluation behind the README's model table and docs/benchmarks.md:
# a 1,024-GPU fleet twin over 30 days, trained and evaluated, with time and peak memory of each step.
#   bash bench/model_run.sh [OUT_DIR] [ACCELERATION]     (OUT_DIR/data is reused when present)
set -euo pipefail
out=${1:-out/model-run}
accel=${2:-50}
mkdir -p "$out"
bin=.venv/bin
if [ ! -f "$out/data/manifest.json" ]; then
  /usr/bin/time -v "$bin/faultcast" simulate --nodes 128 --gpus-per-node 8 --days 30 --interval 60s --seed 1 \
    --acceleration "$accel" --out "$out/data" 2> "$out/simulate.time" | tee "$out/simulate.log"
fi
/usr/bin/time -v "$bin/faultcast" train --data "$out/data" --out "$out/model" 2> "$out/train.time" | tee "$out/train.log"
/usr/bin/time -v "$bin/faultcast" evaluate --model "$out/model" --data "$out/data" --json "$out/evaluation.json" \
  2> "$out/evaluate.time" | tee "$out/evaluate.log"
for step in simulate train evaluate; do
  [ -f "$out/$step.time" ] || continue
  printf '%s: wall %s, peak RSS %s KiB\n' "$step" \
    "$(grep 'Elapsed (wall clock)' "$out/$step.time" | awk '{print $NF}')" \
    "$(grep 'Maximum resident set size' "$out/$step.time" | awk '{print $NF}')"
done
