#!/usr/bin/env bash
# What the step summaries do to recall and false alarms: the same worlds as
# bench/worlds.sh, drawn again with the twin that writes each step's summary (out/worlds-s, out/lwo-s),
# trained twice with bench/worlds.sh's chosen settings: with the 21 step-summary features, and with
# them excluded (`--exclude '*_step_*'`: the model of a collector that ships only the last scrape).
# Both are evaluated leave-world-out on world 11 (acceleration 100) with false alarms on world 11 at
# acceleration 1, the same seeds as bench/leave_world_out.sh.
#   bash bench/step_summaries.sh [OUT_DIR]    (data under out/worlds-s and out/lwo-s is reused)
set -euo pipefail
out=${1:-out/step-summaries}
bin=.venv/bin
mkdir -p "$out" out/worlds-s out/lwo-s
for s in 101 102 103 104 105 106 107 108; do
  [ -f "out/worlds-s/w$s/manifest.json" ] || "$bin/faultcast" simulate --world-seed "$s" --seed "$s" --nodes 16 \
    --days 10 --acceleration 100 --out "out/worlds-s/w$s" > "out/worlds-s/w$s.log"
done
[ -f out/lwo-s/world11/manifest.json ] || "$bin/faultcast" simulate --world-seed 11 --seed 2 --nodes 24 --days 14 \
  --acceleration 100 --out out/lwo-s/world11 > out/lwo-s/world11.log
[ -f out/lwo-s/world11-calm/manifest.json ] || "$bin/faultcast" simulate --world-seed 11 --seed 4 --nodes 32 \
  --days 14 --acceleration 1 --out out/lwo-s/world11-calm > out/lwo-s/world11-calm.log
# World 11 with its power-delivery failures ten times as frequent (world 11 itself has one with a
# precursor): where brakes of seconds, the step summaries' main signal, decide the recall.
[ -f out/lwo-s/world11-power.json ] || "$bin/python" - <<'PY'
import json
world = json.load(open("out/lwo-s/world11/manifest.json"))["world"]["parameters"]
world["mode_rate_scale"]["power"] = world["mode_rate_scale"].get("power", 1.0) * 10
json.dump({"parameters": world}, open("out/lwo-s/world11-power.json", "w"), indent=1)
PY
[ -f out/lwo-s/world11-power/manifest.json ] || "$bin/faultcast" simulate --world-file out/lwo-s/world11-power.json \
  --seed 5 --nodes 24 --days 14 --acceleration 100 --out out/lwo-s/world11-power > out/lwo-s/world11-power.log
data=()
for s in 101 102 103 104 105 106 107 108; do data+=(--data "out/worlds-s/w$s"); done
chosen=(--hard-negative-rate 0.25 --booster-param num_leaves=15 --booster-param min_data_in_leaf=200
  --booster-param lambda_l2=10 --booster-param feature_fraction=0.5 --rows-cache out/rows-cache-s)
for variant in with without; do
  flags=()
  mkdir -p "$out/$variant"
  [ "$variant" = without ] && flags=(--exclude '*_step_*')
  [ -f "$out/$variant/model/manifest.json" ] || "$bin/faultcast" train "${data[@]}" "${chosen[@]}" "${flags[@]}" \
    --out "$out/$variant/model" | tee "$out/$variant/train.log"
  [ -f "$out/$variant/evaluation.json" ] || "$bin/faultcast" evaluate --model "$out/$variant/model" \
    --data out/lwo-s/world11 --false-alarm-data out/lwo-s/world11-calm --resamples 500 \
    --json "$out/$variant/evaluation.json" | tee "$out/$variant/evaluate.log"
  [ -f "$out/$variant/evaluation-power.json" ] || "$bin/faultcast" evaluate --model "$out/$variant/model" \
    --data out/lwo-s/world11-power --resamples 500 \
    --json "$out/$variant/evaluation-power.json" | tee "$out/$variant/evaluate-power.log"
done
