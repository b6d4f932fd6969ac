"""Why one searched config ranks above the next: one line from the verdicts, run times and knob differences."""

from __future__ import annotations

from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.phases import Phase
from orchestrator.plan.candidate import Candidate
from orchestrator.plan.knobs import DECODING


def _decoding_model(c: Candidate):
    role, _, group = next((r, i, g) for r, i, g in c.config.layout.groups() if r in DECODING)
    return cost_model_for(c.config, role, group, gpu=c.budget.run.gpu if c.budget else None)


def _kv_tokens(c: Candidate) -> int:
    return sum(cost_model_for(c.config, r, g, gpu=c.simulated.run.gpu).kv_capacity_tokens() * g.count
               for r, _, g in c.config.layout.groups() if r in DECODING)


def _caps_text(c: Candidate) -> str:
    role, _, group = next((r, i, g) for r, i, g in c.config.layout.groups() if r in DECODING)
    running = cost_model_for(c.config, role, group, gpu=c.simulated.run.gpu).max_running()
    graphs = group.cuda_graph_max_bs or "SGLang's default"
    return f"{running} running requests, CUDA graphs up to batch {graphs}"


def _mechanism(name: str, a: Candidate, b: Candidate) -> str:
    """What a knob difference changes in the model, with the numbers of both candidates."""
    ma, mb = _decoding_model(a), _decoding_model(b)
    if name == "batch_caps":
        return f"decode with {_caps_text(a)} vs {_caps_text(b)} (larger batches run without CUDA graphs)"
    if name == "mem_fraction_static":
        return f"KV holds {_kv_tokens(a):,} vs {_kv_tokens(b):,} tokens (mem fraction {ma.mem_fraction_static:.2f} vs {mb.mem_fraction_static:.2f})"
    if name == "chunked_prefill_size":
        return f"prefill forwards of {ma.chunked_prefill_tokens:,} vs {mb.chunked_prefill_tokens:,} tokens"
    if name == "page_size":
        return f"page size {a.config.engine.sglang.page_size} vs {b.config.engine.sglang.page_size} (KV transfer descriptors)"
    if name == "attention_backend":
        speed = lambda m: getattr(m, "attention_speed", 1.0)  # noqa: E731
        return (f"attention {a.knobs.get(name) or 'fa3'} vs {b.knobs.get(name) or 'fa3'} "
                f"(speed {speed(ma):.2f} vs {speed(mb):.2f}, assumed)")
    if name == "speculative":
        acc = lambda m: "off" if getattr(m, "speculative", None) is None else f"{m.decode_tokens_per_step:.2f} tokens/step"  # noqa: E731
        dummy = " (dummy weights: drafts assumed rejected)" if a.config.engine.sglang.load_format == "dummy" else ""
        return f"MTP {acc(ma)} vs {acc(mb)}{dummy}"
    if name == "warmup":
        return f"warm-up {a.simulated.phase_s(Phase.WARMUP.value):.1f} vs {b.simulated.phase_s(Phase.WARMUP.value):.1f} s of the deadline"
    return name


def why_better(a: Candidate, b: Candidate) -> str:
    """One line: why `a` ranks above `b` (deadline verdict, run time, then the differences that cause it)."""
    if a.verdict_rank != b.verdict_rank:
        head = f"{a.simulated.verdict} vs {b.simulated.verdict} (total {a.total_s:.0f} vs {b.total_s:.0f} s of {a.simulated.deadline_s:.0f})"
    elif a.run_s < b.run_s * (1 - 1e-3):
        head = f"run {a.run_s:.1f} vs {b.run_s:.1f} s ({1 - a.run_s / b.run_s:.1%} shorter, {a.throughput:,.0f} vs {b.throughput:,.0f} out tok/s)"
    elif len(a.knobs) < len(b.knobs):
        head = (f"same run time ({a.run_s:.1f} s) with {len(a.knobs)} vs {len(b.knobs)} changed knobs (a change must buy "
                f"run time; total {a.total_s:.0f} vs {b.total_s:.0f} s)")
    else:
        head = f"same run time; total {a.total_s:.1f} vs {b.total_s:.1f} s"
    if a.label != b.label:
        ma, mb = _decoding_model(a), _decoding_model(b)
        return (f"{head}: layout {a.label} vs {b.label} (KV {_kv_tokens(a):,} vs {_kv_tokens(b):,} tokens, "
                f"weights {ma.weights_bytes_per_gpu() / 1e9:.0f} vs {mb.weights_bytes_per_gpu() / 1e9:.0f} GB/GPU)")
    names = [n for n in dict.fromkeys([*a.knobs, *b.knobs]) if a.knobs.get(n) != b.knobs.get(n)]
    if not names:
        return head
    return f"{head}: " + "; ".join(_mechanism(n, a, b) for n in names[:2])
