#!/usr/bin/env bash
# Every file in this folder: the fit and check of the KV hand-off mechanism, then the planner's outputs before (main at
# the merge base, unpacked to a temporary folder) and after (this tree). Repo root; no GPU.
set -euo pipefail
OUT=benchmarks/results/2026-11-27-kv-mechanism
PY=$(pwd)/.venv/bin/python
BEFORE=$(git merge-base HEAD main)
echo "before: $(git rev-parse --short "$BEFORE")" > "$OUT/before-commit.txt"
$PY benchmarks/kv_mechanism.py fit > "$OUT/fit.txt"
$PY benchmarks/kv_mechanism.py check > "$OUT/check-in-sample.txt"
$PY benchmarks/kv_mechanism.py predict --model models/qwen3-235b-a22b-fp8-l6 --gpu H100-SXM --layers 6,12 \
    --page-sizes 1,16,64 --prompt-range 256,2048 --concurrency 96 > "$OUT/predict-qwen3-h100.txt"
$PY benchmarks/kv_mechanism.py predict --model models/qwen3-235b-a22b-fp8-l6 --gpu H200 --layers 6,12 \
    --page-sizes 1,16,64 --prompt-range 256,2048 --concurrency 96 > "$OUT/predict-qwen3-h200.txt"
plans() {  # $1: tree, $2: suffix
    (cd "$1" && $PY -m orchestrator plan --backtest > "$OLDPWD/$OUT/backtest-$2.txt" 2>&1
     $PY -m orchestrator plan --backtest --closed-loop > "$OLDPWD/$OUT/closed-loop-$2.txt" 2>&1
     $PY -m orchestrator plan --config configs/qwen3-pd-2026.yaml > "$OLDPWD/$OUT/plan-qwen3-pd-2026-$2.txt" 2>&1
     $PY -m orchestrator plan --config configs/h200-1p1d-tp8.yaml --search --top 10 > "$OLDPWD/$OUT/search-h200-1p1d-tp8-$2.txt" 2>&1
     $PY -m orchestrator plan --config configs/default.yaml --search --top 10 > "$OLDPWD/$OUT/search-default-$2.txt" 2>&1)
}
TMP=$(mktemp -d)
git archive "$BEFORE" | tar -x -C "$TMP"
ln -s "$(pwd)/.venv" "$TMP/.venv"
plans "$TMP" before
rm -rf "$TMP"
plans . after
