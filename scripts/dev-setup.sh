#!/usr/bin/env bash
# Installs everything pd-orchestrator and its tests need on a fresh CPU machine into ./.venv
# (plus Debian's prometheus/promtool when run as root). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "note: prometheus/promtool not installed (needs root: apt-get install prometheus); their tests will skip" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# NIXL depends on an unpinned torch: install the CPU 2.13.0 wheel first so pip does not fetch CUDA builds.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
# setuptools' "Editable installation ... folders with the same name as your package" box is about this very layout
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/pip install -q -e ".[test,nixl,mlperf]" 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import orchestrator, ray, nixl_cu12" >/dev/null
# SGLang 0.5.17's own source (the wheel only, no dependencies, ~22 MB): the tests apply our SGLang patches
# (orchestrator/calibrate) to the real files, not only to modules shaped like them.
ls .whl-sglang/sglang-0.5.17-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps -d .whl-sglang \
  "sglang==0.5.17" 2>&1 | grep -v "^WARNING: Location" || true
echo "dev-setup: ok ($(.venv/bin/python -c 'import ray; print("ray", ray.__version__)'))"
