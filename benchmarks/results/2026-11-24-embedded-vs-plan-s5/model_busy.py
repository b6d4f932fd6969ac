from orchestrator.config import load_config
from orchestrator.run.bench import max_in_flight
from orchestrator.workload.batch import sample_batch
from orchestrator.perfmodel.costmodel import EngineCostModel
busy = {"decode": 0.0, "prefill": 0.0, "steps": 0, "bs": 0}
orig_d, orig_p = EngineCostModel.decode_step_s, EngineCostModel.prefill_time_s
def d(self, b, c):
    t = orig_d(self, b, c); busy["decode"] += t; busy["steps"] += 1; busy["bs"] += b; return t
def p(self, n, c=None):
    t = orig_p(self, n, c); busy["prefill"] += t; return t
EngineCostModel.decode_step_s, EngineCostModel.prefill_time_s = d, p
from orchestrator.run.fidelity import modelled_run
cfg = load_config("configs/default.yaml")
sent = sample_batch(cfg, cfg.benchmark.num_prompts)
busy.update(decode=0.0, prefill=0.0, steps=0, bs=0)
r = modelled_run(cfg, [(q.prompt_len, q.output_len) for q in sent], max_in_flight(cfg, len(sent)))
print(f"run {r.duration_s:.1f}s decode busy {busy['decode']:.1f}s over {busy['steps']} steps (mean batch {busy['bs']/busy['steps']:.0f}), prefill busy {busy['prefill']:.1f}s")
