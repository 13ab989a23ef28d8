#!/usr/bin/env bash
# The in-world reference of one evaluation world: the same recipe as bench/worlds.sh, trained
# on N other fleets drawn from that very world (its parameters, other seeds; the last validates), for
# `faultcast evaluate --reference DATA=MODEL`: its recall at the model's false alarms is the ceiling.
#   bash bench/ceiling.sh WORLD_SEED [OUT_DIR]          (fleets under OUT_DIR are reused)
# Environment (defaults: bench/worlds.sh's training worlds, 8 x 1,280 GPU-days):
#   FAMILY=twin|independent  FLEETS=8  NODES=16  DAYS=10  ACCELERATION=100  SEED_BASE=1000 (fleet seeds
#   SEED_BASE+1..SEED_BASE+FLEETS: keep them off the evaluated fleet's seed; evaluate refuses that fleet)
#   TRAIN_SEED=0  CHOSEN="..." (replaces bench/worlds.sh's chosen flags)  EXTRA="..." (more train flags)
#   EVAL_DATA=DIR MODEL=DIR: then also run the evaluation of MODEL on EVAL_DATA with this ceiling.
# The world of bench/worlds.sh's twin evaluation is `bash bench/ceiling.sh 11`; of its independent one,
# `FAMILY=independent bash bench/ceiling.sh 3` (that fleet's world is drawn from its --seed, 3).
set -euo pipefail
world=${1:?usage: bench/ceiling.sh WORLD_SEED [OUT_DIR]}
family=${FAMILY:-twin}
out=${2:-out/ceiling/$family-w$world}
fleets=${FLEETS:-8}
bin=${BIN:-.venv/bin}
# bench/worlds.sh's `chosen` flags: the settings chosen leave-world-out (keep the two in step).
worlds_chosen="--hard-negative-rate 0.25 --booster-param num_leaves=15 --booster-param min_data_in_leaf=200
  --booster-param lambda_l2=10 --booster-param feature_fraction=0.5"
chosen=${CHOSEN-$worlds_chosen}
case $family in
  twin) family_flags=() ;;
  independent) family_flags=(--family independent) ;;
  *) echo "bench/ceiling.sh: FAMILY is twin or independent, not $family" >&2; exit 2 ;;
esac
if (( fleets < 2 )); then echo "bench/ceiling.sh: FLEETS must be at least 2 (the last validates)" >&2; exit 2; fi
run() {  # print a command line, then run it
  echo "+ $*" >&2
  "$@"
}
mkdir -p "$out"
data=()
for (( i = 1; i <= fleets; i++ )); do
  seed=$(( ${SEED_BASE:-1000} + i ))
  fleet="$out/fleet$seed"
  [ -f "$fleet/manifest.json" ] || run "$bin/faultcast" simulate "${family_flags[@]}" --world-seed "$world" \
    --seed "$seed" --nodes "${NODES:-16}" --days "${DAYS:-10}" --acceleration "${ACCELERATION:-100}" \
    --out "$fleet" > "$fleet.log"
  data+=(--data "$fleet")
done
# shellcheck disable=SC2086  # the flag strings split into words on purpose
run "$bin/faultcast" train "${data[@]}" $chosen ${EXTRA:-} --seed "${TRAIN_SEED:-0}" --out "$out/model" \
  | tee "$out/train.log"
if [ -n "${EVAL_DATA:-}" ] && [ -n "${MODEL:-}" ]; then
  run "$bin/faultcast" evaluate --model "$MODEL" --data "$EVAL_DATA" --reference "$EVAL_DATA=$out/model" \
    --json "$out/evaluation.json" | tee "$out/evaluate.log"
else
  echo "the ceiling of a fleet of world $world ($family): faultcast evaluate --model MODEL --data DATA" \
    "--reference DATA=$out/model"
fi
