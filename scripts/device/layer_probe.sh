#!/bin/bash
# R1-shaped layer-count probe (issue 25, lease 8): the same graphed decode grid at several layer counts on ONE GPU of
# one host, so a step's fixed time splits into a per-step and a per-layer part (docs/fidelity.md, "Fixed costs traced":
# one layer count cannot separate them). Usage: layer_probe.sh [--dry-run] LAYERS [LAYERS ...]   (e.g. 4 6 5 3)
# Each count is benchmarks/calibration/r1-shaped/config.json (R1's layer, FP8 block, dummy weights) with
# num_hidden_layers = LAYERS and first_k_dense_replace kept at 3, so every count above 3 adds MoE layers only, as R1's
# 61 (3 dense + 58 MoE) do; 3 is dense-only. One `calibrate single` server per count, in the order given (the first
# pays the cold compile; put the count you need most first), each with the 6-layer profiles' flags
# (--trust-remote-code --triton-attention-split-tile-size 256, SGLang's defaults otherwise) and the plan
# benchmarks/calibration/plans/lease8-layer-grid.json (decode batch 1..256 at 256-token prompts, context 256 / 2,048 /
# 8,192 at batch 16, each point 3 times in a row). A count is skipped when less than its plan's min_left_s is left.
# One device call on GPU 0 (PROBE_GPU) after the sglang site parts (this script stages a carried part with
# site_lib.sh and exits 0 while the other part is still missing, as qwen3_probe.sh does):
#   run(kind="nvidia-h100-x1", carry=[".device/site-split/site.tar.xz.part00"], timeout_s=120, command="set -o pipefail;
#       export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0; PROBE_TAG=lease8 BUDGET=560 bash scripts/device/layer_probe.sh 4 6 5 3 2>&1 | tee $OUT/main-stage.log")
#   run(carry=[".device/site-split/site.tar.xz.part01"], timeout_s=600, command="set -o pipefail;
#       export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0; PROBE_TAG=lease8 BUDGET=560 bash scripts/device/layer_probe.sh 4 6 5 3 2>&1 | tee $OUT/main-probe.log")
# Back in $OUT (at most 8 files): manifest.json, calibration-r1s<L>-<PROBE_TAG>.json per count (pdo-calibration-raw/1,
# copied every 10 s, so a call cut off keeps what was measured), layer-probe.tar.xz (server logs, env.txt), the
# caller's tee'd log. Then: python -m orchestrator.perfmodel.from_raw <raw> --raw-dir <folder> --out <profile>.
# SHAPE=qwen3 (lease 11): the same per count with models/qwen3-235b-a22b-fp8-l6/config.json (Qwen3-235B-A22B's layer,
# every layer MoE), servers q3l<L>-<PROBE_TAG>, the plan benchmarks/calibration/plans/lease11-qwen3-layer-grid.json (its own
# flags: the lone Qwen3 grid's), counts 1..20 (a Qwen3 FP8 layer is ~2.5 GB); read by benchmarks/qwen3_layer_count.py.
# PROBE_TAG (required, letters and digits, e.g. PROBE_TAG=lease13): the lease that runs the probe; each server and raw
# file is named <TAG><L>-<PROBE_TAG> (lease 8's were r1s<L>-lease8, leases 11 and 12's q3l<L>-lease11).
# `--dry-run` checks the arguments and settings and prints each server's name, flags and points (no GPU, nothing started).
set -u
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
DRY=0; LAYERS=()
die() { echo "layer_probe.sh: $*" >&2; exit 2; }
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown argument '$arg'; use --dry-run, --help or layer counts (e.g. 4 6)" ;;
    *[!0-9]*|'') die "layer count '$arg': a whole number of layers, e.g. 4" ;;
    *) LAYERS+=("$arg") ;;
  esac
done
[ ${#LAYERS[@]} -ge 1 ] || die "no layer count given; e.g. layer_probe.sh 4 6 (the first pays the cold compile)"
SHAPE=${SHAPE:-r1}
case $SHAPE in
  r1) BASE=benchmarks/calibration/r1-shaped/config.json; TAG=r1s; DENSE=3; MAXL=13
      DEFAULT_PLAN=benchmarks/calibration/plans/lease8-layer-grid.json; MIN_BUDGET=240
      COLD="R1-shaped start alone took 196 s (2026-11-24)"
      FLAGS="--flag=--trust-remote-code --flag=--triton-attention-split-tile-size --flag=256"
      LIMIT="1..13 fit one H200 (R1 FP8 MoE layer ~10.7 GiB; 14 ran out of memory loading; H100: <= 6)" ;;
  qwen3) BASE=models/qwen3-235b-a22b-fp8-l6/config.json; TAG=q3l; DENSE=0; MAXL=20
      DEFAULT_PLAN=benchmarks/calibration/plans/lease11-qwen3-layer-grid.json; MIN_BUDGET=150; FLAGS=""
      COLD="Qwen3-shaped start with graphs took 65 s (lease 3)"
      LIMIT="1..20 fit one H100 (Qwen3 FP8 layer ~2.5 GB)" ;;
  *) die "SHAPE='$SHAPE': r1 (lease 8's R1-shaped layer) or qwen3 (Qwen3-235B-A22B's layer)" ;;
esac
case ${PROBE_TAG:-} in
  '') die "PROBE_TAG is not set: name the lease that runs the probe, e.g. PROBE_TAG=lease13 (servers and raw files carry it)" ;;
  *[!A-Za-z0-9]*) die "PROBE_TAG='$PROBE_TAG': letters and digits only, e.g. PROBE_TAG=lease13" ;;
esac
SUFFIX=$PROBE_TAG
# an R1 FP8 MoE layer is 10.7 GiB (lease 22's logs: 16.0 / 59.2 / 102.1 GiB of weights at 4 / 8 / 12 layers), and SGLang's
# dummy init holds an fp16 and an fp8 copy of each FP8 tensor while it fills it (21 GiB over the weights for a MoE layer's
# w13): 14 layers ran out of memory loading on an H200 (benchmarks/results/2026-11-28-capture-deep-read/); 13 (~134 GiB
# at that peak of 139.8) is untested
for n in "${LAYERS[@]}"; do
  [ "$n" -ge 1 ] && [ "$n" -le $MAXL ] || die "layer count $n: $LIMIT"
done
[ "$(printf '%s\n' "${LAYERS[@]}" | sort | uniq -d)" = "" ] || die "layer counts ${LAYERS[*]}: each count once"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-560}; GPU=${PROBE_GPU:-0}; PORT=${PORT:-31000}
PLAN=${PLAN:-$DEFAULT_PLAN}
case $BUDGET in ''|*[!0-9]*) die "BUDGET='$BUDGET': whole seconds, e.g. BUDGET=560 (one device call: <= 600 minus packing)";; esac
case $GPU in ''|*[!0-9]*) die "PROBE_GPU='$GPU': one GPU index, e.g. PROBE_GPU=0";; esac
[ "$BUDGET" -ge $MIN_BUDGET ] || die "BUDGET=$BUDGET: a cold $COLD on an H100; give >= $MIN_BUDGET"
[ -f "$PLAN" ] || die "PLAN=$PLAN: no such plan file"
PACK_S=15
OUT=${OUT:-/tmp/layer_probe_out}; W=${WORK_DIR:-/root/layer-probe}

write_model() {  # $1 = layers, $2 = model dir: the R1-shaped config at that layer count
  mkdir -p "$2" && $PY - "$BASE" "$1" "$2/config.json" <<'PYEOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["num_hidden_layers"] = int(sys.argv[2])
json.dump(cfg, open(sys.argv[3], "w"), indent=1)
PYEOF
}
write_plan() {  # $1 = cache state label (the first server cold, the rest warm), $2 = plan file
  $PY - "$PLAN" "$1" "$2" <<'PYEOF'
import json, sys
plan = json.load(open(sys.argv[1]))
for variant in plan:
    variant["cache_state"] = sys.argv[2]
json.dump(plan, open(sys.argv[3], "w"))
PYEOF
}
single_args() {  # $1 = layers, $2 = seconds, $3 = work dir
  echo -m orchestrator.calibrate single --model-path "$3/models/$TAG$1" --name "$TAG$1-$SUFFIX" --out "$3/$TAG$1" \
    --budget-s "$2" --plan-json "$3/plan-$TAG$1.json" --port "$PORT" $FLAGS
}
if [ $DRY = 1 ]; then
  D=$(mktemp -d); trap 'rm -rf $D' EXIT; state=cold; rc=0
  echo "layer_probe.sh dry run: layers ${LAYERS[*]} on GPU $GPU, BUDGET=$BUDGET s, results in \$OUT (work dir $W)"
  for n in "${LAYERS[@]}"; do
    write_model $n $D/models/$TAG$n && write_plan $state $D/plan-$TAG$n.json || rc=1
    moe=$(( n > DENSE ? n - DENSE : 0 )); echo "== $TAG$n-$SUFFIX: $n layers ($(( n < DENSE ? n : DENSE )) dense + $moe MoE), $state caches"
    $PY $(single_args $n $BUDGET $D) --dry-run || rc=1
    state=warm
  done
  exit $rc
fi

REPO=$(pwd); START=$(date +%s)
mkdir -p "$OUT"
$PY benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|PLAN|PROBE_GPU|PROBE_TAG|PORT|SHAPE)=' | sort | tr '\n' ' ')bash scripts/device/layer_probe.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
el() { echo "[layers t+$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
SITE=${SITE_DIR:-/root/site}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export PYTHONPATH=$SITE:$REPO CUDA_VISIBLE_DEVICES=$GPU PDO_CALIB_ALLOW_CACHE_WIPE=0
. scripts/device/site_lib.sh
if [ ! -f $SITE/.installed_site ]; then
  el "unpack sglang tree"; unpack_site $SITE; rc=$?
  [ $rc = 3 ] && exit 0   # a part staged; the next call carries the next one
  [ $rc = 0 ] || { el "no sglang tree in $SITE and none carried (see the header)"; exit 1; }
fi
rm -rf $W; mkdir -p $W
{ date -u; nvidia-smi; nvidia-smi --query-gpu=index,name,memory.total,memory.used,clocks.max.sm --format=csv
  $PY -c "import torch, sglang; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('sglang', sglang.__version__)"
  echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nproc; free -g; du -sh /root/.triton /root/.cache 2>/dev/null; } > $W/env.txt 2>&1
el "env: $(grep -m1 -E 'torch ' $W/env.txt)"
( while sleep 10; do cp $W/$TAG*/calibration-*.json $OUT/ 2>/dev/null; done ) & COPIER=$!
state=cold
for n in "${LAYERS[@]}"; do
  secs=$(( $(left) - PACK_S - 10 ))
  if [ $secs -lt 100 ]; then el "$TAG$n skipped: $secs s left (needs 100)"; continue; fi
  write_model $n $W/models/$TAG$n && write_plan $state $W/plan-$TAG$n.json || { el "$TAG$n: config not written"; continue; }
  el "$TAG$n: $n layers, $state caches, ${secs} s"
  timeout -s INT -k 20 $((secs + 5)) $PY $(single_args $n $secs $W)
  el "$TAG$n exit $?"
  for pid in $(pgrep -f "sglang.launch_server .*--port $PORT( |$)"); do   # a server of ours left up by a cut harness
    el "reap: server $pid still up"; kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
  done
  state=warm
done
kill $COPIER 2>/dev/null; cp $W/$TAG*/calibration-*.json $OUT/ 2>/dev/null
tar -C $W --exclude='calibration-*.json' -cJf $OUT/layer-probe.tar.xz . && el "packed $(du -h $OUT/layer-probe.tar.xz | cut -f1)"
ls -la $OUT
el "done"
