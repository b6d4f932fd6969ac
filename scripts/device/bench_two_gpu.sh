#!/bin/bash
# `pd-orchestrator bench` with real SGLang on a lent TWO-GPU machine (nvidia-h200-x2 / nvidia-h100-x2), issue 29:
#   pd      a prefill server on GPU 0 and a decode server on GPU 1, placed by the product's own local cluster
#           (cluster.address: local, gpu_split: auto), our router, NIXL KV (UCX cuda_ipc over NVLink):
#           configs/device-h200x2-local-1p1d.yaml
#   agg     one aggregated server with TP 2 over both GPUs, same cluster, router and prompts:
#           configs/device-h200x2-local-agg-tp2.yaml
#   router  SGLang's own PD router (sglang-router 0.3.2) in front of the same kind of pair (prefill GPU 0, decode
#           GPU 1, started outside Ray with our argv by serve_direct.py), the same 1000 prompts (replay.py)
#   pd-agg  pd then agg in one call;  site  unpack the carried sglang tree only
#   agg-ab / pd-ab  the same server twice in one call on the same machine, leg A with BENCH_AGG_SETS / BENCH_PD_SETS,
#           leg B with BENCH_AGG_SETS_B / BENCH_PD_SETS_B (lease 4: graphs to 1024 vs to 256; two decode fractions);
#           BENCH_AB_LABELS="a b" names the legs' folders (agg-tp2-<label>, pd-<label>); BENCH_B_RESERVE_S (default
#           half the budget) is kept back from leg A's timeout so that leg B always gets its turn
# BENCH_SETS (--set ...) reach every bench of the phase; BENCH_PD_SETS the PD pair's only, e.g. pd-agg with
# BENCH_PD_SETS="--set layout.decode.0.mem_fraction_static=0.80" (a decode key the aggregated config lacks);
# BENCH_AGG_SETS the aggregated server's only (e.g. --set layout.aggregated.0.mem_fraction_static=0.80)
# Same set-up as bench_one_gpu.sh (scripts/device/bench_lib.sh: installs, engine scraper, bench_local, router_pair).
# cluster.gpu follows the card nvidia-smi names (H200 or H100-SXM), so the preflight checks the right memory.
# Calls, one warm lease (the sglang tree comes with the first call, e.g. calibrate.sh twogpu; a machine goes back
# ~30 s after a call ends: send the next at once); pass PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0 in each command:
#   run(kind="nvidia-h200-x2", carry=[".device/site-slim"], command="... bash scripts/device/calibrate.sh twogpu ...")
#   run(carry=[".device/rt/runtime.tar.xz", ".device/rt/whl/httptools-0.9.0-cp312-...whl"], timeout_s=600,
#       command="set -o pipefail; export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0 BUDGET=560; bash scripts/device/bench_two_gpu.sh pd-agg 2>&1 | tee $OUT/main-pd-agg.log")
#   run(carry=[".device/rt/router.tar.xz", ".device/rt/batch.json"], timeout_s=400,
#       command="set -o pipefail; export PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0 BUDGET=360; bash scripts/device/bench_two_gpu.sh router 2>&1 | tee $OUT/main-router.log")
# Each phase packs $OUT/<phase>.tar.xz (bench output, result.json, engine logs, /metrics scrapes, KV stats).
set -u
PHASE=${1:?usage: bench_two_gpu.sh site|pd|agg|router|pd-agg|agg-ab|pd-ab}
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) GPU_TYPE=H200 ;;
  *H100*) GPU_TYPE=H100-SXM ;;
  *) GPU_TYPE="" ;;
esac
BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE}"
PD_CFG=configs/device-h200x2-local-1p1d.yaml; AGG_CFG=configs/device-h200x2-local-agg-tp2.yaml; ROUTER_GPUS="0 1"
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local, router_pair (shared with bench_one_gpu.sh)
write_manifest "$@"

{ date -u; nvidia-smi -L; nvidia-smi topo -m; } 2>&1 | head -12
el "cluster.gpu=${GPU_TYPE:-unknown (not set)}"
case $PHASE in
site) install_site ;;
pd) install_runtime; bench_local $PD_CFG $P/pd ${BENCH_PD_SETS:-}; pack pd ;;
agg) install_runtime; bench_local $AGG_CFG $P/agg-tp2 ${BENCH_AGG_SETS:-}; pack agg-tp2 ;;
router) install_runtime; install_router || exit 1; router_pair; pack router ;;
pd-agg) install_runtime; bench_local $PD_CFG $P/pd ${BENCH_PD_SETS:-}; pack pd; bench_local $AGG_CFG $P/agg-tp2 ${BENCH_AGG_SETS:-}; pack agg-tp2 ;;
agg-ab|pd-ab)
  read -r LA LB <<< "${BENCH_AB_LABELS:-a b}"
  if [ $PHASE = agg-ab ]; then CFG=$AGG_CFG; PFX=agg-tp2; SA=${BENCH_AGG_SETS:-}; SB=${BENCH_AGG_SETS_B:-}
  else CFG=$PD_CFG; PFX=pd; SA=${BENCH_PD_SETS:-}; SB=${BENCH_PD_SETS_B:-}; fi
  install_runtime
  LEG_RESERVE_S=${BENCH_B_RESERVE_S:-$(( $(left) / 2 ))} bench_local $CFG $P/$PFX-$LA $SA; pack $PFX-$LA
  bench_local $CFG $P/$PFX-$LB $SB; pack $PFX-$LB ;;
*) el "unknown phase $PHASE"; exit 2 ;;
esac
el "done"
