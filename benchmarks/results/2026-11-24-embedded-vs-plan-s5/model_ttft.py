"""TTFT and run time of plan's and bench's cost-model runs of the default config, with the code of one commit."""
from orchestrator.config import load_config
from orchestrator.plan.simulate import percentile, sample_batch, simulate_run
from orchestrator.run.bench import max_in_flight
from orchestrator.run.fidelity import modelled_run
from orchestrator.workload.batch import sample_batch as bench_batch

cfg = load_config("configs/default.yaml")
sent = bench_batch(cfg, cfg.benchmark.num_prompts)
own = modelled_run(cfg, [(r.prompt_len, r.output_len) for r in sent], max_in_flight(cfg, len(sent)))
batch, _ = sample_batch(cfg)
plan = simulate_run(cfg, batch)
for name, r in (("plan", plan), ("bench's own model", own)):
    print(f"{name}: run {r.duration_s:.1f} s, TTFT p50 {percentile(r.ttft_s, 50):.2f} s, p90 {percentile(r.ttft_s, 90):.2f} s")
