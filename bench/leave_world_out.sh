#!/usr/bin/env bash
# The leave-world-out evaluation behind the README's model table: the model of bench/model_run.sh
# (trained on the median world), scored on worlds it never saw, with false alarms measured on an
# unseen world at acceleration 1 (recall needs accelerated failures; false alarms must not).
#   bash bench/leave_world_out.sh [MODEL_DIR] [OUT_DIR]      (data under OUT_DIR is reused when present)
set -euo pipefail
model=${1:-out/model-run/model}
out=${2:-out/leave-world-out}
mkdir -p "$out"
bin=.venv/bin
sim() {  # NAME FLAGS...: one dataset, generated once
  local name=$1; shift
  [ -f "$out/$name/manifest.json" ] || "$bin/faultcast" simulate "$@" --out "$out/$name" | tee "$out/$name.log"
}
# A world drawn from the priors (seed 11), and the independent family, both at 100x for recall.
sim world11 --world-seed 11 --seed 2 --nodes 24 --days 14 --acceleration 100
sim independent --family independent --seed 3 --nodes 24 --days 14 --acceleration 100
# False alarms: the same unseen world at the real failure rate.
sim world11-calm --world-seed 11 --seed 4 --nodes 32 --days 14 --acceleration 1
/usr/bin/time -v "$bin/faultcast" evaluate --model "$model" --data "$out/world11" --data "$out/independent" \
  --false-alarm-data "$out/world11-calm" --json "$out/evaluation.json" 2> "$out/evaluate.time" | tee "$out/evaluate.log"
printf 'evaluate: wall %s, peak RSS %s KiB\n' \
  "$(grep 'Elapsed (wall clock)' "$out/evaluate.time" | awk '{print $NF}')" \
  "$(grep 'Maximum resident set size' "$out/evaluate.time" | awk '{print $NF}')"
