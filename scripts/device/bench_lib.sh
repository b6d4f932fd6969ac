#!/bin/bash
# Shared set-up of the `bench`-through-the-product device scripts (sourced, never run): bench_one_gpu.sh (one lent
# GPU) and bench_two_gpu.sh (two). Before sourcing, the script sets PHASE, PD_CFG, AGG_CFG and ROUTER_GPUS
# ("P D": the GPU of the prefill and of the decode server that sglang-router fronts). Persistent while the lease is
# warm: /root/site (the sglang tree + Ray), /root/pdo (runs, timeline).
REPO=$(pwd)
OUT=${OUT:-/tmp/bench_out}; mkdir -p "$OUT"
write_manifest() {  # $OUT/manifest.json (as calibrate.sh): the command with the settings it read; a second call adds to it
  python3 benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|BENCH_[A-Z_]*|SITE_ARCHIVE|CONFIG|ROUTER_GPUS|CONC|GP_ARGS|GOODPUT_RESERVE_S)=' | sort | tr '\n' ' ')bash $0 $*" >/dev/null \
    || echo "manifest.json not written" >&2
}
P=${PDO_DIR:-/root/pdo}; SITE=${SITE_DIR:-/root/site}; mkdir -p $P $P/bin   # persistent while the lease is warm
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export PYTHONPATH=$SITE:$REPO PATH=$P/bin:$PATH
START=$(date +%s); BUDGET=${BUDGET:-570}
MODEL=${MODEL:-$REPO/models/deepseek-v2-lite}
SETS="--set model.path=$MODEL --set benchmark.dataset_path=$P/sharegpt.json ${BENCH_SETS:-}"
el() { echo "[$PHASE t+$(( $(date +%s) - START ))s] $*" | tee -a $P/timeline.txt; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
pack() { el "packing $1"; cp $P/timeline.txt $P/$1/ 2>/dev/null; tar -C $P -cJf "$OUT/$1.tar.xz" $1; ls -la "$OUT"; }

. "$(dirname "${BASH_SOURCE[0]}")/site_lib.sh"   # unpack_site: whole archive or parts over several calls
install_site() {
  [ -f $SITE/.installed_site ] && return 0
  el "unpack sglang tree"; unpack_site $SITE; local rc=$?
  [ $rc = 3 ] && exit 0   # a part staged; the next call carries the next one
  [ $rc = 0 ] || { el "sglang tree missing: carry .device/site-slim or the parts in .device/site-split (site_lib.sh)"; exit 1; }
  # the calibration's SGLang patches (as calibrate.sh applies them): timestamps, and candidate changes that stay
  # off unless switched on (pd-early sets PDO_EARLY_KV_INDICES=1 in the engines' env)
  [ -f $SITE/.nixl_patched_v8 ] || { python3 -m orchestrator.calibrate nixl-patch $SITE && touch $SITE/.nixl_patched_v8; }
}
install_chunk() {  # $1 = carried archive, $2 = marker: unpack into $P/rt-<marker>, its site/ into the sglang tree
  [ -f $SITE/.installed_$2 ] && return 0
  [ -f "$1" ] || { el "$1 not carried and not installed yet (send it in a call of this warm lease)"; return 1; }
  el "unpack $1"
  rm -rf $P/rt-$2; mkdir -p $P/rt-$2; tar -C $P/rt-$2 -xJf "$1" || return 1
  # the AIPerf chunk is an environment of its own (aiperf-venv/), with no site/ for the sglang tree
  [ ! -d $P/rt-$2/site ] || cp -a $P/rt-$2/site/. $SITE/ || return 1
  touch $SITE/.installed_$2
}
install_runtime() {  # Ray + data (.device/rt/runtime.tar.xz)
  install_site
  install_chunk .device/rt/runtime.tar.xz rt || exit 1
  # wheels carried beside it (2026-11-26: httptools, which our router's engine client imports, was not in runtime.tar.xz)
  for w in .device/rt/whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" $SITE; done
  cp $P/rt-rt/sharegpt.json $P/rt-rt/tokenizer.json.zip $P/ 2>/dev/null
  [ -f $MODEL/tokenizer.json ] || [ ! -f $MODEL/make_tokenizer.py ] || python3 $MODEL/make_tokenizer.py $P/tokenizer.json.zip
  # the archive drops Ray's console scripts; the local cluster runs `ray start`
  printf '#!/bin/sh\nexec python3 -m ray.scripts.scripts "$@"\n' > $P/bin/ray; chmod +x $P/bin/ray
  python3 -c "import ray, sglang, pydantic, httpx, aiohttp, rich, yaml, prometheus_client, tokenizers; print('ray', ray.__version__, 'sglang', sglang.__version__)" 2>&1 | tail -3
}
install_router() { install_chunk .device/rt/router.tar.xz router; }   # sglang-router 0.3.2

. "$(dirname "${BASH_SOURCE[0]}")/scrape_lib.sh"   # scrape_engines: every SGLang server's /metrics and /server_info
SCRAPER=""
copy_cluster_engine_logs() {  # $1 = dir: engine logs of the local cluster's runs (its temp dir is removed when bench
  # stops the cluster), one folder per deployment: prepare's and serve's engines have the same file names
  local f run
  for f in /tmp/pdo-ray-*/*/session_*/logs/pd-engines/*/*.log; do
    [ -f "$f" ] || continue; run=$(basename $(dirname $f)); mkdir -p $1/$run; cp "$f" $1/$run/
  done
}
start_scraper() { scrape_engines "$1" copy_cluster_engine_logs & SCRAPER=$!; }   # every 3 s, until stop_scraper
stop_scraper() { [ -n "$SCRAPER" ] && kill $SCRAPER 2>/dev/null; SCRAPER=""; }

bench_local() {  # $1 = config, $2 = output dir, then extra --set args: `bench` starting (and stopping) its own local cluster
  # (LEG_RESERVE_S: seconds of the budget this bench leaves for what comes after it in the call)
  local cfg=$1 dir=$2; shift 2; rm -rf $dir; mkdir -p $dir; touch $dir/.started
  { nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; free -g; } > $dir/env.txt 2>&1
  start_scraper $dir/scrape
  el "bench $cfg (cluster.address=local)"
  timeout $(( $(left) - 25 - ${LEG_RESERVE_S:-0} )) python3 scripts/device/one_command.py orchestrator.cli.bench bench --config $cfg $SETS "$@" \
    --result-dir $dir/runs ${BENCH_ARGS:-} 2>&1 | tee $dir/bench.txt | grep -v -E "^\(|INFO" | tail -45
  el "bench exit ${PIPESTATUS[0]}"
  stop_scraper
  python3 - $dir <<'PYEOF'   # engine logs: the paths result.json names (all on this machine)
import glob, json, os, shutil, sys
dst = os.path.join(sys.argv[1], "engines"); os.makedirs(dst, exist_ok=True)
for r in glob.glob(os.path.join(sys.argv[1], "runs", "*", "*.json")):
    try:
        logs = json.load(open(r)).get("engine_logs") or {}
    except (ValueError, AttributeError, OSError):
        continue
    for name, where in logs.items():
        path = where.split(":", 1)[-1]
        if os.path.exists(path):
            shutil.copy(path, os.path.join(dst, name.replace("/", "_") + ".log"))
PYEOF
  for f in $dir/scrape/prefill_*.prom $dir/scrape/agg_*.prom; do
    [ -f "$f" ] && python3 scripts/device/kv_stats.py $f > $dir/kv_stats-$(basename $f .prom).json && cat $dir/kv_stats-$(basename $f .prom).json
  done
  nvidia-smi --query-gpu=memory.used --format=csv >> $dir/env.txt 2>&1
}

RPG=""
router_pair_up() {  # $1 = dir, $2 = seconds kept back from the pair's wait: a PD pair started outside Ray with our
  # argv (serve_direct.py, GPUs from ROUTER_GPUS), the scraper, and SGLang's PD router on :30100 in front (RPG)
  local D=$1 pg dg; read -r pg dg <<< "${ROUTER_GPUS:-0 0}"
  el "PD pair for sglang-router (prefill on GPU $pg, decode on GPU $dg)"
  python3 scripts/device/serve_direct.py start --config $PD_CFG $SETS --role prefill --gpu $pg --port 30000 --bootstrap-port 8998 --name prefill --state-dir $D
  python3 scripts/device/serve_direct.py start --config $PD_CFG $SETS --role decode --gpu $dg --port 30001 --name decode --state-dir $D
  start_scraper $D/scrape
  python3 scripts/device/serve_direct.py wait --state-dir $D prefill decode --timeout-s $(( $(left) - $2 )) || { el "pair not ready"; }
  setsid python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://127.0.0.1:30000 8998 \
    --decode http://127.0.0.1:30001 --host 127.0.0.1 --port 30100 --policy round_robin \
    --prometheus-host 127.0.0.1 --prometheus-port 30190 > $D/router.log 2>&1 &
  RPG=$!
  for i in $(seq 60); do [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:30100/health)" = 200 ] && break; sleep 1; done
  el "router health: $(curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:30100/health)"
}
router_pair_down() {  # $1 = dir: the router, then the pair router_pair_up started
  kill -TERM -- -$RPG 2>/dev/null; python3 scripts/device/serve_direct.py stop --state-dir $1 prefill decode; kill -KILL -- -$RPG 2>/dev/null
}

router_pair() {  # SGLang's own PD router in front of a PD pair started outside Ray with our argv (same config)
  local D=$P/router; rm -rf $D; mkdir -p $D
  if [ -f .device/rt/batch.json ]; then cp .device/rt/batch.json $P/batch.json   # dumped here beforehand (same sampler)
  else el "batch: the bench's 1000 prompts (replay.py dump)"; python3 scripts/device/replay.py dump --config $PD_CFG $SETS --out $P/batch.json || return 1; fi
  cp $P/batch.json $D/ 2>/dev/null; python3 -c "import json; d=json.load(open('$P/batch.json')); print('batch', len(d['requests']), 'prompts, sha', d['sha'])"
  router_pair_up $D 120
  python3 scripts/device/replay.py run --batch $P/batch.json --url http://127.0.0.1:30100 --warmup --out $D/warmup.json
  el "measured: 1000 prompts through sglang-router"
  timeout $(( $(left) - 20 )) python3 scripts/device/replay.py run --batch $P/batch.json --url http://127.0.0.1:30100 --out $D/sglang_router.json 2>&1 | tail -20
  stop_scraper
  curl -s -m 5 http://127.0.0.1:30000/metrics -o $D/prefill.prom; curl -s -m 5 http://127.0.0.1:30001/metrics -o $D/decode.prom
  python3 scripts/device/kv_stats.py $D/prefill.prom $D/decode.prom | tee $D/kv_stats.json
  router_pair_down $D
}

