"""ShareGPT batch: sample ShareGPT exactly as SGLang 0.5.17's bench tools do.

sharegpt_file.load_sharegpt (first two turns) -> sample_sharegpt (the benchmark batch; seeded shuffle, SGLang's
length filters) -> SampledPrompt -> BenchRequest. The random dataset (warm-up, sweeps) is random_prompts; both
cache their batches through sampled_batch.
"""

from __future__ import annotations

import logging
import os
import random

from orchestrator.workload.sampled_batch import (
    SampledBatch,
    SampledPrompt,
    batch_cache_key,
    check_argument,
    read_cached_batch,
    write_cached_batch,
)
from orchestrator.workload.sharegpt_file import DatasetError, ShareGPTData, dataset_file, load_sharegpt
from orchestrator.workload.tokenizer import FaithfulTokenizer

log = logging.getLogger(__name__)


def sample_sharegpt(
    tokenizer: FaithfulTokenizer,
    num_prompts: int,
    seed: int,
    dataset_path: str | os.PathLike | None = None,
    context_len: int | None = None,
    fixed_output_len: int | None = None,
    use_cache: bool = True,
) -> list[SampledPrompt]:
    """The benchmark batch as SGLang 0.5.17's `sample_sharegpt_requests` builds it (sample_sharegpt_batch)."""
    return sample_sharegpt_batch(
        tokenizer, num_prompts, seed, dataset_path, context_len, fixed_output_len, use_cache
    ).prompts


def sample_sharegpt_batch(
    tokenizer: FaithfulTokenizer,
    num_prompts: int,
    seed: int,
    dataset_path: str | os.PathLike | None = None,
    context_len: int | None = None,
    fixed_output_len: int | None = None,
    use_cache: bool = True,
) -> SampledBatch:
    """`random.seed(seed)`, shuffle the (turn 1, turn 2) pairs, then accept in order until `num_prompts`.

    Lengths count special tokens (BOS); a candidate is dropped when prompt_len < 2 or output_len < 2, or
    when prompt_len + output_len > context_len (if given). Candidates are tokenized in parallel chunks,
    but accepted strictly in shuffled order, so the result equals SGLang's one-at-a-time walk.
    """
    check_argument(num_prompts >= 1, "num_prompts", num_prompts, "must be >= 1")
    if fixed_output_len is not None:
        # SGLang raises "output_len too small" below 4.
        check_argument(fixed_output_len >= 4, "fixed_output_len", fixed_output_len, "must be >= 4 or unset")
    if context_len is not None:
        check_argument(context_len >= 4, "context_len", context_len, "must be >= 4 or unset")
    options = {"context_len": context_len, "fixed_output_len": fixed_output_len}
    with dataset_file(dataset_path) as path:
        key = batch_cache_key("sharegpt", path, tokenizer, seed, num_prompts, options)
        batch = read_cached_batch(key) if use_cache else None
        if batch is None:
            data = load_sharegpt(path)
            batch = _walk_sharegpt(tokenizer, data, num_prompts, seed, context_len, fixed_output_len)
            if use_cache:
                write_cached_batch(key, batch)
    log.info("#Input tokens: %d  #Output tokens: %d", batch.total_input_tokens, batch.total_output_tokens)
    return batch


def _walk_sharegpt(
    tokenizer: FaithfulTokenizer,
    data: ShareGPTData,
    num_prompts: int,
    seed: int,
    context_len: int | None,
    fixed_output_len: int | None,
) -> SampledBatch:
    pairs = list(data.pairs)
    # random.Random(seed) is the same Mersenne Twister that random.seed(seed) resets; shuffle on it
    # gives SGLang's order without touching the caller's global RNG.
    random.Random(seed).shuffle(pairs)
    batch = SampledBatch(prompts=[], dataset=data.stats, candidates_walked=0)
    pos = 0
    while len(batch.prompts) < num_prompts and pos < len(pairs):
        need = num_prompts - len(batch.prompts)
        chunk = pairs[pos : pos + need + need // 8 + 8]  # a little slack: some candidates get rejected
        pos += len(chunk)
        prompt_ids = tokenizer.encode_batch([prompt for prompt, _ in chunk])
        if fixed_output_len is None:
            output_lens = [len(ids) for ids in tokenizer.encode_batch([done for _, done in chunk])]
        else:
            output_lens = [fixed_output_len] * len(chunk)
        for (prompt, _), ids, output_len in zip(chunk, prompt_ids, output_lens):
            if len(batch.prompts) == num_prompts:
                break
            batch.candidates_walked += 1
            if len(ids) < 2 or output_len < 2:
                batch.rejected_too_short += 1
                continue
            if context_len and len(ids) + output_len > context_len:
                batch.rejected_over_context += 1
                continue
            batch.prompts.append(SampledPrompt(len(batch.prompts), prompt, ids, len(ids), output_len))
    if len(batch.prompts) < num_prompts:
        raise DatasetError(
            data.stats.path,
            f"only {len(batch.prompts):,} of its {len(pairs):,} conversations pass SGLang's length filters "
            f"(too short: {batch.rejected_too_short:,}, over context_len: {batch.rejected_over_context:,}), "
            f"fewer than num_prompts={num_prompts:,}",
            "lower benchmark.num_prompts, raise or unset context_len, or use the full ShareGPT file",
        )
    return batch
