# commands, run from the checkout root (/work/main) at git 34865116c800ad80d0a53056faab1c424499556e, 2026-11-24T04:18:29Z
.venv/bin/pd-orchestrator plan --config configs/h200-r1-agg-tp8.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json  > h200-r1-agg-tp8.warm.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-agg-tp8.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json --jit-cold > h200-r1-agg-tp8.cold.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-agg-tp8-dpattn.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json  > h200-r1-agg-tp8-dpattn.warm.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-agg-tp8-dpattn.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json --jit-cold > h200-r1-agg-tp8-dpattn.cold.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-pd-4p4d-w4a8.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json  > h200-r1-pd-4p4d-w4a8.warm.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-pd-4p4d-w4a8.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json --jit-cold > h200-r1-pd-4p4d-w4a8.cold.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-pd-4p4d-fp8-l38.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json  > h200-r1-pd-4p4d-fp8-l38.warm.txt 2>&1
.venv/bin/pd-orchestrator plan --config configs/h200-r1-pd-4p4d-fp8-l38.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json --jit-cold > h200-r1-pd-4p4d-fp8-l38.cold.txt 2>&1
.venv/bin/pd-orchestrator compare --simulate --configs configs/h200-r1-agg-tp8.yaml configs/h200-r1-agg-tp8-dpattn.yaml configs/h200-r1-pd-4p4d-w4a8.yaml configs/h200-r1-pd-4p4d-fp8-l38.yaml --set benchmark.dataset_path=.device/r1/sharegpt.json > compare.txt 2>&1
