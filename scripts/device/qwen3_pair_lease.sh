#!/bin/bash
# Issue 25, lease 11 (hqx2; pre-registered in benchmarks/results/2026-11-27-lease11-predicted/): on a lent nvidia-h100-x2,
# the Qwen3-shaped PD pair with a GPU per role (configs/device-h200x2-qwen3-serve.yaml through serve_two_gpu.sh) at
# N = 4, 16 and 32 with the NIXL patch's per-request wall times, then the Qwen3-shaped layer-count probe on both GPUs
# at once (layer_probe.sh SHAPE=qwen3, one count list per GPU). Phases, one warm lease:
#   stage         copy the chunk pieces this call carried to the machine's disk (the sglang tree, the runtime and AIPerf
#                 do not fit one call beside the tracked tree): PIECES_GLOB (default lease 10's .device/lease10/blob.part*:
#                 the sglang tree, runtime and httptools as one tar in pieces, pieces_lib.sh),
#                 .device/site-split/site.tar.xz.part* (site_lib.sh), .device/rt-split/runtime.part*,
#                 .device/aiperf-split/aiperf.part*
#   join          stage, then assemble what is complete (prepare and serve-layers begin with it)
#   prepare       the carried pieces too, then every chunk whose pieces are all staged assembled where serve_one_gpu.sh
#                 reads it (sha256 checked: BLOB_SHA256, RT_SHA256 of RT_PARTS, AIPERF_SHA256 of AIPERF_PARTS), then
#                 `serve_two_gpu.sh prepare` (plan + the cold start; it needs the Qwen3 tokenizer: carry
#                 .device/aiperf/qwen3-tokenizer.tar.xz, or AIPerf whole)
#   serve-layers  the carried pieces (AIPerf's last) staged and assembled, `serve_two_gpu.sh serve` at CONC (default
#                 4,16,32) on prepare's caches, then the layer probe with what the call has left (CALL_BUDGET, default
#                 585 s, less 15 s; skipped under LAYERS_MIN_S, default 150)
#   layers        the layer probe alone (LAYERS_BUDGET s)
# Knobs: PROBE_TAG (required by the layer phases: layer_probe.sh's), BUDGET (prepare / serve, s), CONC, LAYERS_GPU0 (default "6 3"), LAYERS_GPU1 (default "12 9"), DRY_RUN=1 (print
# what each phase would run, start nothing). Back in $OUT: prepare.tar.xz / serve.tar.xz (serve_one_gpu.sh's archives:
# plan, prepare report, serve log, AIPerf exports per N, goodput.json, every engine log with the patch's per-request
# times, /metrics scrapes), layers.tar (per GPU: the probe's manifest, calibration-q3l<L>-<PROBE_TAG>.json per count,
# layer-probe.tar.xz; rewritten every 10 s, so a call cut off keeps what was measured), manifest.json.
set -u
PHASE=${1:?usage: qwen3_pair_lease.sh stage|join|prepare|serve-layers|layers}
case $PHASE in stage|join|prepare|serve-layers|layers) ;; *) echo "qwen3_pair_lease.sh: unknown phase '$PHASE' (stage|join|prepare|serve-layers|layers)" >&2; exit 2 ;; esac
case $PHASE in serve-layers|layers) [ -n "${PROBE_TAG:-}" ] || { echo "qwen3_pair_lease.sh: PROBE_TAG is not set: the lease that runs the layer probe, e.g. PROBE_TAG=lease13 (layer_probe.sh names its servers with it)" >&2; exit 2; } ;; esac
HERE=$(dirname "$0")
START=$(date +%s); CALL_BUDGET=${CALL_BUDGET:-585}
LAYERS_GPU0=${LAYERS_GPU0:-6 3}; LAYERS_GPU1=${LAYERS_GPU1:-12 9}; LAYERS_MIN_S=${LAYERS_MIN_S:-150}
export CONC=${CONC:-4,16,32}
OUT=${OUT:-/tmp/qwen3_pair_out}; mkdir -p "$OUT"
export STAGE7=${STAGE7:-/root/stage7} PIECES_GLOB=${PIECES_GLOB:-.device/lease10/blob.part*}; RT_STAGE=${RT_STAGE:-/root/rt-stage}; AIPERF_STAGE=${AIPERF_STAGE:-/root/aiperf-stage}
export SITE_STAGE=${SITE_STAGE:-/root/site-parts}
lel() { echo "[lease11 $PHASE t+$(( $(date +%s) - START ))s] $*"; }

stage() {  # every carried piece to its stage dir; the site parts to site_lib.sh's
  local n=0 f
  for f in $PIECES_GLOB; do [ -f "$f" ] && mkdir -p $STAGE7 && cp "$f" $STAGE7/ && n=$((n + 1)); done
  for f in .device/site-split/site.tar.xz.part*; do [ -f "$f" ] && mkdir -p $SITE_STAGE && cp "$f" $SITE_STAGE/ && n=$((n + 1)); done
  for f in .device/rt-split/runtime.part*; do [ -f "$f" ] && mkdir -p $RT_STAGE && cp "$f" $RT_STAGE/ && n=$((n + 1)); done
  for f in .device/rt/whl/*.whl; do [ -f "$f" ] && mkdir -p $RT_STAGE && cp "$f" $RT_STAGE/ && n=$((n + 1)); done
  for f in .device/aiperf-split/aiperf.part*; do [ -f "$f" ] && mkdir -p $AIPERF_STAGE && cp "$f" $AIPERF_STAGE/ && n=$((n + 1)); done
  lel "staged $n file(s): $(ls $STAGE7 $SITE_STAGE $RT_STAGE $AIPERF_STAGE 2>/dev/null | tr '\n' ' ')"
  [ $n -gt 0 ]
}
joined() {  # $1 = staged pieces' glob, $2 = how many make the file, $3 = target file, $4 = expected sha256 (empty: unchecked)
  local have; have=$(ls $1 2>/dev/null | wc -l)
  [ "$have" -gt 0 ] || return 0
  [ "$have" -ge "$2" ] || { lel "$3: $have of $2 pieces staged so far"; return 0; }
  mkdir -p "$(dirname $3)"; cat $(ls $1 | sort) > $3
  local got; got=$(sha256sum $3 | cut -d' ' -f1)
  [ -z "$4" ] || [ "$got" = "$4" ] || { lel "$3: sha256 $got, expected $4 (a piece missing?)"; ls -l $1; rm -f $3; exit 1; }
  lel "$3 joined ($(stat -c %s $3) bytes, sha256 $got)"
}
assemble() {  # the staged chunks, as far as they are all there, where bench_lib.sh / serve_one_gpu.sh read them
  if ls $STAGE7/blob.part* >/dev/null 2>&1; then . $HERE/pieces_lib.sh; assemble_pieces; fi   # sets SITE_ARCHIVE
  joined "$RT_STAGE/runtime.part*" ${RT_PARTS:-3} .device/rt/runtime.tar.xz "${RT_SHA256:-}"
  if ls $RT_STAGE/*.whl >/dev/null 2>&1; then mkdir -p .device/rt/whl && cp $RT_STAGE/*.whl .device/rt/whl/; fi
  [ -f .device/aiperf/aiperf.tar.xz ] || joined "$AIPERF_STAGE/aiperf.part*" ${AIPERF_PARTS:-2} .device/aiperf/aiperf.tar.xz "${AIPERF_SHA256:-}"
  ls -l .device/rt .device/aiperf 2>&1 | grep -v "^total"
}
layers() {  # $1 = seconds: one layer_probe.sh per GPU, at once; layers.tar rewritten every 10 s
  local secs=$1 W=/root/lease11-layers
  rm -rf $W; mkdir -p $W/gpu0 $W/gpu1
  lel "layer probe: GPU 0 [$LAYERS_GPU0], GPU 1 [$LAYERS_GPU1], ${secs} s each"
  ( while sleep 10; do tar -C $W -cf $OUT/.layers.tar gpu0 gpu1 2>/dev/null && mv $OUT/.layers.tar $OUT/layers.tar; done ) & local copier=$!
  SHAPE=qwen3 PROBE_GPU=0 PORT=31000 BUDGET=$secs OUT=$W/gpu0 WORK_DIR=/root/lp-gpu0 bash $HERE/layer_probe.sh $LAYERS_GPU0 > $W/gpu0/probe.log 2>&1 &
  local p0=$!
  SHAPE=qwen3 PROBE_GPU=1 PORT=32000 BUDGET=$secs OUT=$W/gpu1 WORK_DIR=/root/lp-gpu1 bash $HERE/layer_probe.sh $LAYERS_GPU1 > $W/gpu1/probe.log 2>&1 &
  local p1=$!
  wait $p0; lel "GPU 0 probe exit $?"; wait $p1; lel "GPU 1 probe exit $?"
  kill $copier 2>/dev/null; tar -C $W -cf $OUT/layers.tar gpu0 gpu1; rm -f $OUT/.layers.tar
  grep -h "t+" $W/gpu*/probe.log | tail -20
}

if [ -n "${DRY_RUN:-}" ]; then
  case $PHASE in
    join) echo "join: stage; assemble" ;;
    stage) echo "stage: $PIECES_GLOB .device/{site-split/site.tar.xz.part*,rt-split/runtime.part*,rt/whl/*.whl,aiperf-split/aiperf.part*} -> $STAGE7 $SITE_STAGE $RT_STAGE $AIPERF_STAGE" ;;
    prepare) echo "prepare: stage; assemble; BUDGET=${BUDGET:-520} bash scripts/device/serve_two_gpu.sh prepare" ;;
    serve-layers) echo "serve-layers: CONC=$CONC BUDGET=${BUDGET:-400} bash scripts/device/serve_two_gpu.sh serve; then layers with $CALL_BUDGET s less what serve took (>= $LAYERS_MIN_S)" ;;
    layers) echo "layers: ${LAYERS_BUDGET:-300} s" ;;
  esac
  for g in "$LAYERS_GPU0" "$LAYERS_GPU1"; do SHAPE=qwen3 bash $HERE/layer_probe.sh --dry-run $g | grep "^== "; done
  exit 0
fi
case $PHASE in
  stage) stage || { lel "nothing carried: name a piece in this call's carry"; exit 1; } ;;
  join) stage; assemble ;;
  prepare)
    stage; assemble
    BUDGET=${BUDGET:-520} bash $HERE/serve_two_gpu.sh prepare ;;
  serve-layers)
    stage; assemble   # the last AIPerf piece travels with this call
    BUDGET=${BUDGET:-400} bash $HERE/serve_two_gpu.sh serve
    left=$(( CALL_BUDGET - ($(date +%s) - START) - 15 ))
    if [ $left -ge $LAYERS_MIN_S ]; then layers $left; else lel "layer probe skipped: $left s left (needs $LAYERS_MIN_S)"; fi ;;
  layers) layers ${LAYERS_BUDGET:-300} ;;
esac
lel "done"
