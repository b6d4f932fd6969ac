"""The benchmark batch: ShareGPT prompts as SGLang samples them, their order, and the warm-up requests."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.config import RunConfig
from orchestrator.records import BenchRequest
from orchestrator.workload.dataset import sample_sharegpt
from orchestrator.workload.sampled_batch import SampledPrompt


def sample_prompts(cfg: RunConfig, num_prompts: int) -> list[SampledPrompt]:
    """The config's ShareGPT prompts as SGLang samples them (client-side token ids, sampled output lengths),
    in sample order: the one sampler behind the bench's batch and the planner's."""
    from orchestrator.workload.tokenizer import load_tokenizer

    return sample_sharegpt(
        load_tokenizer(cfg.model.path, cfg.model.preset), num_prompts, cfg.benchmark.seed, cfg.benchmark.dataset_path,
        cfg.benchmark.context_len, cfg.benchmark.fixed_output_len,
    )


def sample_batch(cfg: RunConfig, num_prompts: int) -> list[BenchRequest]:
    """The bench's batch: the sampled prompts as requests, in the config's benchmark.ordering."""
    return order_requests([p.to_request() for p in sample_prompts(cfg, num_prompts)], cfg.benchmark.ordering)


ORDERINGS = ("arrival", "longest-first", "interleave")  # benchmark.ordering's values


def order_requests(requests: list[BenchRequest], ordering: str) -> list[BenchRequest]:
    """The requests in the order the client submits them: arrival = sample order; longest-first = by prompt + output
    tokens, longest first (ties keep sample order); interleave = longest, shortest, next longest, ..."""
    if ordering == "arrival":
        return requests
    if ordering == "longest-first":
        return sorted(requests, key=lambda r: -(r.prompt_len + r.output_len))
    if ordering == "interleave":  # long and short alternate so prefill and decode both stay busy
        by_len = sorted(requests, key=lambda r: -(r.prompt_len + r.output_len))
        out = []
        while by_len:
            out.append(by_len.pop(0))
            if by_len:
                out.append(by_len.pop())
        return out
    raise ValueError(f"ordering {ordering!r}: choose one of {', '.join(ORDERINGS)}")


def order_lengths(batch: Sequence[tuple[int, int]], ordering: str) -> list[tuple[int, int]]:
    """(prompt_len, output_len) pairs in sample order -> the same pairs in the order `bench` would send them
    (through order_requests itself, so the planner and the back-test cannot drift from the client)."""
    requests = [BenchRequest(index=i, input_ids=[], output_len=o, prompt_len=p) for i, (p, o) in enumerate(batch)]
    return [(r.prompt_len, r.output_len) for r in order_requests(requests, ordering)]


def warmup_batch(cfg: RunConfig, batch_size: int) -> list[BenchRequest]:
    """Warm-up requests, indexed after the measured batch so records never collide."""
    from orchestrator.workload.tokenizer import load_tokenizer

    policy = cfg.benchmark.warmup.policy
    if policy == "none":
        return []
    tokenizer = load_tokenizer(cfg.model.path, cfg.model.preset)
    n = min(cfg.benchmark.warmup.num_prompts, cfg.benchmark.num_prompts)
    if policy == "sglang":  # bench_offline_throughput: random 256-in / 16-out prompts
        from orchestrator.workload.random_prompts import sample_random_requests

        reqs = sample_random_requests(tokenizer, 256, 16, n, 1.0, cfg.benchmark.seed, cfg.benchmark.dataset_path,
                                      after_sharegpt_shuffle=True)
    else:  # batch-shaped: ShareGPT prompts from another seed, so the measured run gets no prefix-cache hits
        from orchestrator.workload.dataset import sample_sharegpt

        reqs = [p.to_request() for p in sample_sharegpt(tokenizer, n, cfg.benchmark.seed + 1,
                                                       cfg.benchmark.dataset_path, cfg.benchmark.context_len)]
        # the run's own first prefill forward, which the 16 short prompts never make: see full_chunk_prompt_len;
        # reversed, so its head is no warm-up prompt's head (a prefix-cache hit would shrink that first forward)
        ids = [t for r in reqs for t in r.input_ids][::-1]
        length = full_chunk_prompt_len(cfg)
        if ids and length:
            reqs.append(BenchRequest(index=0, input_ids=(ids * (length // len(ids) + 1))[:length],
                                     output_len=cfg.benchmark.warmup.max_output_len))
    for i, r in enumerate(reqs):
        r.index = batch_size + i
        r.output_len = min(r.output_len, cfg.benchmark.warmup.max_output_len)
    return reqs


FULL_CHUNK_SPARE_TOKENS = 64  # the first forward stays a whole chunk even when the prompt's head hits the prefix cache


def full_chunk_prompt_len(cfg: RunConfig) -> int:
    """Length of the dataset warm-up's one long prompt: its first forward is a full chunk of the largest
    --chunked-prefill-size among the prefilling servers, the forward every batch run starts with (all prompts
    queued at once). Why: SGLang's Triton kernels compile a separate variant for a token count divisible by 16;
    ShareGPT warm-up batches (2,566-4,811 tokens) never made one, so on cold compile caches the run's first
    8,192-token chunk compiled for 2.0-2.7 s inside the measured run (benchmarks/results/2026-11-27-run-start-
    timeline). Capped below the model's context; 0 when chunking is off."""
    from orchestrator.perfmodel.costmodel import cost_model_for

    chunk = max((cost_model_for(cfg, role, group).chunked_prefill_tokens or 0
                 for role, _, group in cfg.layout.groups() if role in ("prefill", "aggregated")), default=0)
    context = cfg.model.context_length or cfg.model.architecture().max_position_embeddings
    return max(0, min(chunk + FULL_CHUNK_SPARE_TOKENS, context - cfg.benchmark.warmup.max_output_len - 1)) if chunk > 0 else 0
