#!/bin/bash
# serve_one_gpu.sh's phases (install | prepare | serve | prepare-serve | router) on a lent TWO-GPU machine
# (nvidia-h200-x2 / nvidia-h100-x2), issue 29: the Qwen3-235B-A22B-shaped 6-layer FP8 model as a PD pair with a GPU
# per role, prefill on GPU 0 and decode on GPU 1 (configs/device-h200x2-qwen3-serve.yaml: the product's local
# cluster, gpu_split auto, as configs/device-h200x2-local-1p1d.yaml), `serve` + `goodput` with real AIPerf at the
# one-GPU run's N = 4, 16 (ISL 4000 / OSL 200). The router phase puts sglang-router in front of prefill GPU 0 +
# decode GPU 1. cluster.gpu follows the card nvidia-smi names (H200 or H100-SXM). Calls and chunks: as for
# serve_one_gpu.sh (scripts/device/README.md, "Two GPUs"). Dry run here (simulated engine, no GPU):
#   PATH=$PWD/.venv/bin:$PATH SIM=1 AIPERF_VENV=$PWD/.venv-aiperf PDO_DIR=/tmp/pdo OUT=/tmp/pdo-out \
#     bash scripts/device/serve_two_gpu.sh prepare-serve
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) GPU_TYPE=H200 ;;
  *H100*) GPU_TYPE=H100-SXM ;;
  *) GPU_TYPE="" ;;
esac
export CONFIG=${CONFIG:-configs/device-h200x2-qwen3-serve.yaml} ROUTER_GPUS=${ROUTER_GPUS:-0 1}
export BENCH_SETS="${BENCH_SETS:-}${GPU_TYPE:+ --set cluster.gpu=$GPU_TYPE}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/serve_one_gpu.sh" "$@"
