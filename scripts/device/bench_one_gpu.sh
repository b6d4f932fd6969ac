#!/bin/bash
# `pd-orchestrator bench` with real SGLang on ONE lent GPU (nvidia-h100-x1): a prefill and a decode server share
# the GPU, placed by the product's own local cluster (cluster.address: local, gpu_split: off), our router,
# NIXL KV; then the same through an aggregated server; then SGLang's own PD router (sglang-router 0.3.2) in front
# of the same kind of pair (started outside Ray with our argv by serve_direct.py), same 1000 ShareGPT prompts.
# Configs: configs/device-h100x1-1p1d.yaml, configs/device-h100x1-agg.yaml.
#
# Built here first (git-ignored, never committed; a call carries 64 MiB in all, the tracked tree included):
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_site_archive.sh .device/site     (sglang + NIXL)
#   bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-slim/site.tar.xz
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_runtime_archive.sh .device/rt    (Ray + data; router)
#   .venv/bin/python scripts/device/replay.py dump --config configs/device-h100x1-1p1d.yaml --out .device/rt/batch.json \
#       --set model.path=<dir with tokenizer.json> --set benchmark.dataset_path=<the trimmed sharegpt.json>
#   (optional: the router phase dumps it there otherwise, ~10 s)
# The two archives do not fit one call, so the sglang tree goes first (any calibrate.sh call unpacks it into
# /root/site, or `bench_one_gpu.sh site` alone) and the runtime in the next call of the same warm lease
# (a machine is given back ~30 s after a call ends: send the next call at once):
#   run(kind="nvidia-h100-x1", carry=[".device/site-slim"], command="... calibrate.sh pd ...")   # or: bench_one_gpu.sh site
#   run(carry=[".device/rt"], timeout_s=600, command="set -o pipefail; bash scripts/device/bench_one_gpu.sh pd 2>&1 | tee $OUT/main-pd.log")
#   run(timeout_s=600, command="set -o pipefail; bash scripts/device/bench_one_gpu.sh agg-router 2>&1 | tee $OUT/main-agg-router.log")
# Phases (each packs $OUT/<phase>.tar.xz: bench output, result.json, engine logs, /metrics scrapes, KV stats):
#   site        unpack the carried sglang tree only (SITE_ARCHIVE, default .device/site-slim/site.tar.xz)
#   pd          install the runtime tree, `bench` PD through the local cluster
#   pd-nooverlap / pd-early   the same with the prefill's --disable-overlap-schedule / the early-KV patch switched on
#   agg-router  `bench` aggregated through the local cluster, then sglang-router in front of a PD pair (replay.py)
#   agg / router  either half alone
set -u
PHASE=${1:?usage: bench_one_gpu.sh site|pd|pd-nooverlap|pd-early|agg-router|agg|router}
PD_CFG=configs/device-h100x1-1p1d.yaml; AGG_CFG=configs/device-h100x1-agg.yaml; ROUTER_GPUS="0 0"
. scripts/device/bench_lib.sh   # set-up, installs, scraper, bench_local, router_pair (shared with bench_two_gpu.sh)
write_manifest "$@"   # pass PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0|1 in the run() command (no .git there)

{ date -u; nvidia-smi -L; } 2>&1 | head -3
case $PHASE in
site) install_site; nvidia-smi -L ;;
pd) install_runtime; bench_local $PD_CFG $P/pd; pack pd ;;
pd-nooverlap)  # the prefill server without SGLang's overlap loop (it holds a batch's KV back one forward otherwise)
  install_runtime
  bench_local $PD_CFG $P/pd-nooverlap --set 'layout.prefill.0.extra_args=[--disable-overlap-schedule]'
  pack pd-nooverlap ;;
pd-early)  # the prefill with the early KV indices patch switched on (orchestrator/calibrate/early_kv.py)
  install_runtime; bench_local $PD_CFG $P/pd-early --set 'engine.sglang.env.PDO_EARLY_KV_INDICES="1"'; pack pd-early ;;
agg) install_runtime; bench_local $AGG_CFG $P/agg; pack agg ;;
router) install_runtime; install_router || exit 1; router_pair; pack router ;;
agg-router) install_runtime; install_router || exit 1; bench_local $AGG_CFG $P/agg; pack agg; router_pair; pack router ;;
*) el "unknown phase $PHASE"; exit 2 ;;
esac
el "done"
