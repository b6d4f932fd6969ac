set -e   # the planner's step and memory verdict per arm of the mem-fraction A/B (issue 25, heager): predicted.txt of
# benchmarks/results/2026-11-28-eager-memfrac-predicted/
.venv/bin/python -c '
from benchmarks.eager_inrun_predict import AGG, server_model, step_row
print("lone TP 1 V2-Lite on H100-SXM (configs/device-h200x2-local-agg-tp2.yaml, tp 1, graphs to 256): the planner eager step at batch 600")
print("arm  mem   context/request  step_ms  cpu_launch_ms  gpu_work_ms  bound")
for arm, mem in (("A", "0.85"), ("B", "0.65")):
    m = server_model(AGG, "aggregated", ["layout.aggregated.0.tp=1", "layout.aggregated.0.mem_fraction_static=" + mem], "H100-SXM")
    for ctx in (330, 410, 490):
        r = step_row(m, 600, ctx)
        print("%3s  %4s  %15d  %7.2f  %13.2f  %11.2f  %s" % (arm, mem, ctx, r["step_ms"], r["cpu_launch_ms"], r["gpu_work_ms"], r["bound"]))
'
for mem in 0.85 0.65; do
  for cap in "" 600; do
    echo; echo "== plan, mem_fraction_static $mem${cap:+, max_running_requests $cap (the A/B batch)}"
    .venv/bin/pd-orchestrator plan --config configs/device-h200x2-local-agg-tp2.yaml --set layout.aggregated.0.tp=1 \
      --set layout.aggregated.0.mem_fraction_static=$mem ${cap:+--set layout.aggregated.0.max_running_requests=$cap} \
      --set cluster.gpu=H100-SXM --set cluster.gpus_per_node=1 --set benchmark.dataset_path=null 2>&1 | sed -n '2,10p'
  done
done
