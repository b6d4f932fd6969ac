"""The benchmark batch: ShareGPT prompts as SGLang samples them, their order, and the warm-up requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    """The warm-up's short prompts (sent through the router after `first_forwards`), indexed after the measured
    batch so records never collide."""
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
    for i, r in enumerate(reqs):
        r.index = batch_size + i
        r.output_len = min(r.output_len, cfg.benchmark.warmup.max_output_len)
    return reqs


FULL_CHUNK_SPARE_TOKENS = 64  # the first forward stays a whole chunk even when the prompt's head hits the prefix cache


@dataclass(frozen=True)
class FirstForward:
    """The run's first forward on the servers of one prefilling group, as the warm-up runs it before anything else:
    one sequence of exactly `chunk_tokens` on each of a server's `ranks` DP ranks, one rank at a time.

    Why: SGLang's Triton kernels compile a variant apart for an integer argument divisible by 16 (the token count of
    a one-sequence forward among them); ShareGPT warm-up batches never made one, so on cold compile caches the run's
    first forward (one sequence of a full chunk) compiled for 2.0-2.7 s inside the measured run
    (benchmarks/results/2026-11-27-run-start-timeline). Sent alone to an idle server, the prompt's first forward is
    that shape by construction (lease 9's compile landed in a 4,576-token remainder forward only by chance)."""

    role: str  # prefill | aggregated
    group_index: int
    chunk_tokens: int  # one rank's --chunked-prefill-size (divided by the DP size under DP attention, as SGLang does)
    ranks: int  # DP ranks (DP-attention ranks or plain DP replicas): each schedules its own first forward
    prompt_len: int  # chunk + spare tokens, capped below the context; the rest is a short second forward


def first_forwards(cfg: RunConfig) -> list[FirstForward]:
    """One entry per prefilling group (PD prefill, aggregated) with chunking on."""
    from orchestrator.perfmodel.costmodel import cost_model_for

    context = cfg.model.context_length or cfg.model.architecture().max_position_embeddings
    longest = context - cfg.benchmark.warmup.max_output_len - 1
    out = []
    for role, i, group in cfg.layout.groups():
        if role not in ("prefill", "aggregated"):
            continue
        model = cost_model_for(cfg, role, group)
        chunk = (model.chunked_prefill_tokens or 0) // model.attn_dp
        if chunk > 0:
            out.append(FirstForward(role, i, chunk, group.dp, max(1, min(chunk + FULL_CHUNK_SPARE_TOKENS, longest))))
    return out


def first_forward_ids(short: Sequence[BenchRequest], length: int, variant: int) -> list[int]:
    """`length` token ids from the short warm-up prompts' ids, reversed (so the head is no warm-up prompt's, nor the
    run's) and rotated by `variant` (so a server's later ranks find no cached head from its earlier ones)."""
    ids = [t for r in short for t in r.input_ids][::-1]
    if not ids:
        return []
    start = (variant * 997) % len(ids)
    ids = ids[start:] + ids[:start]
    return (ids * (length // len(ids) + 1))[:length]


def bench_first_forwards(cfg: RunConfig) -> list[FirstForward]:
    """What bench's warm-up runs first: `first_forwards` under the `dataset` policy; none under `sglang` (it imitates
    bench_offline_throughput's warm-up) or `none` (`prepare` runs them whatever the policy)."""
    return first_forwards(cfg) if cfg.benchmark.warmup.policy == "dataset" else []
