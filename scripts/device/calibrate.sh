#!/bin/bash
# Calibration calls on a lent single-GPU machine (nvidia-h100-x1 preferred), back to back in one warm lease.
# Built here first (git-ignored carry folder, never committed):
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_site_archive.sh .device/site   (sglang 0.5.17 + NIXL)
#   bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-slim/site.tar.xz   (59 -> 47 MB: the
#   tracked tree (~13 MB) + 59 MB no longer fit the 64 MiB carry; the default below is the slim one; scripts/device/README.md)
# Calls (each writes $OUT/main.log, $OUT/calibration-*.json, $OUT/logs-<phase>.tar.xz, $OUT/env-<phase>.txt):
#   run(kind="nvidia-h100-x1", carry=[".device/site-slim"], timeout_s=600,
#       command="set -o pipefail; bash scripts/device/calibrate.sh v2lite 2>&1 | tee $OUT/main.log")
#   run(carry=[".device/site-slim"], timeout_s=600, command="... calibrate.sh r1 ...")    # same lease: site kept
#   run(carry=[".device/site-slim"], timeout_s=600, command="... calibrate.sh pd ...")
# Phases:
#   v2lite  DeepSeek-V2-Lite shape (models/deepseek-v2-lite): cold start (compile caches wiped), prefill and
#           decode sweeps, warm start, knobs start (--mem-fraction-static 0.70, caps raised) + decode past the graphs
#   r1      R1-shaped (benchmarks/calibration/r1-shaped/config.json: R1 dims, FP8 block quant, 6 layers), same plan,
#           with --triton-attention-split-tile-size 256 (R1_FLAGS overrides; see the note at the r1 case)
#   twogpu  two GPUs (kind nvidia-h100-x2): the R1-shaped model under TP2, DP-attention 2 + EP2 and PP2 (step costs,
#           prefill one chunk vs k chunks: the PP bubble) and NCCL all-reduce / all-to-all / send times
#           (orchestrator/calibrate/twogpu.py; TWOGPU_LAYOUTS picks a subset when 600 s do not hold all three)
#   pd      one-GPU PD on the V2-Lite shape: page 1 (PAGE_SIZES), loads under each sender mode of the NIXL patch
#           (PD_MODES, default base,coalesce,shard,coalesce+shard), per-request KV timelines, top-k logprobs
#           across modes (PD_ARGS=--no-agg skips the aggregated reference). PD_MODEL=qwen3 takes the Qwen3-235B-A22B
#           FP8 layer instead (models/qwen3-235b-a22b-fp8-l6: GQA, 64 query / 4 KV heads, K and V buffers per layer) at
#           PD_LAYERS layers (default 6); DRY_RUN=1 prints the model and the harness command and starts nothing
# Compile caches: if .device/cache/caches.tar.xz exists (carry it), it is unpacked before the phase (a fresh
# machine then skips the ~70 s of kernel compiles); SAVE_CACHES=1 writes $OUT/caches.tar.xz after it.
# BUDGET (s, default 540) bounds the harness; everything it measured is saved as it goes. SITE_ARCHIVE picks another
# carried archive (e.g. .device/site-slim/site.tar.xz from slim_site_archive.sh, when the tree + 59 MB no longer fit).
set -u
PHASE=${1:?usage: calibrate.sh v2lite|r1|pd|twogpu}
REPO=$(pwd)
PD_MODEL=${PD_MODEL:-v2lite}; PD_LAYERS=${PD_LAYERS:-6}
case $PD_MODEL in
  v2lite) PD_CONFIG=models/deepseek-v2-lite/config.json ;;
  qwen3) PD_CONFIG=models/qwen3-235b-a22b-fp8-l6/config.json ;;
  *) echo "calibrate.sh: PD_MODEL='$PD_MODEL': use v2lite (DeepSeek-V2-Lite) or qwen3 (Qwen3-235B-A22B FP8 layer)" >&2; exit 2 ;;
esac
case $PD_LAYERS in ''|*[!0-9]*|0) echo "calibrate.sh: PD_LAYERS='$PD_LAYERS': a whole number of layers >= 1, e.g. PD_LAYERS=12" >&2; exit 2 ;; esac
write_pd_model() {  # $1 = model dir: PD_MODEL's config; qwen3 at PD_LAYERS layers
  mkdir -p "$1" && python3 - "$PD_CONFIG" "$PD_MODEL" "$PD_LAYERS" "$1/config.json" <<'PYEOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
if sys.argv[2] == "qwen3":
    cfg["num_hidden_layers"] = cfg["max_window_layers"] = int(sys.argv[3])
json.dump(cfg, open(sys.argv[4], "w"), indent=1)
PYEOF
}
pd_command() {  # $1 = model dir, $2 = out dir, $3 = seconds
  echo python3 -m orchestrator.calibrate pd --model-path $1 --out $2 --budget-s $3 \
    --page-sizes ${PAGE_SIZES:-1} --loads-per-mode ${PD_LOADS:-2} --modes ${PD_MODES:-base,coalesce,shard,coalesce+shard} \
    ${PD_ARGS:-}
}
if [ "${DRY_RUN:-0}" = 1 ]; then
  [ $PHASE = pd ] || { echo "calibrate.sh: DRY_RUN=1 is for the pd phase" >&2; exit 2; }
  D=$(mktemp -d); trap 'rm -rf $D' EXIT
  write_pd_model $D/model || exit 1
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print('model:', c['architectures'][0], c['num_hidden_layers'], 'layers, KV heads', c.get('num_key_value_heads'), ', kv_lora_rank', c.get('kv_lora_rank'))" $D/model/config.json
  echo "harness: $(pd_command '$W/models/pd' '$D' '<budget>')"
  exit 0
fi
OUT=${OUT:-/tmp/calib_out}; mkdir -p "$OUT"
# manifest.json: the command with the settings it read; pass PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0|1 in the run() command
# (the lent machine's copy has no .git). A second call into the same $OUT adds its command (--append).
python3 benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|TWOGPU_LAYOUTS|PD_[A-Z_]*|PAGE_SIZES|SINGLE_ARGS|R1_FLAGS|SITE_ARCHIVE|SITE_PARTS|SITE_SPLIT_DIR|SAVE_CACHES|BENCH_ARGS|AGG_CFG|PD_CFG)=' | sort | tr '\n' ' ')bash scripts/device/calibrate.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
SITE=${SITE_DIR:-/root/site}; W=${WORK_DIR:-/root/calib}; mkdir -p $W
START=$(date +%s); BUDGET=${BUDGET:-540}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export PYTHONPATH=$SITE:$REPO PDO_CALIB_ALLOW_CACHE_WIPE=${PDO_CALIB_ALLOW_CACHE_WIPE:-1}
el() { echo "[$PHASE t+$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

. scripts/device/site_lib.sh   # unpack_site: the whole archive, or its parts over several calls of one lease
if [ ! -f $SITE/.installed_site ]; then
  el "unpack sglang tree"; unpack_site $SITE; rc=$?
  [ $rc = 3 ] && exit 0   # a part staged; the next call carries the next one
  [ $rc = 0 ] || { el "unpack failed"; exit 1; }
fi
if [ -f .device/cache/caches.tar.xz ] && [ ! -f /root/.pdo_caches_restored ]; then
  tar -C / -xJf .device/cache/caches.tar.xz && touch /root/.pdo_caches_restored && el "compile caches restored"
fi
if [ ! -f $SITE/.nixl_patched_v8 ]; then
  python3 -m orchestrator.calibrate nixl-patch $SITE && touch $SITE/.nixl_patched_v8
fi
{ date -u; nvidia-smi; nvidia-smi topo -m; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  python3 -c "import sglang; print('sglang', sglang.__version__)"
  echo "compile caches:"; du -sh /root/.triton /root/.cache /tmp/torchinductor_root 2>/dev/null; free -g; nproc; } > $OUT/env-${PD_NAME:-$PHASE}.txt 2>&1
el "env: $(grep -m1 -E 'H100|H200' $OUT/env-${PD_NAME:-$PHASE}.txt)"

mkdir -p $W/models/v2lite $W/models/r1s
cp models/deepseek-v2-lite/config.json $W/models/v2lite/config.json
cp benchmarks/calibration/r1-shaped/config.json $W/models/r1s/config.json
NAME=${PD_NAME:-$PHASE}   # PD_NAME: a second pd run in the same call keeps its own files (e.g. PD_NAME=pd-nooverlap)
D=$W/$NAME; rm -rf $D; mkdir -p $D
case $PHASE in
v2lite)
  python3 -m orchestrator.calibrate single --model-path $W/models/v2lite --name v2lite --out $D --budget-s $(( $(left) - 25 )) \
    ${SINGLE_ARGS:-} ;;   # e.g. SINGLE_ARGS="--plan-json benchmarks/calibration/plans/v2lite-context.json --name v2lite-ctx" 
r1)   # SINGLE_ARGS as in v2lite, e.g. "--plan-json benchmarks/calibration/plans/r1-graph-padding.json --name r1s6-graphpad"
  # (batch 16 vs context with and without a captured graph of 16); the JSON reaches $OUT every 10 s and the harness
  # gets SIGINT at the budget, as in twogpu, so a call cut at its limit keeps what was measured
  ( while sleep 10; do cp $D/calibration-*.json $OUT/ 2>/dev/null; done ) & COPIER=$!
  timeout -s INT -k 30 $(( $(left) - 10 )) python3 -m orchestrator.calibrate single --model-path $W/models/r1s --name r1s6 \
    --out $D --budget-s $(( $(left) - 25 )) \
    --flag=--trust-remote-code ${R1_FLAGS:---flag=--triton-attention-split-tile-size --flag=256} ${SINGLE_ARGS:-}
  HRC=$?; kill $COPIER 2>/dev/null; (exit $HRC) ;;
  # (2026-11-24, H100: with pure defaults the Triton MLA backend's CUDA-graph buffer, max_bs 256 x 128 heads x
  #  256 KV splits x 512 x fp32 = 16 GiB, OOMs at start-up; a split tile of 256 caps the splits at 16384/256 = 64)
pd)
  write_pd_model $W/models/pd || { el "model config not written"; exit 1; }
  $(pd_command $W/models/pd $D $(( $(left) - 25 ))) ;;
twogpu)   # two GPUs of one node (nvidia-h100-x2 / nvidia-h200-x2; issue 29 runs it): TP2, DP-attention 2 + EP2, PP2
  # the raw JSON reaches $OUT every 10 s (a call cut at its limit still returns what was measured); the harness
  # gets SIGINT at the budget, so its finally blocks stop the server (it runs in its own session and would
  # otherwise hold the GPUs into the next call of the lease)
  ( while sleep 10; do cp $D/calibration-twogpu.json $D/collectives.json $OUT/ 2>/dev/null; done ) & COPIER=$!
  timeout -s INT -k 30 $(( $(left) - 10 )) python3 -m orchestrator.calibrate twogpu --model-path $W/models/r1s --out $D \
    --budget-s $(( $(left) - 25 )) --layouts ${TWOGPU_LAYOUTS:-tp2,dpattn2-ep2,pp2} --flag=--trust-remote-code \
    ${R1_FLAGS:---flag=--triton-attention-split-tile-size --flag=256}
  HRC=$?; kill $COPIER 2>/dev/null; (exit $HRC) ;;
*) el "unknown phase $PHASE"; exit 2 ;;
esac
el "harness exit $?"
du -sh /root/.triton /root/.cache /tmp/torchinductor_root 2>/dev/null | sed 's/^/caches after: /'
for f in $D/calibration-*.json; do [ -f "$f" ] && cp "$f" $OUT/$(basename "$f" .json | sed "s/^calibration-$PHASE\$/calibration-$NAME/").json; done
[ -f $D/collectives.json ] && cp $D/collectives.json $OUT/collectives.json   # twogpu
tar -C $W -cJf $OUT/logs-$NAME.tar.xz $NAME
if [ "${SAVE_CACHES:-0}" = 1 ]; then
  tar -C / -cJf $OUT/caches.tar.xz $(cd / && ls -d root/.triton root/.cache tmp/torchinductor_root 2>/dev/null) \
    && el "caches saved: $(du -h $OUT/caches.tar.xz | cut -f1)"
fi
ls -la $OUT
el "done"
