#!/bin/bash
# Issue 25 (heager; pre-registered in benchmarks/results/2026-11-28-eager-memfrac-predicted/): a same-host A/B of the
# eager decode step's in-run price against the decoding server's mem_fraction_static (hhost's post-hoc lead: the
# 0.85 rows ran x1.02-1.28 the model, the 0.80-and-below rows x1.36-1.71, confounded with the lease's date).
# Phases:
#   stage   copy the carried piece(s) $PIECES_GLOB (default .device/lease10/blob.part*) to $STAGE7 (eager_modes.sh's)
#   ab      assemble the pieces (BLOB_SHA256), install, the step probe (step_probe_patch.py) into the sglang tree;
#           nvidia-smi every 100 ms and the 1 Hz CPU sampler for the whole call; then ROUNDS in order (default A,B,A,B),
#           each on a FRESH lone aggregated TP 1 V2-Lite server on GPU 0 (lease 7/10's flags: graphs to 256,
#           --decode-log-interval 10; A = mem_fraction_static $MEM_A, B = $MEM_B) with PDO_STEP_PROBE, one batch of
#           600 uniform 330-token prompts (eager_lone.py, greedy, ignore_eos, NEW_TOKENS out), and launch_probe.py on
#           PROBE_CPU (a fixed loop + tiny CUDA launches at 10 Hz) from the server's ready to the round's end;
#           the server stopped and its GPU memory gone before the next round's server starts
# Knobs: BUDGET (s, default 585), ROUNDS (A/B letters, default A,B,A,B), MEM_A (0.85), MEM_B (0.65), NEW_TOKENS (160),
# PROBE_CPU (default: the last CPU), WARMUP_ROUNDS (comma list of round numbers whose server gets eager_lone's warm-up;
# default none: every round alike, the first read steps left out by the read), START_S (s a warm start is given when
# deciding whether a round fits, default 85; the first start gets 200), BLOB_SHA256, DRY_RUN=1.
# Returns in $OUT: memfrac.tar.xz (per round: server log, steps-r<k>.jsonl, launch-r<k>.jsonl, round JSON, server
# JSON; gpu.csv, events.jsonl, timeline), cpu.jsonl.xz, host.txt, manifest.json.
set -u
PHASE=${1:?usage: eager_memfrac.sh stage|ab}
case $PHASE in stage|ab) ;; *) echo "eager_memfrac.sh: unknown phase '$PHASE' (stage|ab)" >&2; exit 2 ;; esac
export STAGE7=${STAGE7:-/root/stage10} PIECES_GLOB=${PIECES_GLOB:-.device/lease10/blob.part*}
if [ $PHASE = stage ]; then exec bash scripts/device/eager_modes.sh stage; fi
ROUNDS=${ROUNDS:-A,B,A,B}; MEM_A=${MEM_A:-0.85}; MEM_B=${MEM_B:-0.65}; NEW_TOKENS=${NEW_TOKENS:-160}
WARMUP_ROUNDS=${WARMUP_ROUNDS:-}; START_S=${START_S:-85}
for r in ${ROUNDS//,/ }; do case $r in A|B) ;; *)
  echo "eager_memfrac.sh: ROUNDS: unknown arm '$r' (A = mem $MEM_A, B = mem $MEM_B; e.g. ROUNDS=A,B,A,B)" >&2; exit 2 ;; esac; done
for m in $MEM_A $MEM_B; do
  python3 -c "import sys; v = float(sys.argv[1]); sys.exit(0 if 0.3 <= v <= 0.95 else 1)" "$m" 2>/dev/null || {
    echo "eager_memfrac.sh: MEM_A / MEM_B: '$m' is not a fraction in 0.30-0.95 (e.g. MEM_A=0.85)" >&2; exit 2; }
done
AGG_CFG=configs/device-h200x2-local-agg-tp2.yaml
LOGARGS='[--sampling-backend,pytorch,--log-level,info,--decode-log-interval,"10"]'   # lease 7's A/B flags
arm_sets() {  # $1 = A|B -> the server's --set args (only the mem fraction differs)
  local mem=$MEM_A; [ "$1" = B ] && mem=$MEM_B
  echo "--set layout.aggregated.0.tp=1 --set layout.aggregated.0.mem_fraction_static=$mem --set engine.sglang.extra_args=$LOGARGS"
}
if [ -n "${DRY_RUN:-}" ]; then
  k=0
  for r in ${ROUNDS//,/ }; do
    echo "round $k $r: serve_direct.py start --config $AGG_CFG $(arm_sets $r) --role aggregated --gpu 0 --port 30300 (PDO_STEP_PROBE steps-r$k.jsonl)"
    echo "round $k $r: launch_probe.py --cpu \${PROBE_CPU:-last}; eager_lone.py --batches 600 --variants alone --new-tokens $NEW_TOKENS$([[ ,$WARMUP_ROUNDS, == *,$k,* ]] || echo ' --no-warmup'); stop"
    k=$((k + 1))
  done
  exit 0
fi
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in   # as eager_modes.sh
  *H200*) GPU_TYPE=H200 ;; *H100*) GPU_TYPE=H100-SXM ;; *) GPU_TYPE="" ;;
esac
BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE} --set cluster.gpus_per_node=1"
BUDGET=${BUDGET:-585}
. scripts/device/pieces_lib.sh  # assemble_pieces
. scripts/device/bench_lib.sh   # set-up, installs, el/left/pack
write_manifest "$@"
assemble_pieces
install_runtime
python3 scripts/device/step_probe_patch.py $SITE || { el "step probe patch failed"; exit 1; }
NCPU=$(nproc); PROBE_CPU=${PROBE_CPU:-$((NCPU - 1))}
{ date -u; nproc; lscpu; echo "== numactl -H"; numactl -H 2>&1; nvidia-smi -L;
  nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,TEMPERATURE,MEMORY; free -g; uname -a; } > $OUT/host.txt 2>&1
D=$P/memfrac; rm -rf $D; mkdir -p $D
BG=""
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu,memory.used \
  --format=csv -lms 100 > $D/gpu.csv 2>&1 & BG="$BG $!"
python3 scripts/device/cpu_sampler.py --out $D/cpu.jsonl & BG="$BG $!"
note() { echo "{\"t\": $(date +%s.%N), \"event\": \"$1\"}" >> $D/events.jsonl; el "$1"; }
gpu_free() {  # wait (bounded) until no process holds GPU 0's memory, so the next server sizes its pool on a clean card
  local i
  for i in $(seq 1 30); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && return 0; sleep 1
  done
  note "GPU still held after 30 s: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
}
k=0; cold=1
for r in ${ROUNDS//,/ }; do
  need=$(( (cold == 1 ? 200 : START_S) + NEW_TOKENS / 8 + 30 ))   # start + ~110 ms a slow step + prefill and stop
  if [ $(left) -lt $need ]; then note "round $k $r skipped: $(left) s left, needs $need"; k=$((k + 1)); continue; fi
  name=r$k; export PDO_STEP_PROBE=$D/steps-$name.jsonl
  note "round $k $r server start: mem_fraction_static $([ $r = A ] && echo $MEM_A || echo $MEM_B)"
  python3 scripts/device/serve_direct.py start --config $AGG_CFG $SETS $(arm_sets $r) --role aggregated --gpu 0 \
    --port 30300 --name $name --state-dir $D || note "round $k $r: server did not start"
  if python3 scripts/device/serve_direct.py wait --state-dir $D $name --timeout-s $(( $(left) - NEW_TOKENS / 8 - 25 )); then
    cold=0
    spid=$(python3 -c "import json; print(json.load(open('$D/$name.json'))['pid'])")
    sched=$(python3 -c "
import sys; sys.path.insert(0, 'scripts/device')
from eager_lone import scheduler_pid; print(scheduler_pid($spid)[0])")
    note "round $k $r server ready; scheduler $sched on CPU $(awk '{print $39}' /proc/$sched/stat 2>/dev/null), affinity $(taskset -p -c $sched 2>&1 | sed 's/.*: //'); GPU $(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader)"
    python3 scripts/device/launch_probe.py --cpu $PROBE_CPU --out $D/launch-$name.jsonl & LP=$!
    warm=--no-warmup; [[ ,$WARMUP_ROUNDS, == *,$k,* ]] && warm=""
    note "round $k $r begins: 600 x $NEW_TOKENS out"
    timeout $(( $(left) - 15 )) python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log $D/$name.log \
      --server-pid $spid --out $D/round$k-$r.json --batches 600 --variants alone --new-tokens $NEW_TOKENS $warm \
      --round-timeout-s $(( $(left) - 20 )) 2>&1 | tail -3
    note "round $k $r ends (exit ${PIPESTATUS[0]})"
    kill -TERM $LP 2>/dev/null; wait $LP 2>/dev/null
    curl -s -m 5 http://127.0.0.1:30300/server_info -o $D/$name.server_info.json
  else
    note "round $k $r: server not ready: $(tail -3 $D/$name.log | tr '\n' ' ')"
  fi
  python3 scripts/device/serve_direct.py stop --state-dir $D $name
  gpu_free
  k=$((k + 1))
done
for b in $BG; do kill -TERM $b 2>/dev/null; done; wait $BG 2>/dev/null
xz -T2 -c $D/cpu.jsonl > $OUT/cpu.jsonl.xz && rm -f $D/cpu.jsonl
pack memfrac
el "done"
