"""SGLang's `random` dataset: prompts of sampled lengths cut from ShareGPT text (sweep levels, warm-up)."""

from __future__ import annotations

import os
import random

import numpy as np

from orchestrator.records import BenchRequest
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


def sample_random_requests(
    tokenizer: FaithfulTokenizer,
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    seed: int,
    dataset_path: str | os.PathLike | None = None,
    after_sharegpt_shuffle: bool = False,
    use_cache: bool = True,
) -> list[BenchRequest]:
    """Requests of chosen lengths cut or tiled from shuffled ShareGPT prompts, as SGLang's `random` dataset.

    Lengths: `np.random.randint(max(int(full * range_ratio), 1), full + 1)` per prompt (inputs first, then
    outputs) after `np.random.seed(seed)`; each input length is reduced by the tokenizer's special-token
    count because the server adds them again. Prompt text is the decoded cut; `prompt_ids` is what the
    server tokenizes that text to. `after_sharegpt_shuffle=True` reproduces bench_offline_throughput's
    warm-up batch, whose `random.shuffle` runs after the ShareGPT sampler's shuffle on the same RNG.
    Requests carry the text too (SGLang sends text); `prompt_len` is SGLang's count, one BOS short of
    `len(input_ids)`.
    """
    check_argument(input_len >= 1, "input_len", input_len, "must be >= 1")
    check_argument(output_len >= 1, "output_len", output_len, "must be >= 1")
    check_argument(num_prompts >= 1, "num_prompts", num_prompts, "must be >= 1")
    check_argument(0.0 <= range_ratio <= 1.0, "range_ratio", range_ratio, "must be between 0 and 1")
    options = {
        "input_len": input_len,
        "output_len": output_len,
        "range_ratio": range_ratio,
        "after_sharegpt_shuffle": after_sharegpt_shuffle,
    }
    with dataset_file(dataset_path) as path:
        key = batch_cache_key("random", path, tokenizer, seed, num_prompts, options)
        batch = read_cached_batch(key) if use_cache else None
        if batch is None:
            data = load_sharegpt(path)
            batch = _walk_random(
                tokenizer, data, input_len, output_len, num_prompts, range_ratio, seed, after_sharegpt_shuffle
            )
            if use_cache:
                write_cached_batch(key, batch)
    return batch.requests(with_text=True)


def _walk_random(
    tokenizer: FaithfulTokenizer,
    data: ShareGPTData,
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    seed: int,
    after_sharegpt_shuffle: bool,
) -> SampledBatch:
    # RandomState(seed) is the legacy generator that np.random.seed(seed) resets for np.random.randint.
    np_rng = np.random.RandomState(seed)
    full_input_lens = _random_lens(np_rng, input_len, range_ratio, num_prompts)
    input_lens = [max(0, n - tokenizer.num_special_tokens) for n in full_input_lens]
    output_lens = _random_lens(np_rng, output_len, range_ratio, num_prompts)
    rng = random.Random(seed)
    pairs = list(data.pairs)
    if after_sharegpt_shuffle:
        rng.shuffle(list(range(len(pairs))))  # shuffle's RNG use depends only on the list's length
    rng.shuffle(pairs)
    batch = SampledBatch(prompts=[], dataset=data.stats, candidates_walked=0)
    texts: list[str] = []
    pos = 0
    while len(texts) < num_prompts and pos < len(pairs):
        chunk = pairs[pos : pos + num_prompts - len(texts) + 8]
        pos += len(chunk)
        for ids in tokenizer.encode_batch([prompt for prompt, _ in chunk]):
            i = len(texts)
            if i == num_prompts:
                break
            batch.candidates_walked += 1
            if not ids:  # SGLang skips empty prompts (only possible without BOS)
                batch.rejected_too_short += 1
                continue
            target = input_lens[i]
            repeats = 1 if len(ids) > target else (target + len(ids) - 1) // len(ids)
            texts.append(tokenizer.decode((ids * repeats)[:target]))
    if len(texts) < num_prompts:
        raise DatasetError(
            data.stats.path,
            f"has only {len(texts):,} non-empty prompts, fewer than num_prompts={num_prompts:,}",
            "lower num_prompts or use the full ShareGPT file",
        )
    for i, (text, ids) in enumerate(zip(texts, tokenizer.encode_batch(texts))):
        batch.prompts.append(SampledPrompt(i, text, ids, input_lens[i], output_lens[i]))
    return batch


def _random_lens(np_rng: np.random.RandomState, full_len: int, range_ratio: float, num: int) -> list[int]:
    return np_rng.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num).tolist()
