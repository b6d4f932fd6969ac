#!/bin/bash
# Issue 25, lease 7 ("O7"; pre-registered in benchmarks/results/2026-11-27-lease7-predicted/): profile the in-run eager
# decode step (batch above the 256 captured graphs) with py-spy beside lone servers on the same GPU of one host.
# Phases:
#   stage   copy the carried pieces .device/lease7/blob.part* to /root/stage7 (several calls of one warm lease: the
#           sglang tree, the runtime, py-spy's and httptools' wheels do not fit one call beside the tree)
#   agg     A: the aggregated TP 1 V2-Lite row through the product (configs/device-h200x2-local-agg-tp2.yaml, tp 1,
#           mem 0.65, graphs to 256, --decode-log-interval 10, 1000 ShareGPT prompts), its scheduler profiled by
#           eager_pyspy.py at its first eager decode line (dump, 10 s `record --native --threads --idle -r 100`,
#           dumps); then B on a lone aggregated TP 1 server on the same GPU (serve_direct.py, same flags):
#           B1 eager_lone.py alone at 300 / 450 / 600 (330-token prompts, 64 out), B1p one profiled round of 600
#           with 256 out, B5 the same 1000 ShareGPT prompts replayed straight to the server (replay.py, all at
#           once, non-streaming: requests finish every step), profiled at its first eager line
#   pd      the lease-4/5 PD row through the product (decode GPU 1 at 0.65), the decode scheduler profiled the same way
# A 1 Hz CPU sampler (cpu_sampler.py) runs through agg and pd. Knobs: BUDGET (s, default 575), PROFILE_B_RESERVE_S
# (s kept from A for B, default 215), PROFILE_B1_BATCHES (B1's rounds, default 300,450,600; empty skips them), BLOB_SHA256 (checked on the assembled pieces), DRY_RUN=1 (print the commands).
# Returns in $OUT: agg-inrun.tar.xz / pd-inrun.tar.xz (bench run, engine logs, scrapes, pyspy/), lone-tp1.tar.xz
# (server log, lone.json, lone-prof.json, b5.json, pyspy-b1/, pyspy-b5/), cpu-<phase>.jsonl.xz, host.txt,
# pyspy-check.txt, manifest.json.
set -u
PHASE=${1:?usage: eager_profile.sh stage|agg|pd}
case $PHASE in stage|agg|pd) ;; *) echo "eager_profile.sh: unknown phase '$PHASE' (stage|agg|pd)" >&2; exit 2 ;; esac
STAGE7=${STAGE7:-/root/stage7}
if [ $PHASE = stage ]; then   # no sglang, no GPU needed: stage what this call carried
  mkdir -p $STAGE7; n=0
  for f in .device/lease7/blob.part*; do [ -f "$f" ] && cp "$f" $STAGE7/ && n=$((n + 1)); done
  echo "staged $n piece(s); $STAGE7 holds: $(ls $STAGE7 | tr '\n' ' ')"; [ $n -gt 0 ] || exit 1; exit 0
fi
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) GPU_TYPE=H200 ;;
  *H100*) GPU_TYPE=H100-SXM ;;
  *) GPU_TYPE="" ;;
esac
BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE}"
# a one-GPU machine (lease 7's second call): each raylet advertises the one GPU, the server gets GPU 0
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" = 1 ] && BENCH_SETS="$BENCH_SETS --set cluster.gpus_per_node=1"
B1_BATCHES=${PROFILE_B1_BATCHES-300,450,600}   # empty: no B1 rounds (B1p then warms its own bucket up)
PD_CFG=configs/device-h200x2-local-1p1d.yaml; AGG_CFG=configs/device-h200x2-local-agg-tp2.yaml; ROUTER_GPUS="0 1"
LOGARGS='[--sampling-backend,pytorch,--log-level,info,--decode-log-interval,"10"]'   # the configs' flags + interval 10
A_SETS="--set layout.aggregated.0.tp=1 --set layout.aggregated.0.mem_fraction_static=0.65 --set engine.sglang.extra_args=$LOGARGS"
PD_SETS="--set layout.decode.0.mem_fraction_static=0.65 --set engine.sglang.extra_args=$LOGARGS"
ENGINE_LOGS='/tmp/pdo-ray-*/*/session_*/logs/pd-engines/*/*.log'
WATCH="scripts/device/eager_pyspy.py --record-s 10 --rate 100 --dumps 3"
if [ -n "${DRY_RUN:-}" ]; then   # the commands this call would run, nothing started
  echo "agg A:  bench_local $AGG_CFG \$P/agg-inrun $A_SETS (BENCH_SETS:$BENCH_SETS) + $WATCH --log-glob '$ENGINE_LOGS' --min-running 300"
  echo "agg B:  serve_direct.py start --config $AGG_CFG $A_SETS --role aggregated --gpu <A's GPU> --port 30300"
  echo "agg B1: eager_lone.py --batches 300,450,600 --variants alone"
  echo "agg B1p: $WATCH --log-glob \$D/lone.log --min-running 540 + eager_lone.py --batches 600 --variants alone --new-tokens 256 --no-warmup"
  echo "agg B5: replay.py dump --config $AGG_CFG $A_SETS; $WATCH --min-running 400 + replay.py run --concurrency 1000"
  echo "pd:     bench_local $PD_CFG \$P/pd-inrun $PD_SETS + $WATCH --log-glob '$ENGINE_LOGS' --gpu 1 --min-running 300"
  exit 0
fi
assemble() {  # the carried pieces (pieces_lib.sh), then py-spy in /root/pyspy
  assemble_pieces
  rm -rf /root/pyspy; python3 -m zipfile -e $PIECES_DIR/py_spy-*.whl /root/pyspy; PYSPY=$(ls /root/pyspy/py_spy-*.data/scripts/py-spy)
  chmod +x $PYSPY
}
. scripts/device/pieces_lib.sh  # assemble_pieces
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local (shared with bench_two_gpu.sh)
write_manifest "$@"
assemble
install_runtime
{ $PYSPY --version; python3 -c "import time; time.sleep(30)" & local_pid=$!; sleep 1
  $PYSPY dump --native --pid $local_pid; echo "dump rc $?"; kill $local_pid; } > $OUT/pyspy-check.txt 2>&1
el "py-spy: $(head -1 $OUT/pyspy-check.txt), $(grep 'dump rc' $OUT/pyspy-check.txt)"

SAMPLER=""
{ date -u; nproc; lscpu; echo "== SMT siblings"; grep . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list;
  nvidia-smi -L; nvidia-smi topo -m; free -g; uname -a; } > $OUT/host.txt 2>&1
rm -f $P/cpu-$PHASE.jsonl; python3 scripts/device/cpu_sampler.py --out $P/cpu-$PHASE.jsonl & SAMPLER=$!
inrun() {  # $1 = config, $2 = name, $3 = watcher's extra args, rest = --set args: a product run with its scheduler profiled
  local cfg=$1 name=$2 wargs=$3; shift 3
  rm -rf $P/$name-pyspy
  python3 $WATCH --pyspy $PYSPY --log-glob "$ENGINE_LOGS" --out $P/$name-pyspy --min-running 300 $wargs \
    --timeout-s $(( $(left) - ${LEG_RESERVE_S:-0} - 30 )) > $P/$name-watch.txt 2>&1 & local watcher=$!
  bench_local $cfg $P/$name "$@"
  kill $watcher 2>/dev/null; wait $watcher 2>/dev/null
  cp -a $P/$name-pyspy $P/$name/pyspy; cp $P/$name-watch.txt $P/$name/; cat $P/$name-watch.txt
  pack $name
}
lone_b() {  # B on a lone aggregated TP 1 server on GPU $1
  local D=$P/lone-tp1 spid; rm -rf $D; mkdir -p $D
  el "lone server on GPU $1"
  python3 scripts/device/serve_direct.py start --config $AGG_CFG $SETS $A_SETS --role aggregated --gpu $1 --port 30300 \
    --name lone --state-dir $D || { el "lone server did not start"; return 1; }
  if python3 scripts/device/serve_direct.py wait --state-dir $D lone --timeout-s $(( $(left) - 120 )); then
    spid=$(python3 -c "import json; print(json.load(open('$D/lone.json'))['pid'])")
    [ -z "$B1_BATCHES" ] || { el "B1: $B1_BATCHES alone"
      timeout $(( $(left) - 100 )) python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log $D/lone.log \
        --server-pid $spid --out $D/lone-b1.json --batches $B1_BATCHES --variants alone 2>&1 | tail -6; }
    el "B1p: one profiled round of 600 x 256 out"
    python3 $WATCH --pyspy $PYSPY --log-glob $D/lone.log --server-pid $spid --out $D/pyspy-b1 --min-running 540 \
      --timeout-s 60 > $D/watch-b1.txt 2>&1 & local w1=$!
    timeout $(( $(left) - 75 )) python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log $D/lone.log \
      --server-pid $spid --out $D/lone-prof.json --batches 600 --variants alone --new-tokens 256 ${B1_BATCHES:+--no-warmup} 2>&1 | tail -3
    wait $w1; cat $D/watch-b1.txt
    el "B5: the 1000 ShareGPT prompts straight to the server, all at once"
    python3 scripts/device/replay.py dump --config $AGG_CFG $SETS $A_SETS --out $D/batch.json 2>&1 | tail -2
    python3 $WATCH --pyspy $PYSPY --log-glob $D/lone.log --server-pid $spid --out $D/pyspy-b5 --min-running 400 \
      --timeout-s 90 > $D/watch-b5.txt 2>&1 & local w5=$!
    timeout $(( $(left) - 35 )) python3 scripts/device/replay.py run --batch $D/batch.json --url http://127.0.0.1:30300 \
      --concurrency 1000 --out $D/b5.json 2>&1 | tail -8
    el "B5 exit ${PIPESTATUS[0]}"
    kill $w5 2>/dev/null; wait $w5 2>/dev/null; cat $D/watch-b5.txt
    curl -s -m 5 http://127.0.0.1:30300/metrics -o $D/lone.prom
    curl -s -m 5 http://127.0.0.1:30300/server_info -o $D/lone.server_info.json
  else el "lone server not ready: $(tail -5 $D/lone.log)"; fi
  python3 scripts/device/serve_direct.py stop --state-dir $D lone
  pack lone-tp1
}

el "cluster.gpu=${GPU_TYPE:-unknown (not set)}"
case $PHASE in
agg) LEG_RESERVE_S=${PROFILE_B_RESERVE_S:-215} inrun $AGG_CFG agg-inrun "" $A_SETS
     GPU_A=$(python3 -c "import json; m=json.load(open('$P/agg-inrun-pyspy/meta.json')); print(m['gpu_of_pids'][str(m['scheduler_pid'])])" 2>/dev/null || echo 0)
     lone_b ${GPU_A:-0} ;;
pd)  inrun $PD_CFG pd-inrun "--gpu 1" $PD_SETS ;;
esac
kill -TERM $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null
xz -T2 -c $P/cpu-$PHASE.jsonl > $OUT/cpu-$PHASE.jsonl.xz; ls -la $OUT
el "done"
