#!/bin/bash
# Qwen3-235B-A22B-shaped probe (issue 25): does dummy-weight routing collapse for Qwen3's softmax router, and what does a
# lone Qwen3-shaped decode step cost? ONE device call on GPU 0 of a machine whose sglang tree is already unpacked
# (SITE_DIR, default /root/site, where calibrate.sh / bench_lib.sh unpack it; a lease's earlier call did that):
#   run(kind="nvidia-h200-x2", carry=[], timeout_s=480,
#       command="set -o pipefail; export PDO_GIT_COMMIT=<git rev-parse HEAD> PDO_GIT_DIRTY=0; BUDGET=470 bash scripts/device/qwen3_probe.sh 2>&1 | tee $OUT/main-qwen3.log")
# (on a fresh machine carry the site parts first, one call each, as scripts/device/README.md says: this script stages
# them with site_lib.sh and exits 0 after a part while the other is still missing). No tokenizer is needed: every
# server runs --skip-tokenizer-init and is sent token ids (orchestrator/calibrate/server.py BASE_FLAGS).
# Model: models/qwen3-235b-a22b-fp8-l6 (Qwen3-235B-A22B's layer: 128 experts, top 8, FP8 block, 6 layers, dummy weights).
# Phases (PHASES, default all three, in this order; each bounded by its share of BUDGET, default 470 s):
#   count-dummy   eager server, every select_experts call traced: distinct experts (of 128) per MoE layer call at decode
#                 batch 1..512 (COUNT_BATCHES), dummy weights as loaded            (dummy_routing_probe.py, 120 s)
#   profile       graphs server, `calibrate single --plan-json benchmarks/calibration/plans/qwen3-decode-grid.json`:
#                 decode step at batch 1..256 x context 256 / 1,024 / 4,096, prefill 1 x {1k, 4k}, 4 x 1k (the rest)
#   count-random  count-dummy with every router gate randomised after the dummy load (real-like routing, 120 s)
# Back in $OUT (a call returns at most 8 files): manifest.json, routing.json (both counts, as they land),
# calibration-qwen3-l6.json (pdo-calibration-raw/1: the back-test's calibration points), qwen3-probe.tar.xz (server
# logs, traces, summaries, env.txt), plus the caller's tee'd log. Then: benchmarks/qwen3_routing_read.py reads them.
# `--dry-run` checks the settings and prints every phase's command and plan (no GPU, nothing started); `--help`.
set -u
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
DRY=0
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "qwen3_probe.sh: unknown argument '$arg'; use --dry-run or --help (settings are environment variables)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-470}; PHASES=${PHASES:-count-dummy,profile,count-random}
MODEL=${MODEL:-models/qwen3-235b-a22b-fp8-l6}; PLAN=${PLAN:-benchmarks/calibration/plans/qwen3-decode-grid.json}
COUNT_BATCHES=${COUNT_BATCHES:-1,2,4,8,16,32,64,128,256,512}
COUNT_PROMPT=${COUNT_PROMPT:-250}   # k prompts of 250 tokens prefill 250k tokens: never a power-of-two decode batch
COUNT_DUMMY_S=${COUNT_DUMMY_S:-120}; COUNT_RANDOM_S=${COUNT_RANDOM_S:-120}; PROFILE_MIN_S=150
PACK_S=15; SLACK_S=20   # packing at the end; what a phase may run past its budget (SIGINT, then its clean-up)
PORT=${PORT:-31000}; GPU=${QWEN3_GPU:-0}
die() { echo "qwen3_probe.sh: $*" >&2; exit 2; }
case $BUDGET in ''|*[!0-9]*) die "BUDGET='$BUDGET': whole seconds, e.g. BUDGET=470 (one device call: <= 600 minus the start)";; esac
case $GPU in ''|*[!0-9]*) die "QWEN3_GPU='$GPU': one GPU index, e.g. QWEN3_GPU=0";; esac
want() { case ",$PHASES," in *",$1,"*) return 0;; esac; return 1; }
for p in ${PHASES//,/ }; do
  case $p in count-dummy|profile|count-random) ;; *) die "PHASES: unknown phase '$p'; use a subset of count-dummy,profile,count-random";; esac
done
[ -f "$MODEL/config.json" ] || die "MODEL=$MODEL: no config.json there; give the Qwen3-shaped model folder"
[ -f "$PLAN" ] || die "PLAN=$PLAN: no such plan file"
NEED=$PACK_S
want count-dummy && NEED=$((NEED + COUNT_DUMMY_S + SLACK_S)); want count-random && NEED=$((NEED + COUNT_RANDOM_S + SLACK_S))
want profile && NEED=$((NEED + PROFILE_MIN_S + SLACK_S))
[ "$BUDGET" -ge "$NEED" ] || die "BUDGET=$BUDGET: the phases $PHASES need at least $NEED s (counts $COUNT_DUMMY_S + $COUNT_RANDOM_S, profile $PROFILE_MIN_S, packing $PACK_S, $SLACK_S per phase); raise BUDGET or drop a phase from PHASES"
PROFILE_S=$((BUDGET - NEED + PROFILE_MIN_S))

OUT=${OUT:-/tmp/qwen3_probe_out}; W=${WORK_DIR:-/root/qwen3-probe}
count_args() {  # $1 = variant, $2 = seconds, $3 = out dir
  echo scripts/device/dummy_routing_probe.py --model-path "$MODEL" --out "$3" --budget-s "$2" --variants "$1" \
    --count-batches "$COUNT_BATCHES" --count-prompt "$COUNT_PROMPT" --port "$PORT"
}
profile_args() {  # $1 = seconds, $2 = out dir
  echo -m orchestrator.calibrate single --model-path "$MODEL" --name qwen3-l6 --out "$2" --budget-s "$1" \
    --plan-json "$PLAN" --port "$PORT"
}
if [ $DRY = 1 ]; then
  echo "qwen3_probe.sh dry run: BUDGET=$BUDGET s on GPU $GPU, phases $PHASES, results in \$OUT (work dir $W)"
  rc=0
  want count-dummy && { echo "== count-dummy ($COUNT_DUMMY_S s)"; $PY $(count_args dummy-eager-count $COUNT_DUMMY_S $W/count-dummy) --dry-run || rc=1; }
  want profile && { echo "== profile ($PROFILE_S s)"; $PY $(profile_args $PROFILE_S $W/profile) --dry-run || rc=1; }
  want count-random && { echo "== count-random ($COUNT_RANDOM_S s)"; $PY $(count_args random-eager-count $COUNT_RANDOM_S $W/count-random) --dry-run || rc=1; }
  exit $rc
fi

REPO=$(pwd); START=$(date +%s)
mkdir -p "$OUT"; rm -rf $W; mkdir -p $W
$PY benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|PHASES|MODEL|PLAN|COUNT_[A-Z_]*|QWEN3_GPU|PORT)=' | sort | tr '\n' ' ')bash scripts/device/qwen3_probe.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
el() { echo "[qwen3 t+$(( $(date +%s) - START ))s] $*"; }
SITE=${SITE_DIR:-/root/site}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export PYTHONPATH=$SITE:$REPO CUDA_VISIBLE_DEVICES=$GPU
. scripts/device/site_lib.sh
if [ ! -f $SITE/.installed_site ]; then
  el "unpack sglang tree"; unpack_site $SITE; rc=$?
  [ $rc = 3 ] && exit 0   # a part staged; the next call carries the next one
  [ $rc = 0 ] || { el "no sglang tree in $SITE and none carried (see the header)"; exit 1; }
fi
{ date -u; nvidia-smi; nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
  $PY -c "import torch, sglang; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('sglang', sglang.__version__)"
  echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; du -sh /root/.triton /root/.cache 2>/dev/null; } > $W/env.txt 2>&1
el "env: $(grep -m1 -E 'torch ' $W/env.txt)"

routing_json() {  # both count summaries (as far as they exist) -> $OUT/routing.json
  $PY - "$W" "$OUT/routing.json" <<'PYEOF'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
merged = {"source": "scripts/device/qwen3_probe.sh (count-dummy/, count-random/ summary.json in qwen3-probe.tar.xz)"}
for phase in ("count-dummy", "count-random"):
    f = work / phase / "summary.json"
    if f.is_file():
        s = json.loads(f.read_text())
        merged.update({k: v for k, v in s.items() if k != "variants"})
        for name, v in s["variants"].items():
            merged[name] = v
out.write_text(json.dumps(merged, indent=1))
PYEOF
}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
reap() {  # a server of ours still up after its phase (a harness cut while stopping it): end its process group
  local pid
  for pid in $(pgrep -f "sglang.launch_server .*--port $PORT( |$)"); do
    el "reap: server $pid still up; SIGTERM to its process group"; kill -TERM -- -$pid 2>/dev/null
  done
  sleep 1; for pid in $(pgrep -f "sglang.launch_server .*--port $PORT( |$)"); do sleep 5; kill -KILL -- -$pid 2>/dev/null; done
}
run_phase() {  # $1 = name, $2 = seconds, rest = python args; each harness ends itself at its budget; SIGINT 10 s past
  local name=$1 secs=$2; shift 2   # it (a request hung), so a cut phase keeps its files; then nothing of it stays up
  el "$name: ${secs} s ($(left) s left)"
  timeout -s INT -k 8 $((secs + 10)) $PY "$@"
  el "$name exit $?"
  reap
}
if want count-dummy; then
  run_phase count-dummy $COUNT_DUMMY_S $(count_args dummy-eager-count $COUNT_DUMMY_S $W/count-dummy); routing_json
fi
if want profile; then
  secs=$(( $(left) - PACK_S - SLACK_S )); want count-random && secs=$((secs - COUNT_RANDOM_S - SLACK_S))
  ( while sleep 10; do cp $W/profile/calibration-qwen3-l6.json $OUT/ 2>/dev/null; done ) & COPIER=$!
  run_phase profile $secs $(profile_args $secs $W/profile)
  kill $COPIER 2>/dev/null; cp $W/profile/calibration-qwen3-l6.json $OUT/ 2>/dev/null || el "profile: no raw file"
fi
if want count-random; then
  secs=$(( $(left) - PACK_S - SLACK_S )); [ $secs -gt $COUNT_RANDOM_S ] && secs=$COUNT_RANDOM_S
  if [ $secs -ge 120 ]; then
    run_phase count-random $secs $(count_args random-eager-count $secs $W/count-random); routing_json
  else
    el "count-random skipped: $secs s left for it (needs 120)"
  fi
fi
tar -C $W -cJf $OUT/qwen3-probe.tar.xz . && el "packed $(du -h $OUT/qwen3-probe.tar.xz | cut -f1)"
ls -la $OUT
el "done"
