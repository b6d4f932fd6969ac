set -e
D=benchmarks/results/2026-11-27-capture-law-applied
V=$PWD/.venv/bin/python
$V -m orchestrator plan --backtest > $D/backtest-after.txt
$V -m orchestrator plan --backtest --closed-loop > $D/closed-loop-after.txt
(cd /tmp/hcapfit-base && PYTHONPATH=/tmp/hcapfit-base $V -m orchestrator plan --backtest) > $D/backtest-before.txt
(cd /tmp/hcapfit-base && PYTHONPATH=/tmp/hcapfit-base $V -m orchestrator plan --backtest --closed-loop) > $D/closed-loop-before.txt
echo '### before = git archive of f24937c (main before this change) in /tmp/hcapfit-base; after = this commit'
echo '### diff backtest-before.txt backtest-after.txt'
diff $D/backtest-before.txt $D/backtest-after.txt || true
echo '### diff closed-loop-before.txt closed-loop-after.txt'
diff $D/closed-loop-before.txt $D/closed-loop-after.txt || true
echo '### warm decode-graph capture priced, R1-shaped FP8 (triton, context 16384), before / after'
for side in before after; do
  if [ $side = before ]; then R=/tmp/hcapfit-base; else R=$PWD; fi
  (cd $R && PYTHONPATH=$R $V -c "
from dataclasses import replace
from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.costmodel import build_cost_model
R1 = MODEL_PRESETS['DeepSeek-R1']
for gpu in ('H200', 'H100-SXM'):
    for layers, sizes in ((4, 36), (6, 36), (8, 36), (12, 36), (61, 52)):
        m = build_cost_model(replace(R1, num_hidden_layers=layers), gpu, 'fp8', calibrated=True, load_format='dummy', attention_backend='triton', context_length=16384, page_size=1)
        print('$side', gpu, layers, 'layers', sizes, 'sizes: warm capture', round(m.startup_breakdown_s(jit_cached=True, graph_sizes=sizes)['cuda_graphs'], 2), 's')
")
done
echo '### lease 22 warm starts (36 sizes), the read: benchmarks/results/2026-11-27-lease22-read/output.txt'
