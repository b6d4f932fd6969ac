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
. scripts/device/pieces_lib.sh  # assemble_pieces
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local
write_manifest "$@"
assemble_pieces
install_runtime
{ date -u; nproc; nvidia-smi -L; free -g; uname -a; } > $OUT/host.txt 2>&1
bench_local $PD_CFG $P/pd-warmupfix
pack pd-warmupfix
el "done"
