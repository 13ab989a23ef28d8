#!/usr/bin/env bash
# Reproduce the shipped model (model/shipped_model/, docs/model.md "The shipped model"): bench/scale.sh's
# recipe at its published size (64 twin worlds, the last 8 validating, early stopping over 4 folds, 2
# processes), then its content digest beside the shipped one; exit 1 when they differ. An hour or more
# on 2 cores: the 64 worlds' simulation (kept under out/scale, reused by a rerun), the training, and the
# evaluation on worlds 901-904 that scale.sh runs after it (OUT/evaluation.json, the model card's figures).
# The rows cache is OUT/rows, never out/scale-rows: rows thinned from a cache of higher rates are another
# sample (model/training/rows_cache.py), so a reproduction starts from an empty one.
#   bash bench/shipped_model.sh [OUT]    (default out/shipped-reproduction)
set -euo pipefail
out=${1:-out/shipped-reproduction}
WORLDS=64 VALIDATE=8 FOLDS=4 JOBS=2 CEILINGS="" BOOST="" bash bench/scale.sh "$out" --rows-cache "$out/rows"
.venv/bin/faultcast model-digest "$out/model" --check
