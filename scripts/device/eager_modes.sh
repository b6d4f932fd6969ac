#!/bin/bash
# Issue 25, lease 10 (hgpu10; pre-registered in benchmarks/results/2026-11-27-lease10-predicted/): the mechanism of the
# bimodal eager decode step (lease 7: a fast mode x1.0-1.2 the model, a slow mode x1.6-2.0 lasting seconds, on lone
# servers too), and the opening burst straight to the server, streamed. No py-spy (it perturbs the step x4-10).
# Phases:
#   stage   copy the carried piece(s) $PIECES_GLOB (default .device/lease10/blob.part*) to $STAGE7 (one per call:
#           the sglang tree, the runtime and httptools' wheel do not fit one call beside the tree)
#   lone    assemble the pieces (BLOB_SHA256), install, the step probe (step_probe_patch.py) into the sglang tree;
#           beside it for the whole call: nvidia-smi clocks / power / temperature / throttle reasons every 100 ms,
#           a fixed-work vCPU probe at 10 Hz on the last CPU (vcpu_probe.py), the 1 Hz CPU sampler; one lone
#           aggregated TP 1 V2-Lite server on GPU 0 (lease 7's flags: mem 0.65, graphs to 256,
#           --decode-log-interval 10) with PDO_STEP_PROBE (one JSON line per scheduler step); then rounds of one
#           batch of 600 uniform 330-token prompts (eager_lone.py, greedy, ignore_eos), ROUNDS in order:
#             base    as started
#             pin     the scheduler's main thread pinned to PIN_CPU (taskset -p: that thread only)
#             unpin   its affinity back to every CPU
#             freeze  SGLang's own POST /freeze_gc (gc.freeze() in the scheduler, tokenizer and detokenizer), unpinned
#           then, with BURST=1, the run's 1000 ShareGPT prompts streamed straight to the server (replay.py --stream,
#           all at once) with `nstat` listen overflows / drops before and after
#   product the other half of the opening-burst check (docs/fidelity.md, "What holds the run's first token back"; not
#           run in lease 10): the aggregated TP 1 V2-Lite row through the product (lease 7's A: mem 0.65, graphs to
#           256) as shipped, then with benchmark.max_in_flight: 100, each with /proc/net/netstat before and after;
#           read each with benchmarks/run_start_timeline.py --archive
# Knobs: BUDGET (s, default 570), ROUNDS (default base,pin,unpin,freeze), NEW_TOKENS (per round, default 600),
# FIRST_NEW_TOKENS (the first round's, default 1024), PIN_CPU (default 2), PROBE_CPU (default: the last CPU), BURST
# (default 1), BURST_RESERVE_S (s the rounds leave for the burst, default 110), PRODUCT_LEGS (product's legs in order,
# default shipped,inflight100), BLOB_SHA256, DRY_RUN=1.
# Returns in $OUT: lone10.tar.xz (server log, steps.jsonl, gpu.csv, vcpu.jsonl, rounds' JSON, burst JSON, nstat,
# pinning), cpu-lone.jsonl.xz, host.txt, manifest.json; product: burst-shipped.tar.xz, burst-inflight100.tar.xz.
set -u
PHASE=${1:?usage: eager_modes.sh stage|lone|product}
case $PHASE in stage|lone|product) ;; *) echo "eager_modes.sh: unknown phase '$PHASE' (stage|lone|product)" >&2; exit 2 ;; esac
export STAGE7=${STAGE7:-/root/stage10} PIECES_GLOB=${PIECES_GLOB:-.device/lease10/blob.part*}
if [ $PHASE = stage ]; then
  mkdir -p $STAGE7; n=0
  for f in $PIECES_GLOB; do [ -f "$f" ] && cp "$f" $STAGE7/ && n=$((n + 1)); done
  echo "staged $n piece(s); $STAGE7 holds: $(ls $STAGE7 | tr '\n' ' ')"; [ $n -gt 0 ] || exit 1; exit 0
fi
ROUNDS=${ROUNDS:-base,pin,unpin,freeze}; NEW_TOKENS=${NEW_TOKENS:-600}; FIRST_NEW_TOKENS=${FIRST_NEW_TOKENS:-1024}
PIN_CPU=${PIN_CPU:-2}; BURST=${BURST:-1}; BURST_RESERVE_S=${BURST_RESERVE_S:-110}
for r in ${ROUNDS//,/ }; do case $r in base|pin|unpin|freeze) ;; *)
  echo "eager_modes.sh: ROUNDS: unknown round '$r' (base, pin, unpin, freeze)" >&2; exit 2 ;; esac; done
PRODUCT_LEGS=${PRODUCT_LEGS:-shipped,inflight100}
for leg in ${PRODUCT_LEGS//,/ }; do case $leg in shipped|inflight100) ;; *)
  echo "eager_modes.sh: PRODUCT_LEGS: unknown leg '$leg' (shipped, inflight100)" >&2; exit 2 ;; esac; done
AGG_CFG=configs/device-h200x2-local-agg-tp2.yaml
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in   # as eager_profile.sh
  *H200*) GPU_TYPE=H200 ;; *H100*) GPU_TYPE=H100-SXM ;; *) GPU_TYPE="" ;;
esac
BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE} --set cluster.gpus_per_node=1"
LOGARGS='[--sampling-backend,pytorch,--log-level,info,--decode-log-interval,"10"]'   # lease 7's A/B flags
A_SETS="--set layout.aggregated.0.tp=1 --set layout.aggregated.0.mem_fraction_static=0.65 --set engine.sglang.extra_args=$LOGARGS"
if [ -n "${DRY_RUN:-}" ] && [ $PHASE = product ]; then
  for leg in ${PRODUCT_LEGS//,/ }; do
    [ $leg = shipped ] && echo "product: bench_local $AGG_CFG \$P/burst-shipped $A_SETS (BENCH_SETS:$BENCH_SETS)"
    [ $leg = inflight100 ] && echo "product: bench_local $AGG_CFG \$P/burst-inflight100 $A_SETS --set benchmark.max_in_flight=100"
  done
  exit 0
fi
if [ -n "${DRY_RUN:-}" ]; then
  echo "lone:   serve_direct.py start --config $AGG_CFG $A_SETS --role aggregated --gpu 0 --port 30300 (PDO_STEP_PROBE)"
  echo "rounds: $ROUNDS: eager_lone.py --batches 600 --variants alone --new-tokens $FIRST_NEW_TOKENS, then $NEW_TOKENS; pin -> CPU $PIN_CPU"
  [ "$BURST" = 1 ] && echo "burst:  replay.py run --stream --concurrency 1000 (nstat TcpExtListenOverflows TcpExtListenDrops)"
  exit 0
fi
. scripts/device/pieces_lib.sh  # assemble_pieces
. scripts/device/bench_lib.sh   # set-up, installs, el/left/pack
write_manifest "$@"
assemble_pieces
install_runtime
python3 scripts/device/step_probe_patch.py $SITE || { el "step probe patch failed"; exit 1; }
if [ $PHASE = product ]; then   # no step probe here: PDO_STEP_PROBE stays unset, the patch is inert
  for leg in ${PRODUCT_LEGS//,/ }; do
    sets=""; [ $leg = inflight100 ] && sets="--set benchmark.max_in_flight=100"
    cat /proc/net/netstat > $P/netstat-$leg-before.txt
    reserve=0; [ $leg = shipped ] && [[ ,$PRODUCT_LEGS, == *,inflight100,* ]] && reserve=${PRODUCT_B_RESERVE_S:-200}
    LEG_RESERVE_S=$reserve bench_local $AGG_CFG $P/burst-$leg $A_SETS $sets
    cat /proc/net/netstat > $P/burst-$leg/netstat-after.txt; mv $P/netstat-$leg-before.txt $P/burst-$leg/netstat-before.txt
    pack burst-$leg
  done
  el "done"; exit 0
fi
NCPU=$(nproc); PROBE_CPU=${PROBE_CPU:-$((NCPU - 1))}
{ date -u; nproc; lscpu; echo "== numactl -H"; numactl -H 2>&1; echo "== SMT siblings";
  grep . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list; nvidia-smi -L; nvidia-smi topo -m;
  nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE; free -g; uname -a; cat /proc/cmdline; } > $OUT/host.txt 2>&1
D=$P/lone10; rm -rf $D; mkdir -p $D
BG=""
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu,pstate \
  --format=csv -lms 100 > $D/gpu.csv 2>&1 & BG="$BG $!"
python3 scripts/device/vcpu_probe.py --cpu $PROBE_CPU --out $D/vcpu.jsonl & BG="$BG $!"
python3 scripts/device/cpu_sampler.py --out $D/cpu.jsonl & BG="$BG $!"
export PDO_STEP_PROBE=$D/steps.jsonl
el "lone server on GPU 0 (step probe -> $PDO_STEP_PROBE)"
python3 scripts/device/serve_direct.py start --config $AGG_CFG $SETS $A_SETS --role aggregated --gpu 0 --port 30300 \
  --name lone --state-dir $D || { el "lone server did not start"; }
note() { echo "{\"t\": $(date +%s.%N), \"event\": \"$1\"}" >> $D/events.jsonl; el "$1"; }
if python3 scripts/device/serve_direct.py wait --state-dir $D lone --timeout-s $(( $(left) - 150 )); then
  spid=$(python3 -c "import json; print(json.load(open('$D/lone.json'))['pid'])")
  sched=$(python3 -c "
import sys; sys.path.insert(0, 'scripts/device')
from eager_lone import scheduler_pid; print(scheduler_pid($spid)[0])")
  note "server ready; scheduler pid $sched (its main thread's tid), affinity $(taskset -p -c $sched 2>&1 | sed 's/.*: //')"
  k=0; warm=""
  for r in ${ROUNDS//,/ }; do
    new=$NEW_TOKENS; [ $k = 0 ] && new=$FIRST_NEW_TOKENS
    need=$(( new / 10 + 30 + (BURST == 1 ? BURST_RESERVE_S : 0) ))   # a slow-mode round: ~110 ms a step
    [ $(left) -gt $need ] || { note "round $k $r skipped: $(left) s left, needs $need"; k=$((k + 1)); continue; }
    case $r in
      pin)    note "pin: $(taskset -p -c $PIN_CPU $sched 2>&1 | tail -1)" ;;
      unpin)  note "unpin: $(taskset -p -c 0-$((NCPU - 1)) $sched 2>&1 | tail -1)" ;;
      freeze) note "unpin: $(taskset -p -c 0-$((NCPU - 1)) $sched 2>&1 | tail -1)"
              note "POST /freeze_gc: HTTP $(curl -s -o /dev/null -w '%{http_code}' -m 10 -X POST http://127.0.0.1:30300/freeze_gc)" ;;
    esac
    note "round $k $r begins: 600 x $new out"
    timeout $(( $(left) - 20 )) python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log $D/lone.log \
      --server-pid $spid --out $D/round$k-$r.json --batches 600 --variants alone --new-tokens $new $warm \
      --round-timeout-s $(( $(left) - 25 )) 2>&1 | tail -3
    note "round $k $r ends (exit ${PIPESTATUS[0]})"
    warm=--no-warmup; k=$((k + 1))
  done
  if [ "$BURST" = 1 ] && [ $(left) -gt 60 ]; then
    python3 scripts/device/replay.py dump --config $AGG_CFG $SETS $A_SETS --out $D/batch.json 2>&1 | tail -1
    { nstat -az TcpExtListenOverflows TcpExtListenDrops; cat /proc/net/netstat; } > $D/nstat-before.txt 2>&1
    note "burst: 1000 ShareGPT prompts streamed straight to the server, all at once"
    timeout $(( $(left) - 15 )) python3 scripts/device/replay.py run --batch $D/batch.json --url http://127.0.0.1:30300 \
      --concurrency 1000 --stream --out $D/burst.json 2>&1 | tail -4
    note "burst ends (exit ${PIPESTATUS[0]})"
    { nstat -az TcpExtListenOverflows TcpExtListenDrops; cat /proc/net/netstat; } > $D/nstat-after.txt 2>&1
  fi
  curl -s -m 5 http://127.0.0.1:30300/metrics -o $D/lone.prom
  curl -s -m 5 http://127.0.0.1:30300/server_info -o $D/lone.server_info.json
else el "lone server not ready: $(tail -5 $D/lone.log)"; fi
python3 scripts/device/serve_direct.py stop --state-dir $D lone
for b in $BG; do kill -TERM $b 2>/dev/null; done; wait $BG 2>/dev/null
xz -T2 -c $D/cpu.jsonl > $OUT/cpu-lone.jsonl.xz && rm -f $D/cpu.jsonl
pack lone10
el "done"
