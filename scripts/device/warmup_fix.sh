#!/bin/bash
# Issue 25, lease 9 (hgpu9; pre-registered in benchmarks/results/2026-11-27-warmup-fix-predicted/): the V2-Lite PD
# product row on ONE GPU (configs/device-h100x1-1p1d.yaml: prefill and decode share it) on a fresh machine, so cold
# compile caches, with bench's warm-up as shipped (warmup_batch's one full-chunk prompt). Reads afterwards: the run's
# first forward's run_batch (PDO_ITER, nixl_patch) and first token (result.json), and the warm-up's own long forward.
# Phases:
#   stage   copy the carried piece(s) .device/lease7/blob.part* to $STAGE7 (eager_profile.sh stage: the sglang tree
#           and the runtime do not fit one call beside the tree)
#   pd      assemble the pieces (checks BLOB_SHA256), install, `bench` the one-GPU PD config (--force: its memory
#           preflight refuses 0.92 per server; earlier one-GPU runs did not run out of memory), pack
# Knobs: BUDGET (s, default 570), BLOB_SHA256, DRY_RUN=1 (print the bench command, start nothing).
# Returns in $OUT: pd-warmupfix.tar.xz (bench run dir, engine logs, scrapes, timeline), manifest.json.
set -u
PHASE=${1:?usage: warmup_fix.sh stage|pd}
case $PHASE in stage|pd) ;; *) echo "warmup_fix.sh: unknown phase '$PHASE' (stage|pd)" >&2; exit 2 ;; esac
[ $PHASE = stage ] && exec bash "$(dirname "$0")/eager_profile.sh" stage
STAGE7=${STAGE7:-/root/stage7}
PD_CFG=configs/device-h100x1-1p1d.yaml; AGG_CFG=configs/device-h100x1-agg.yaml; ROUTER_GPUS="0 0"
if [ -n "${DRY_RUN:-}" ]; then
  echo "pd: bench_local $PD_CFG \$P/pd-warmupfix (BENCH_ARGS=${BENCH_ARGS:---force}; BENCH_SETS:${BENCH_SETS:-})"
  exit 0
fi
export BENCH_ARGS=${BENCH_ARGS:---force}
assemble() {  # the carried pieces -> site archive, runtime + httptools wheel in .device/rt (as eager_profile.sh)
  local x=$STAGE7/x
  if [ ! -f $x/.done ]; then
    mkdir -p $STAGE7
    for f in .device/lease7/blob.part*; do [ -f "$f" ] && cp "$f" $STAGE7/; done
    rm -rf $x; mkdir -p $x
    if [ -n "${BLOB_SHA256:-}" ]; then
      local got; got=$(cat $(ls $STAGE7/blob.part* | sort) | sha256sum | cut -d' ' -f1)
      [ "$got" = "$BLOB_SHA256" ] || { echo "pieces: sha256 $got, expected $BLOB_SHA256 (a piece missing?)"; ls -l $STAGE7; exit 1; }
    fi
    cat $(ls $STAGE7/blob.part* | sort) | tar -C $x -x || { echo "pieces do not make the archive"; exit 1; }
    touch $x/.done
  fi
  mkdir -p .device/rt/whl && cp $x/runtime.tar.xz .device/rt/ && cp $x/httptools-*.whl .device/rt/whl/
  export SITE_ARCHIVE=$x/site.tar.xz
}
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local
write_manifest "$@"
assemble
install_runtime
{ date -u; nproc; nvidia-smi -L; free -g; uname -a; } > $OUT/host.txt 2>&1
bench_local $PD_CFG $P/pd-warmupfix
pack pd-warmupfix
el "done"
