#!/bin/bash
# Issue 25 (/work/eager-analysis.md; pre-registered in benchmarks/results/2026-11-26-eager-inrun-predicted/): why
# eager decode steps inside full runs are slow on the lent two-H100 hosts. A 1 Hz CPU sampler
# (scripts/device/cpu_sampler.py: per-CPU /proc/stat with steal, per-thread CPU + last CPU, MHz, nvidia-smi pids;
# once lscpu and SMT siblings) runs through every phase of the call. Phases (one call runs `ab`):
#   a     in-run: the lease-4 PD row through the product (bench_two_gpu.sh pd: prefill GPU 0, decode GPU 1, decode
#         mem 0.65, graphs to 256, 1000 ShareGPT prompts) with SGLANG_LOG_GC=1 and --decode-log-interval 10 in both
#         engines
#   b     lone: one aggregated TP 1 V2-Lite server on GPU 1 with the same engine flags (mem 0.65, graphs to 256,
#         --decode-log-interval 10), started outside Ray by serve_direct.py; scripts/device/eager_lone.py sends
#         batch 300 / 450 / 600 (330-token random prompts, 64 new tokens, greedy, ignore_eos) alone, streaming,
#         with EAGER_SPINNERS busy-loop processes, and with the scheduler pinned (B1-B4)
#   ab    a then b;   tp2  one aggregated TP 2 server over both GPUs (mem 0.80, graphs to 256, lease 4's product
#         row's server), non-streaming, batch 300 and 600 (the analysis' item 2);   site  stage/unpack the sglang tree
# Knobs: BUDGET (s, default 570), EAGER_B_RESERVE_S (s kept from a for b, default 230), EAGER_SPINNERS (default 6,
# as pre-registered), EAGER_BATCHES (default 300,450,600), DRY_RUN=1 (print the commands, start nothing).
# Call (after the site parts, scripts/device/README.md):
#   run(kind="nvidia-h100-x2", carry=[".device/rt/runtime.tar.xz"], timeout_s=600, command="set -o pipefail;
#       export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0; BUDGET=575 bash scripts/device/eager_inrun.sh ab 2>&1 | tee $OUT/main-eager.log")
# Returns in $OUT: pd-inrun.tar.xz (bench run, engine logs, /metrics scrapes), lone-tp1.tar.xz (server log,
# lone.json), cpu-<phase>.jsonl.xz, host.txt (lscpu, siblings, nproc, nvidia-smi topo), manifest.json.
set -u
PHASE=${1:?usage: eager_inrun.sh a|b|ab|tp2|site}
case $PHASE in a|b|ab|tp2|site) ;; *) echo "eager_inrun.sh: unknown phase '$PHASE' (a|b|ab|tp2|site)" >&2; exit 2 ;; esac
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) GPU_TYPE=H200 ;;
  *H100*) GPU_TYPE=H100-SXM ;;
  *) GPU_TYPE="" ;;
esac
BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE}"
PD_CFG=configs/device-h200x2-local-1p1d.yaml; AGG_CFG=configs/device-h200x2-local-agg-tp2.yaml; ROUTER_GPUS="0 1"
LOGARGS='[--sampling-backend,pytorch,--log-level,info,--decode-log-interval,"10"]'   # the configs' flags + interval 10
INRUN_SETS="--set layout.decode.0.mem_fraction_static=0.65 --set engine.sglang.env.SGLANG_LOG_GC=\"1\" --set engine.sglang.extra_args=$LOGARGS"
LONE_SETS="--set layout.aggregated.0.tp=1 --set layout.aggregated.0.mem_fraction_static=0.65 --set engine.sglang.extra_args=$LOGARGS"
TP2_SETS="--set layout.aggregated.0.mem_fraction_static=0.80 --set engine.sglang.extra_args=$LOGARGS"
SPINNERS=${EAGER_SPINNERS:-6}; BATCHES=${EAGER_BATCHES:-300,450,600}
if [ -n "${DRY_RUN:-}" ]; then   # the commands this call would run, nothing started
  echo "a:   bench_local $PD_CFG \$P/pd-inrun $INRUN_SETS (BENCH_SETS:$BENCH_SETS)"
  echo "b:   serve_direct.py start --config $AGG_CFG $LONE_SETS --role aggregated --gpu 1 --port 30300; eager_lone.py --batches $BATCHES --spinners $SPINNERS"
  echo "tp2: serve_direct.py start --config $AGG_CFG $TP2_SETS --role aggregated --gpu 0,1 --port 30300; eager_lone.py --batches 300,600 --variants alone"
  exit 0
fi
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local (shared with bench_two_gpu.sh)
write_manifest "$@"

SAMPLER=""
start_sampler() {
  { date -u; nproc; lscpu; echo "== SMT siblings"; grep . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list;
    nvidia-smi -L; nvidia-smi topo -m; free -g; uname -a; } > $OUT/host.txt 2>&1
  rm -f $P/cpu-$PHASE.jsonl; python3 scripts/device/cpu_sampler.py --out $P/cpu-$PHASE.jsonl & SAMPLER=$!
  el "cpu sampler pid $SAMPLER -> cpu-$PHASE.jsonl"
}
stop_sampler() {
  [ -n "$SAMPLER" ] && kill -TERM $SAMPLER 2>/dev/null && wait $SAMPLER 2>/dev/null
  xz -T2 -c $P/cpu-$PHASE.jsonl > $OUT/cpu-$PHASE.jsonl.xz; ls -la $OUT
}
lone() {  # $1 = name, $2 = GPUs, $3 = sets, $4 = eager_lone.py args: a lone server, the rounds, its log packed
  local D=$P/$1; rm -rf $D; mkdir -p $D
  el "lone server $1 on GPU $2"
  python3 scripts/device/serve_direct.py start --config $AGG_CFG $SETS $3 --role aggregated --gpu $2 --port 30300 \
    --name lone --state-dir $D || { el "lone server did not start"; return 1; }
  if python3 scripts/device/serve_direct.py wait --state-dir $D lone --timeout-s $(( $(left) - 60 )); then
    local spid; spid=$(python3 -c "import json; print(json.load(open('$D/lone.json'))['pid'])")
    el "rounds: $4"
    timeout $(( $(left) - 25 )) python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log $D/lone.log \
      --server-pid $spid --out $D/lone.json --deadline-s $(( $(left) - 60 )) $4 2>&1 | tail -30
    el "rounds exit ${PIPESTATUS[0]}"
    curl -s -m 5 http://127.0.0.1:30300/metrics -o $D/lone.prom
    curl -s -m 5 http://127.0.0.1:30300/server_info -o $D/lone.server_info.json
  else el "lone server not ready: $(tail -5 $D/lone.log)"; fi
  python3 scripts/device/serve_direct.py stop --state-dir $D lone
  pack $1
}

el "cluster.gpu=${GPU_TYPE:-unknown (not set)}"
case $PHASE in
site) install_site; exit 0 ;;
esac
install_runtime
start_sampler
case $PHASE in
a|ab) LEG_RESERVE_S=$([ $PHASE = ab ] && echo ${EAGER_B_RESERVE_S:-230} || echo 0) bench_local $PD_CFG $P/pd-inrun $INRUN_SETS
      pack pd-inrun ;;
esac
case $PHASE in
b|ab) lone lone-tp1 1 "$LONE_SETS" "--batches $BATCHES --spinners $SPINNERS" ;;
tp2)  lone lone-tp2 0,1 "$TP2_SETS" "--batches 300,600 --variants alone" ;;
esac
stop_sampler
el "done"
