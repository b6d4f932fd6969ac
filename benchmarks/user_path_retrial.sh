#!/usr/bin/env bash
# Issue 22's trial again, as a new user meets it: run from the root of a fresh clone whose .venv
# `scripts/dev-setup.sh` made. Each command is echoed (`$ ...`), then its output and exit code.
# Record it with: python3 benchmarks/manifest.py record --out DIR --stdout output.txt -- bash benchmarks/user_path_retrial.sh
# (argument `fixes`: only the commands whose output changed after the first retrial)
set -u
export RAY_USAGE_STATS_ENABLED=0
PDO=.venv/bin/pd-orchestrator
DEFAULT=configs/default.yaml

step() {  # step TIMEOUT_S CMD...: echo, run (stdout+stderr), print the exit code
  local limit=$1; shift
  echo; echo "\$ $*"
  timeout "$limit" "$@" 2>&1
  echo "[exit $?]"
}

if [ "${1:-}" = "fixes" ]; then  # only the commands whose output changed after the first retrial (ccd4c40, 5a144c2)
  step 120 $PDO config validate $DEFAULT --set layout.prefill.0.count=2
  step 120 $PDO config validate $DEFAULT --set layout.prefill.1.tp=4
  step 300 $PDO bench --config $DEFAULT --set cluster.address=10.255.255.1:6379
  step 900 $PDO bench --config $DEFAULT --set benchmark.num_prompts=100 --set engine.sim.startup_s=0
  exit 0
fi

echo "== 1. the README's first command (embedded default, 1000 prompts) =="
step 900 $PDO bench --config $DEFAULT

echo; echo "== 2. plan next to that run (sim-engine run, error band, TTFT flag); compare labels it =="
step 300 $PDO plan --config $DEFAULT
step 300 $PDO compare --configs $DEFAULT

echo; echo "== 3. the README's PD-ratio override and adding a group by --set =="
step 120 $PDO config validate $DEFAULT --set layout.prefill.0.count=2
step 300 $PDO plan --config $DEFAULT --set layout.prefill.0.count=2
step 120 $PDO config validate $DEFAULT --set layout.prefill.1.tp=4
step 300 $PDO plan --config $DEFAULT --set 'layout.prefill.+={count: 1, tp: 4}'

echo; echo "== 4. the smaller items =="
step 600 $PDO plan --config $DEFAULT --search --top 5
step 300 $PDO plan --config $DEFAULT --rules none
step 120 $PDO bench --config $DEFAULT --set benchmark.dataset_path=/nonexistent/sharegpt.json
step 300 $PDO bench --config $DEFAULT --set cluster.address=10.255.255.1:6379
step 600 $PDO bench --config $DEFAULT --set layout.prefill.0.count=2
step 900 $PDO bench --config $DEFAULT --quiet --set benchmark.num_prompts=200

echo; echo "== 5. Ctrl-C at 800 of 1000 (benchmarks/interrupt_trial.py: SIGINT to bench, counts vs the decode's own tally) =="
step 900 .venv/bin/python benchmarks/interrupt_trial.py 800

echo; echo "== 6. Prometheus sees the run (monitor up, bench, Prometheus's HTTP API) =="
step 120 $PDO monitor up --config $DEFAULT
PROM_PORT=$(.venv/bin/python -c "from orchestrator.config import load_config; print(load_config('$DEFAULT').metrics.prometheus_port)")
.venv/bin/python - "$PROM_PORT" <<'EOF' &
import json, sys, time, urllib.parse, urllib.request
port = sys.argv[1]
def ask(path):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5))
best = (0, 0, 0)
for _ in range(600):  # while the bench below runs: the most targets and series Prometheus saw at once
    try:
        up = len([t for t in ask("/api/v1/targets")["data"]["activeTargets"] if t["health"] == "up"])
        series = {m: len(ask("/api/v1/series?" + urllib.parse.urlencode({"match[]": f'{{__name__=~"{m}.*"}}'}))["data"])
                  for m in ("pdorch_", "sglang:")}
        best = max(best, (up, series["pdorch_"], series["sglang:"]))
    except OSError:
        pass
    time.sleep(1)
print(f"PROMETHEUS during the run: at most {best[0]} targets up, {best[1]} pdorch_* series, {best[2]} sglang:* series")
EOF
WATCHER=$!
step 900 $PDO bench --config $DEFAULT --quiet --set benchmark.num_prompts=200
sleep 20; kill $WATCHER 2>/dev/null; wait $WATCHER 2>/dev/null
.venv/bin/python - "$PROM_PORT" <<'EOF'
import json, sys, urllib.parse, urllib.request
port = sys.argv[1]
for m in ("pdorch_", "sglang:"):
    q = urllib.parse.urlencode({"match[]": f'{{__name__=~"{m}.*"}}'})
    n = len(json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/series?{q}", timeout=5))["data"])
    print(f"PROMETHEUS after the run: {n} {m}* series stored")
EOF
step 120 $PDO monitor down --config $DEFAULT

echo; echo "== 7. ray job submit (the README's block) =="
step 300 $PDO cluster up --local --state runs/retrial-cluster.json | tee /tmp/retrial-up.txt
DASH=$(grep -o 'RAY_API_SERVER_ADDRESS=[^ ]*' /tmp/retrial-up.txt | head -1 | cut -d= -f2)
export RAY_AUTH_MODE=disabled RAY_API_SERVER_ADDRESS=$DASH
step 900 .venv/bin/ray --logging-level warning job submit --working-dir . -- python -m orchestrator bench --config $DEFAULT --quiet --num-prompts 200
step 120 $PDO cluster down --state runs/retrial-cluster.json
