# Sourced, never run: one pass over every running SGLang server of this machine, and the loop that repeats it, for
# the device scripts' scrapers (scripts/device/bench_lib.sh, benchmarks/device_pd.sh, benchmarks/device_r1_full.sh;
# tests/calibrate/test_device_scrape.py runs both against a stand-in server on loopback).
scrape_sglang_servers() {  # $1 = dir: /metrics (last one wins) and /server_info (first one kept) of each server
  local dir=$1 pid args port mode
  for pid in $(pgrep -f "sglang.launch_server" 2>/dev/null); do
    args=$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null) || continue
    port=$(echo "$args" | grep -oE -- "--port [0-9]+" | awk '{print $2}')
    mode=$(echo "$args" | grep -oE -- "--disaggregation-mode [a-z]+" | awk '{print $2}'); mode=${mode:-agg}
    [ -n "$port" ] || continue
    curl -s -m 2 http://127.0.0.1:$port/metrics -o $dir/${mode}_$port.prom.tmp && mv $dir/${mode}_$port.prom.tmp $dir/${mode}_$port.prom
    [ -s $dir/${mode}_$port.server_info.json ] || curl -s -f -m 2 http://127.0.0.1:$port/server_info -o $dir/${mode}_$port.server_info.json 2>/dev/null
  done
}
scrape_engines() {  # $1 = dir: scrape_sglang_servers every 3 s until killed (start it in the background); $2, if
  # given: a command run with the dir after each pass (bench_lib.sh: copy_cluster_engine_logs)
  local dir=$1 after=${2:-}; mkdir -p $dir
  while true; do
    scrape_sglang_servers $dir
    [ -z "$after" ] || $after $dir
    sleep 3
  done
}
