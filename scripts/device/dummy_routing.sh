#!/bin/bash
# Dummy-weight routing probe (issue 25), ONE call on a one-GPU machine, fully scripted:
#   run(kind="nvidia-h100-x1", carry=[".device/site"], timeout_s=600,
#       command="PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0 bash scripts/device/dummy_routing.sh 2>&1 | tee $OUT/main.log")
# then copy the returned folder to benchmarks/results/2026-11-26-dummy-routing-<gpu>/ (manifest.json included).
# Needs .device/site/site.tar.xz (scripts/device/build_site_archive.sh: SGLang 0.5.17). BUDGET (s, default 530) bounds
# the probe; VARIANTS picks a subset (scripts/device/dummy_routing_probe.py --help).
set -u
REPO=$(pwd)
OUT=${OUT:-/tmp/routing_out}; mkdir -p "$OUT"
python3 benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|VARIANTS)=' | sort | tr '\n' ' ')bash scripts/device/dummy_routing.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
SITE=${SITE_DIR:-/root/site}; W=${WORK_DIR:-/root/routing}; mkdir -p $W/r1s
START=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export PYTHONPATH=$SITE:$REPO
if [ ! -f $SITE/.installed_site ]; then
  rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site/site.tar.xz} && touch $SITE/.installed_site || { echo "unpack failed"; exit 1; }
fi
{ date -u; nvidia-smi; python3 -c "import torch, sglang; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('sglang', sglang.__version__)"; } > $OUT/env.txt 2>&1
cp benchmarks/calibration/r1-shaped/config.json $W/r1s/config.json
LEFT=$(( ${BUDGET:-530} - ($(date +%s) - START) ))
python3 scripts/device/dummy_routing_probe.py --model-path $W/r1s --out $OUT --budget-s $LEFT \
  ${VARIANTS:+--variants $VARIANTS} --flag=--trust-remote-code --flag=--triton-attention-split-tile-size --flag=256
echo "probe exit $? after $(( $(date +%s) - START )) s"
