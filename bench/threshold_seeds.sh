#!/usr/bin/env bash
# The alert threshold's spread over training seeds (issue 19): bench/worlds.sh's training with the
# shipped settings (BOOSTER below), five booster seeds on the same sampled rows (--sample-seed 0, rows
# from --rows-cache), each threshold chosen on the validation world. Prints each seed's threshold, trees,
# validation false alarms and recall.
#   bash bench/threshold_seeds.sh [OUT_DIR] [SEEDS...]
set -euo pipefail
out=${1:-out/threshold-seeds}
shift $(( $# > 0 ? 1 : 0 ))
seeds=("${@:-0 1 2 3 4}")
BOOSTER=(--hard-negative-rate 0.25 --booster-param num_leaves=15 --booster-param min_data_in_leaf=200 --booster-param lambda_l2=10
  --booster-param feature_fraction=0.5)
mkdir -p "$out"
data=()
for s in 101 102 103 104 105 106 107 108; do data+=(--data "out/worlds/w$s"); done
for seed in ${seeds[*]}; do
  [ -f "$out/s$seed/manifest.json" ] || .venv/bin/faultcast train "${data[@]}" --seed "$seed" --sample-seed 0 \
    "${BOOSTER[@]}" \
    --rows-cache out/rows-cache --out "$out/s$seed" > "$out/s$seed.log" 2>&1
  tail -1 "$out/s$seed.log"
done
