#!/bin/bash
# The full 94-layer Qwen3-235B-A22B FP8 at the organisers' decode-worker shape (issue 25, lease 14): ONE `calibrate single`
# server over four GPUs of one host (TP 4 x EP 4, dummy weights), the plan
# benchmarks/calibration/plans/lease14-qwen3-tp4-ep4.json (their decode flags: mem 0.90, --max-running-requests 256,
# context 8192, chunked prefill 8192; decode graphs to 256; prefill of one, two and four 4,000-token prompts; the graphed
# decode grid at batch 1..64 x context 4,096 and 256, each point twice). Model: models/qwen3-235b-a22b-fp8-l6/config.json
# with num_hidden_layers = LAYERS (default 94) and max_window_layers the same, so the layer is the 6/12-layer probes' own.
# Usage: qwen3_tp4_probe.sh [--dry-run]   (settings are environment variables: BUDGET, LAYERS, PROBE_GPUS, PLAN, TAG)
# TAG names the server and its raw file (default lease14; lease 16's FA3 / Triton / fusion arms: lease16-fa3, ...).
# HEADS=Q/KV gives the model Q query and KV key-value heads (default the published 64/4): 32/2 at TP 2 puts on each GPU
# the 16 query heads and one KV head a GPU has at the organisers' TP 4 (lease 16's two-GPU arms).
# The sglang tree travels as four 11.8 MB parts (.device/lease14/site.tar.xz.part00..03, `split -n 4 -d` of
# site-slim/site.tar.xz), one per call beside the ~48 MB tracked tree; this script stages a carried part with
# site_lib.sh and exits 0 while a part is still missing, then measures in the call that carries the last one:
#   run(kind="nvidia-h100-x4", carry=[".device/lease14/site.tar.xz.part00"], timeout_s=90, command="set -o pipefail;
#       export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0; BUDGET=560 bash scripts/device/qwen3_tp4_probe.sh 2>&1 | tee $OUT/main-stage.log")
#   ... part01, part02 the same; then
#   run(carry=[".device/lease14/site.tar.xz.part03"], timeout_s=600, command="set -o pipefail;
#       export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0; BUDGET=560 bash scripts/device/qwen3_tp4_probe.sh 2>&1 | tee $OUT/main-probe.log")
# Back in $OUT (at most 8 files): manifest.json, calibration-q3l94-tp4ep4-lease14.json (pdo-calibration-raw/1, copied
# every 10 s, so a call cut off keeps what was measured), server.log (the server's log, copied every 10 s),
# qwen3-tp4-probe.tar.xz (logs, env.txt, nvidia-smi topology), the caller's tee'd log. Read by
# benchmarks/lease14_tp4_step.py read. `--dry-run` checks the settings and prints the server's flags and points.
set -u
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
DRY=0
die() { echo "qwen3_tp4_probe.sh: $*" >&2; exit 2; }
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$arg'; use --dry-run or --help (settings are environment variables)" ;;
  esac
done
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-560}; LAYERS=${LAYERS:-94}; GPUS=${PROBE_GPUS:-0,1,2,3}; PORT=${PORT:-31000}; HEADS=${HEADS:-64/4}
PLAN=${PLAN:-benchmarks/calibration/plans/lease14-qwen3-tp4-ep4.json}
BASE=models/qwen3-235b-a22b-fp8-l6/config.json; CONTEXT=8192; PACK_S=20; MIN_BUDGET=150
case $BUDGET in ''|*[!0-9]*) die "BUDGET='$BUDGET': whole seconds, e.g. BUDGET=560 (one device call: <= 600 minus packing)";; esac
[ "$BUDGET" -ge $MIN_BUDGET ] || die "BUDGET=$BUDGET: a cold 94-layer start over four GPUs is priced at ~250 s (lease 12's 6-layer cold start took 162 s on one H100); give >= $MIN_BUDGET (a later count on warm caches: lease 12 had a 12-layer count ready in 59 s)"
case $HEADS in [1-9]*/[1-9]*) ;; *) die "HEADS='$HEADS': query/KV heads, e.g. HEADS=32/2";; esac
case ${HEADS%/*}${HEADS#*/} in *[!0-9]*) die "HEADS='$HEADS': query/KV heads, e.g. HEADS=32/2";; esac
[ $(( ${HEADS%/*} % ${HEADS#*/} )) = 0 ] || die "HEADS=$HEADS: the query heads must be a multiple of the KV heads"
case $LAYERS in ''|*[!0-9]*) die "LAYERS='$LAYERS': a whole number of layers, e.g. LAYERS=94";; esac
[ "$LAYERS" -ge 1 ] && [ "$LAYERS" -le 94 ] || die "LAYERS=$LAYERS: 1..94 (Qwen3-235B-A22B has 94)"
case $GPUS in *[!0-9,]*|''|,*|*,|*,,*) die "PROBE_GPUS='$GPUS': GPU indexes separated by commas, e.g. PROBE_GPUS=0,1,2,3";; esac
NGPU=$(echo "$GPUS" | tr ',' '\n' | wc -l)
[ -f "$PLAN" ] || die "PLAN=$PLAN: no such plan file"
TP=$($PY -c "import json,sys; f=json.load(open(sys.argv[1]))[0]['flags']; print(f[f.index('--tp-size')+1] if '--tp-size' in f else 1)" "$PLAN") \
  || die "PLAN=$PLAN: not a calibration plan (a JSON list of variants with flags)"
[ "$TP" = "$NGPU" ] || die "PROBE_GPUS=$GPUS: $NGPU GPUs for a plan at --tp-size $TP; give $TP GPU indexes"
TAG=${TAG:-lease14}
case $TAG in ''|*[!A-Za-z0-9-]*) die "TAG='$TAG': letters, digits and '-' only (it names the raw file), e.g. TAG=lease16-fa3";; esac
NAME=q3l$LAYERS-tp${TP}ep$TP-$TAG
OUT=${OUT:-/tmp/qwen3_tp4_probe_out}; W=${WORK_DIR:-/root/qwen3-tp4-probe}

write_model() {  # $1 = model dir: the probes' Qwen3 layer at LAYERS layers
  mkdir -p "$1" && $PY - "$BASE" "$LAYERS" "$1/config.json" "$HEADS" <<'PYEOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["num_hidden_layers"] = cfg["max_window_layers"] = int(sys.argv[2])
cfg["num_attention_heads"], cfg["num_key_value_heads"] = (int(x) for x in sys.argv[4].split("/"))
json.dump(cfg, open(sys.argv[3], "w"), indent=1)
PYEOF
}
single_args() {  # $1 = seconds, $2 = work dir
  echo -m orchestrator.calibrate single --model-path "$2/model" --name "$NAME" --out "$2/run" --budget-s "$1" \
    --plan-json "$PLAN" --port "$PORT" --context-length $CONTEXT
}
if [ $DRY = 1 ]; then
  D=$(mktemp -d); trap 'rm -rf $D' EXIT
  echo "qwen3_tp4_probe.sh dry run: $LAYERS layers on GPUs $GPUS (TP $TP), BUDGET=$BUDGET s, server $NAME, results in \$OUT (work dir $W)"
  write_model $D/model || exit 1
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); print('model:', c['architectures'][0], c['num_hidden_layers'], 'layers,', c['num_experts'], 'experts, top', c['num_experts_per_tok'], 'heads', c['num_attention_heads'], '/', c['num_key_value_heads'])" $D/model/config.json
  $PY $(single_args $((BUDGET - PACK_S)) $D) --dry-run
  exit $?
fi

REPO=$(pwd); START=$(date +%s)
mkdir -p "$OUT"
$PY benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|HEADS|LAYERS|PLAN|PROBE_GPUS|PORT|SITE_PARTS|SITE_SPLIT_DIR|TAG)=' | sort | tr '\n' ' ')bash scripts/device/qwen3_tp4_probe.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
el() { echo "[tp4 t+$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
SITE=${SITE_DIR:-/root/site}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export PYTHONPATH=$SITE:$REPO CUDA_VISIBLE_DEVICES=$GPUS PDO_CALIB_ALLOW_CACHE_WIPE=0
export SITE_PARTS=${SITE_PARTS:-4} SITE_SPLIT_DIR=${SITE_SPLIT_DIR:-.device/lease14}
. scripts/device/site_lib.sh
if [ ! -f $SITE/.installed_site ]; then
  el "unpack sglang tree ($SITE_PARTS parts from $SITE_SPLIT_DIR)"; unpack_site $SITE; rc=$?
  [ $rc = 3 ] && { nvidia-smi -L > $OUT/gpus-at-stage.txt 2>&1; exit 0; }   # a part staged; the next call carries the next
  [ $rc = 0 ] || { el "no sglang tree in $SITE and none carried (see the header)"; exit 1; }
fi
rm -rf $W; mkdir -p $W
{ date -u; nvidia-smi; nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,memory.total,memory.used,clocks.max.sm --format=csv
  $PY -c "import torch, sglang; print('torch', torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count()); print('sglang', sglang.__version__)"
  echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nproc; free -g; du -sh /root/.triton /root/.cache 2>/dev/null; } > $W/env.txt 2>&1
el "env: $(grep -m1 -E '^torch ' $W/env.txt)"
write_model $W/model || { el "model config not written"; exit 1; }
( while sleep 10; do cp $W/run/calibration-*.json $OUT/ 2>/dev/null; cp $W/run/server-*.log $OUT/server.log 2>/dev/null; done ) & COPIER=$!
secs=$(( $(left) - PACK_S ))
el "$NAME: $LAYERS layers on GPUs $GPUS, ${secs} s"
timeout -s INT -k 20 $((secs + 5)) $PY $(single_args $secs $W)
el "$NAME exit $?"
for pid in $(pgrep -f "sglang.launch_server .*--port $PORT( |$)"); do   # a server of ours left up by a cut harness
  el "reap: server $pid still up"; kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
done
kill $COPIER 2>/dev/null; cp $W/run/calibration-*.json $OUT/ 2>/dev/null; cp $W/run/server-*.log $OUT/server.log 2>/dev/null
tar -C $W --exclude='calibration-*.json' -cJf $OUT/qwen3-tp4-probe.tar.xz . && el "packed $(du -h $OUT/qwen3-tp4-probe.tar.xz | cut -f1)"
ls -la $OUT
el "done"
