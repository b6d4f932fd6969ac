#!/usr/bin/env bash
# Regenerates every example output in docs/planning.md (virtual time: the box's load does not change them) into
# OUT, one file per example: the command line, its whole output, `exit N`. docs/planning.md's example blocks are
# rendered from benchmarks/results/2026-11-26-planning-examples/ by benchmarks/render_docs.py.
# Usage, from the repo root (manifest.py writes manifest.json with the command, commit, machine and packages):
#   python3 benchmarks/manifest.py record --out OUT --stdout '' -- bash benchmarks/planning_examples.sh OUT
# (OUT = benchmarks/results/<date>-planning-examples; until 2026-11-26 this script lived there as run.sh)
set -uo pipefail
D=${1:?usage: bash benchmarks/planning_examples.sh OUT_DIR}
mkdir -p "$D"
# `python -m` imports this checkout's orchestrator (the console script would import whichever checkout the editable
# venv was installed from: another one in a git worktree sharing it)
P=".venv/bin/python -m orchestrator"
# The checkout's absolute path is cut from the output (the venv's ShareGPT copy is then named .venv/lib/...), so a
# raw file reads the same whichever checkout recorded it.
HERE=$(printf '%s/' "$PWD" | sed 's/[][\\.*^$|]/\\&/g')
run() {
  local name=$1; shift
  echo "\$ pd-orchestrator $*" > "$D/$name.txt"
  $P "$@" 2>&1 | sed "s|$HERE||g" >> "$D/$name.txt"
  echo "exit ${PIPESTATUS[0]}" >> "$D/$name.txt"
}
run fp8-h100-1p1d plan --config configs/default.yaml --set model.quantization=fp8
run default-search plan --config configs/default.yaml --search --show 8
run h100-fp8-agg-search plan --config configs/h100-agg-tp16.yaml --search --show 8
run h200-fp8-search plan --config configs/h200-1p1d-tp8.yaml --search --show 8
run h200-w4a8-search plan --config configs/h200-1p1d-tp8.yaml --set model.quantization=w4a8 --search --show 8
run compare-presets compare --configs configs/h100-1p1d-tp8.yaml configs/h100-agg-tp16.yaml configs/h100-2p1d-tp4.yaml configs/h200-1p1d-tp8.yaml configs/h200-agg-tp16.yaml configs/h200-agg-2xtp8.yaml configs/h200-1p1d-tp4-tp8.yaml configs/h200-2p1d-tp4.yaml
run h200-2p1d-tp4-fp8 plan --config configs/h200-2p1d-tp4.yaml --set model.quantization=fp8
run h200-real-weights-cold plan --config configs/h200-1p1d-tp8.yaml --set engine.sglang.load_format=null --disk-gb-s 2 --jit-cold
run v2lite-agg-tp2-eager plan --config configs/device-h200x2-local-agg-tp2.yaml --synthetic --set benchmark.dataset_path=null
