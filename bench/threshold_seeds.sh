#!/usr/bin/env bash
# The alert threshold's spread over training seeds: training with the shipped
# settings (BOOSTER below), five booster seeds on the same sampled rows (--sample-seed 0, rows from
# --rows-cache), each threshold chosen on the validation worlds (pooled). Prints each seed's threshold,
# trees, validation false alarms and recall, then the spread (highest / lowest threshold).
#   bash bench/threshold_seeds.sh [OUT_DIR] [SEEDS...]          worlds 101-108, one validating
#   WORLDS="$(seq 201 220)" VALIDATE=4 DATA=out/scale ROWS=out/scale-rows JOBS=2 \
#     bash bench/threshold_seeds.sh out/threshold-seeds-20       20 worlds, 4 validating
set -euo pipefail
out=${1:-out/threshold-seeds}
shift $(( $# > 0 ? 1 : 0 ))
seeds=("${@:-0 1 2 3 4}")
worlds=${WORLDS:-101 102 103 104 105 106 107 108}
validate=${VALIDATE:-1} dir=${DATA:-out/worlds} rows=${ROWS:-out/rows-cache} jobs=${JOBS:-1}
BOOSTER=(--hard-negative-rate 0.25 --booster-param num_leaves=15 --booster-param min_data_in_leaf=200 --booster-param lambda_l2=10
  --booster-param feature_fraction=0.5)
mkdir -p "$out"
data=()
for s in $worlds; do
  [ -f "$dir/w$s/manifest.json" ] || .venv/bin/faultcast simulate --world-seed "$s" --seed "$s" --nodes 16 \
    --days 10 --acceleration 100 --out "$dir/w$s" > "$dir/w$s.log"
  data+=(--data "$dir/w$s")
done
for seed in ${seeds[*]}; do
  [ -f "$out/s$seed/manifest.json" ] || .venv/bin/faultcast train "${data[@]}" --seed "$seed" --sample-seed 0 \
    "${BOOSTER[@]}" --validation-worlds "$validate" --jobs "$jobs" \
    --rows-cache "$rows" --out "$out/s$seed" > "$out/s$seed.log" 2>&1
  tail -1 "$out/s$seed.log"
done
.venv/bin/python - "$out" ${seeds[*]} <<'PY'
import json, sys
from pathlib import Path
out, seeds = Path(sys.argv[1]), sys.argv[2:]
thresholds = [json.loads((out / f"s{s}" / "manifest.json").read_text())["threshold"] for s in seeds]
print(f"thresholds {', '.join(f'{t:.4g}' for t in thresholds)}: spread {max(thresholds) / min(thresholds):.2f}-fold")
PY
