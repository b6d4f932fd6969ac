"""A sampled batch (SampledPrompt, SampledBatch) and its on-disk cache, shared by the ShareGPT and random samplers.

Sampled batches are cached under the user cache dir, keyed by everything that decides their content (sampler,
dataset file identity, tokenizer fingerprint, seed, size, options); a damaged entry is sampled again, not trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.records import BenchRequest
from orchestrator.workload.sharegpt_file import DatasetStats, file_identity
from orchestrator.workload.tokenizer import FaithfulTokenizer, user_cache_dir, write_atomically

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the sampling algorithm or the cache layout changes


@dataclass
class SampledPrompt:
    """One prompt of a sampled batch. prompt_len/output_len are SGLang's counts (special tokens included)."""

    index: int
    prompt: str
    prompt_ids: list[int]  # what the server would tokenize the prompt to; sent as input_ids
    prompt_len: int
    output_len: int

    def to_request(self, with_text: bool = False) -> BenchRequest:
        return BenchRequest(
            index=self.index,
            input_ids=self.prompt_ids,
            output_len=self.output_len,
            prompt_len=self.prompt_len,
            text=self.prompt if with_text else None,
        )


@dataclass
class SampledBatch:
    """A sampled batch with the counts that explain it."""

    prompts: list[SampledPrompt]
    dataset: DatasetStats
    candidates_walked: int  # shuffled candidates examined before the batch was full
    rejected_too_short: int = 0  # prompt_len < 2 or output_len < 2
    rejected_over_context: int = 0  # prompt_len + output_len > context_len
    from_cache: bool = False

    @property
    def total_input_tokens(self) -> int:
        return sum(p.prompt_len for p in self.prompts)

    @property
    def total_output_tokens(self) -> int:
        return sum(p.output_len for p in self.prompts)

    def requests(self, with_text: bool = False) -> list[BenchRequest]:
        return [p.to_request(with_text) for p in self.prompts]



def check_argument(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} {rule} (got {value!r})")



def batch_cache_key(
    kind: str, path: Path, tokenizer: FaithfulTokenizer, seed: int, num_prompts: int, options: dict
) -> str:
    fields = {
        "format": CACHE_FORMAT,
        "kind": kind,
        "dataset": file_identity(path),
        "tokenizer": tokenizer.fingerprint,
        "seed": seed,
        "num_prompts": num_prompts,
        **options,
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]
    return f"{kind}-seed{seed}-n{num_prompts}-{digest}"


def _cache_path(key: str) -> Path:
    return user_cache_dir() / "batches" / f"{key}.json"


def read_cached_batch(key: str) -> SampledBatch | None:
    path = _cache_path(key)
    try:
        raw = json.loads(path.read_bytes())
        batch = SampledBatch(
            prompts=[SampledPrompt(**p) for p in raw["prompts"]],
            dataset=DatasetStats(**raw["dataset"]),
            candidates_walked=raw["candidates_walked"],
            rejected_too_short=raw["rejected_too_short"],
            rejected_over_context=raw["rejected_over_context"],
            from_cache=True,
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:  # a damaged cache entry is rebuilt, not trusted
        log.warning("ignoring unreadable cached batch %s (%s); sampling again", path, e)
        return None
    log.info("sampled batch from cache %s (ShareGPT %s)", path, batch.dataset.summary())
    return batch


def write_cached_batch(key: str, batch: SampledBatch) -> None:
    body = asdict(batch)
    body.pop("from_cache")
    try:
        write_atomically(_cache_path(key), json.dumps(body, separators=(",", ":")).encode())
    except OSError as e:  # a read-only home must not stop a run; it only costs a re-sample next time
        log.warning("could not cache the sampled batch in %s (%s)", _cache_path(key).parent, e)
