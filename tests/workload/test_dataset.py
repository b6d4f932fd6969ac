"""ShareGPT batch: SGLang 0.5.17's sampling reproduced exactly, salvage of the packaged file, bad input."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from orchestrator.records import BenchRequest
from orchestrator.workload.dataset import sample_sharegpt, sample_sharegpt_batch
from orchestrator.workload.random_prompts import sample_random_requests
from orchestrator.workload.sharegpt_file import DatasetError, load_sharegpt
from orchestrator.workload.tokenizer import load_tokenizer
from tests.support import log_case

SEED = 2025


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path / "pd-cache"))
    return tmp_path / "pd-cache"


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path_factory.mktemp("tok-cache")))
        return load_tokenizer()


@pytest.fixture(scope="module")
def packaged_pairs():
    return load_sharegpt().pairs


def sglang_sample_sharegpt(tokenizer, pairs, num_requests, seed, context_len=None, fixed_output_len=None):
    """SGLang 0.5.17's walk, one candidate at a time on the global RNG: the specification we must equal."""
    dataset = list(pairs)
    saved = random.getstate()
    try:
        random.seed(seed)
        random.shuffle(dataset)
    finally:
        random.setstate(saved)
    rows = []
    for prompt, completion in dataset:
        if len(rows) == num_requests:
            break
        prompt_len = len(tokenizer.encode(prompt))
        output_len = len(tokenizer.encode(completion)) if fixed_output_len is None else fixed_output_len
        if prompt_len < 2 or output_len < 2:
            continue
        if context_len and prompt_len + output_len > context_len:
            continue
        rows.append((prompt, prompt_len, output_len))
    return rows


# ----------------------------------------------------------------------------------- the packaged data


def test_packaged_file_is_salvaged_with_one_warning(caplog, monkeypatch):
    import orchestrator.workload.sharegpt_file as sharegpt_file

    monkeypatch.setattr(sharegpt_file, "_REPORTED", set())  # the notice is once per process: forget earlier tests' reads
    caplog.set_level(logging.INFO, logger="orchestrator.workload.sharegpt_file")
    data = load_sharegpt()
    assert data.stats.items_read == 17_671  # complete conversations before the cut
    assert data.stats.truncated and "premature EOF" in data.stats.parse_error
    assert data.stats.skipped == {"under_2_turns": 271}
    assert data.stats.conversations == len(data.pairs) == 17_400
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "17,671" in warnings[0].getMessage() and "salvaged" in warnings[0].getMessage()


def test_seed_2025_batch_of_1000_is_pinned(r1, private_cache):
    batch = sample_sharegpt_batch(r1, 1000, SEED)
    assert len(batch.prompts) == 1000
    assert batch.total_input_tokens == 305_641
    assert batch.total_output_tokens == 202_540
    assert batch.candidates_walked == 1000 and batch.rejected_too_short == 0
    pinned = {  # index: (first 12 prompt ids, prompt_len, output_len)
        0: ([0, 43, 4571, 5958, 304, 1635, 260, 11306, 1950, 304, 1950, 396], 200, 349),
        1: ([0, 43, 4571, 5958, 304, 3551, 260, 4165, 296, 8397, 396, 10340], 212, 274),
        999: ([0, 9673, 412, 260, 12770, 294, 11004, 14280, 362, 23623, 82901, 32386], 64, 337),
    }
    for index, (ids, prompt_len, output_len) in pinned.items():
        prompt = batch.prompts[index]
        assert (prompt.prompt_ids[:12], prompt.prompt_len, prompt.output_len) == (ids, prompt_len, output_len)
        assert len(prompt.prompt_ids) == prompt.prompt_len
    assert batch.prompts[0].prompt.startswith("I'm trying to make a jest test")
    assert [p.index for p in batch.prompts] == list(range(1000))
    assert batch.dataset.items_read == 17_671 and not batch.from_cache

    again = sample_sharegpt_batch(r1, 1000, SEED)
    assert again.from_cache and again.prompts == batch.prompts and again.dataset == batch.dataset
    assert len(list(private_cache.glob("batches/sharegpt-*.json"))) == 1


def test_private_rng_gives_the_global_rng_order():
    saved, saved_np = random.getstate(), np.random.get_state()
    try:
        random.seed(SEED)
        global_order = list(range(5000))
        random.shuffle(global_order)
        np.random.seed(SEED)
        global_lens = np.random.randint(1, 257, size=32).tolist()
    finally:
        random.setstate(saved)
        np.random.set_state(saved_np)
    private_order = list(range(5000))
    random.Random(SEED).shuffle(private_order)
    assert private_order == global_order
    assert np.random.RandomState(SEED).randint(1, 257, size=32).tolist() == global_lens


@pytest.mark.parametrize(
    "num,context_len,fixed_output_len",
    [(300, None, None), (200, 600, None), (150, None, 4), (100, 300, 64)],
)
def test_chunked_walk_equals_sglangs_sequential_walk(r1, packaged_pairs, num, context_len, fixed_output_len):
    ours = sample_sharegpt(r1, num, SEED, context_len=context_len, fixed_output_len=fixed_output_len)
    spec = sglang_sample_sharegpt(r1, packaged_pairs, num, SEED, context_len, fixed_output_len)
    assert [(p.prompt, p.prompt_len, p.output_len) for p in ours] == spec
    if context_len:
        assert all(p.prompt_len + p.output_len <= context_len for p in ours)
    if fixed_output_len:
        assert {p.output_len for p in ours} == {fixed_output_len}


def test_rejections_across_chunk_boundaries_keep_sglangs_order(r1, tmp_path):
    # Every third conversation has a one-token side, so the walk needs several chunks to fill the batch.
    convs = []
    for i in range(120):
        prompt = "" if i % 3 == 0 else f"Question {i}: explain item {i} please"
        answer = "x" if i % 5 == 0 else f"Answer {i} with some words"
        convs.append({"id": str(i), "conversations": [{"value": prompt}, {"value": answer}]})
    path = _write(tmp_path / "short.json", json.dumps(convs))
    pairs = load_sharegpt(path).pairs
    for num in (10, 40, 64):
        batch = sample_sharegpt_batch(r1, num, 7, dataset_path=path)
        spec = sglang_sample_sharegpt(r1, pairs, num, 7)
        assert [(p.prompt, p.prompt_len, p.output_len) for p in batch.prompts] == spec
        assert batch.candidates_walked == num + batch.rejected_too_short
        assert batch.rejected_too_short > 0


def test_prompts_become_bench_requests(r1, tmp_path):
    path = _write(tmp_path / "two.json", json.dumps([GOOD, GOOD]))
    prompt = sample_sharegpt(r1, 1, SEED, dataset_path=path)[0]
    request = prompt.to_request()
    assert isinstance(request, BenchRequest)
    assert request.input_ids == prompt.prompt_ids == r1.encode(GOOD["conversations"][0]["value"])
    assert (request.prompt_len, request.output_len, request.text) == (prompt.prompt_len, prompt.output_len, None)
    assert prompt.to_request(with_text=True).text == GOOD["conversations"][0]["value"]


def test_cache_key_follows_the_options_and_a_damaged_entry_is_rebuilt(r1, tmp_path, private_cache, caplog):
    convs = [_conv({"value": f"prompt number {i}"}, {"value": f"reply {i} " * i}) for i in range(2, 40)]
    path = _write(tmp_path / "small.json", json.dumps(convs))
    base = sample_sharegpt(r1, 10, 1, dataset_path=path)
    sample_sharegpt(r1, 10, 2, dataset_path=path)
    sample_sharegpt(r1, 10, 1, dataset_path=path, fixed_output_len=8)
    entries = sorted(private_cache.glob("batches/*.json"))
    assert len(entries) == 3
    for entry in entries:
        entry.write_text("{ damaged")
    caplog.set_level(logging.WARNING, logger="orchestrator.workload.sampled_batch")
    assert sample_sharegpt(r1, 10, 1, dataset_path=path) == base
    assert any("unreadable cached batch" in r.getMessage() for r in caplog.records)
    # Editing the dataset changes its identity, so the old batch is not reused.
    _write(path, json.dumps(list(reversed(convs))))
    assert not sample_sharegpt_batch(r1, 10, 1, dataset_path=path).from_cache


# ------------------------------------------------------------------------------------ random requests


def sglang_random_requests(tokenizer, pairs, input_len, output_len, num_prompts, range_ratio, seed):
    """bench_offline_throughput's warm-up batch: seeds, the ShareGPT shuffle, then the random dataset."""
    saved, saved_np = random.getstate(), np.random.get_state()
    try:
        random.seed(seed)
        np.random.seed(seed)
        random.shuffle(list(pairs))  # get_dataset(sharegpt) ran first on the same global RNG
        input_lens = np.random.randint(max(int(input_len * range_ratio), 1), input_len + 1, size=num_prompts)
        output_lens = np.random.randint(max(int(output_len * range_ratio), 1), output_len + 1, size=num_prompts)
        input_lens = [max(0, int(n) - 1) for n in input_lens]  # one special token (BOS) is added by the server
        dataset = list(pairs)
        random.shuffle(dataset)
    finally:
        random.setstate(saved)
        np.random.set_state(saved_np)
    rows = []
    for prompt, _ in dataset:
        i = len(rows)
        if i == num_prompts:
            break
        ids = tokenizer.encode(prompt)
        if not ids:
            continue
        target = input_lens[i]
        ids = ids[:target] if len(ids) > target else (ids * -(-target // len(ids)))[:target]
        rows.append((tokenizer.decode(ids), input_lens[i], int(output_lens[i])))
    return rows


@pytest.mark.parametrize("input_len,output_len,range_ratio", [(256, 16, 1.0), (2048, 128, 0.5)])
def test_random_requests_match_sglangs_warmup_batch(r1, packaged_pairs, input_len, output_len, range_ratio):
    ours = sample_random_requests(r1, input_len, output_len, 16, range_ratio, SEED, after_sharegpt_shuffle=True)
    spec = sglang_random_requests(r1, packaged_pairs, input_len, output_len, 16, range_ratio, SEED)
    assert [(r.text, r.prompt_len, r.output_len) for r in ours] == spec
    assert [r.index for r in ours] == list(range(16))
    for r in ours:
        assert int(input_len * range_ratio) - 1 <= r.prompt_len <= input_len - 1
        assert r.input_ids == r1.encode(r.text) and r.input_ids[0] == r1.bos_id
    if range_ratio == 1.0:
        assert {r.prompt_len for r in ours} == {input_len - 1} and {r.output_len for r in ours} == {output_len}


def test_random_requests_without_the_preceding_shuffle_use_a_fresh_rng(r1):
    fresh = sample_random_requests(r1, 64, 8, 4, 1.0, SEED)
    warm = sample_random_requests(r1, 64, 8, 4, 1.0, SEED, after_sharegpt_shuffle=True)
    assert [r.text for r in fresh] != [r.text for r in warm]
    assert sample_random_requests(r1, 64, 8, 4, 1.0, SEED) == fresh  # deterministic (and cached)


# ------------------------------------------------------------------------------------------- bad input

GOOD = {"id": "ok", "conversations": [
    {"from": "human", "value": "Hello there, how are you today?"},
    {"from": "gpt", "value": "I am fine, thank you for asking."},
]}
GOOD_TEXT = json.dumps(GOOD)


def _conv(*turns) -> dict:
    return {"id": "t", "conversations": list(turns)}


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# (case, file content or None for a missing file, expected): expected is ("error", words in the message)
# or ("kept", conversations, skipped-by-reason, truncated).
LOAD_CASES = [
    ("missing file", None, ("error", "does not exist")),
    ("empty file", "", ("error", "is empty")),
    ("whitespace only", " \n\t\n", ("error", "is empty")),
    ("not JSON", "hello, world", ("error", "not a JSON array")),
    ("JSON scalar", "42", ("error", "not a JSON array")),
    ("object at top level", json.dumps({"data": [GOOD]}), ("error", "JSON object, expected an array")),
    ("empty array", "[]", ("error", "no usable conversation")),
    ("cut inside the first item", '[{"conversations": [{"value": "hi', ("error", "before its first complete")),
    ("cut after two items", f"[{GOOD_TEXT}, {GOOD_TEXT}, {GOOD_TEXT[:40]}", ("kept", 2, {}, True)),
    ("garbage after one item", f"[{GOOD_TEXT}, {{oops}}, {GOOD_TEXT}]", ("kept", 1, {}, True)),
    ("invalid UTF-8 after one item", f"[{GOOD_TEXT}, ".encode() + b'{"x": "\xff\xfe"}]', ("kept", 1, {}, True)),
    ("items not objects", json.dumps([1, "text", None, [GOOD], GOOD]), ("kept", 1, {"not_an_object": 4}, False)),
    ("no conversations key", json.dumps([{"id": "a"}, GOOD]), ("kept", 1, {"no_conversations": 1}, False)),
    ("one turn", json.dumps([_conv(GOOD["conversations"][0]), GOOD]), ("kept", 1, {"under_2_turns": 1}, False)),
    ("zero turns", json.dumps([_conv(), GOOD]), ("kept", 1, {"under_2_turns": 1}, False)),
    ("singular 'conversation' key", json.dumps([{"conversation": GOOD["conversations"]}]), ("kept", 1, {}, False)),
    ("conversations not a list", json.dumps([{"conversations": "hi there"}, {"conversations": None}, GOOD]),
     ("kept", 1, {"bad_conversations": 2}, False)),
    ("turn without value", json.dumps([_conv({"from": "human", "text": "hi"}, {"value": "yo"}), GOOD]),
     ("kept", 1, {"malformed_turn": 1}, False)),
    ("turn not an object", json.dumps([_conv("hi", {"value": "yo"}), GOOD]),
     ("kept", 1, {"malformed_turn": 1}, False)),
    ("non-string content", json.dumps([_conv({"value": 5}, {"value": "a"}), _conv({"value": "a"}, {"value": None}),
                                        _conv({"value": ["a"]}, {"value": "b"}), GOOD]),
     ("kept", 1, {"non_string_content": 3}, False)),
    ("every item unusable", json.dumps([1, {"id": "a"}, _conv({"value": 5}, {"value": 6})]),
     ("error", "no usable conversation")),
]


@pytest.mark.parametrize("name,content,expected", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_bad_dataset_files_get_clear_errors_or_counted_skips(tmp_path, caplog, name, content, expected):
    path = tmp_path / "ShareGPT.json"
    if content is not None:
        _write(path, content)
    caplog.set_level(logging.INFO, logger="orchestrator.workload.sharegpt_file")
    if expected[0] == "error":
        with pytest.raises(DatasetError) as err:
            load_sharegpt(path)
        assert expected[1] in str(err.value)
        assert str(path) in str(err.value) and "dataset_path" in str(err.value)  # names the file and the fix
        log_case("bad input: dataset file", "error naming file + fix")
        return
    _, kept, skipped, truncated = expected
    data = load_sharegpt(path)
    assert (data.stats.conversations, data.stats.skipped, data.stats.truncated) == (kept, skipped, truncated)
    assert len(data.pairs) == kept and all(isinstance(p, str) and isinstance(c, str) for p, c in data.pairs)
    records = [r for r in caplog.records if r.name == "orchestrator.workload.sharegpt_file"]
    assert len(records) == 1  # one summary per load, never one line per item
    unusual = set(skipped) - {"under_2_turns", "no_conversations"}
    assert records[0].levelno == (logging.WARNING if truncated or unusual else logging.INFO)
    log_case("bad input: dataset file", "salvaged, one summary line")


def test_a_directory_is_not_a_dataset(tmp_path):
    with pytest.raises(DatasetError, match="not a regular file"):
        load_sharegpt(tmp_path)


def test_too_few_usable_conversations_for_the_batch(r1, tmp_path):
    path = _write(tmp_path / "three.json", json.dumps([GOOD, GOOD, _conv({"value": ""}, {"value": "yo"})]))
    with pytest.raises(DatasetError) as err:
        sample_sharegpt(r1, 5, SEED, dataset_path=path)
    message = str(err.value)
    assert "only 2 of its 3 conversations" in message and "num_prompts=5" in message and str(path) in message
    with pytest.raises(DatasetError, match="fewer than num_prompts=5"):
        sample_random_requests(r1, 16, 4, 5, 1.0, SEED, dataset_path=tmp_path / "three.json")


ARG_CASES = [
    ("num_prompts 0", lambda tok: sample_sharegpt(tok, 0, SEED), "num_prompts"),
    ("fixed_output_len 3", lambda tok: sample_sharegpt(tok, 1, SEED, fixed_output_len=3), "fixed_output_len"),
    ("context_len 1", lambda tok: sample_sharegpt(tok, 1, SEED, context_len=1), "context_len"),
    ("random input_len 0", lambda tok: sample_random_requests(tok, 0, 8, 1, 1.0, SEED), "input_len"),
    ("random output_len 0", lambda tok: sample_random_requests(tok, 8, 0, 1, 1.0, SEED), "output_len"),
    ("random range_ratio 1.5", lambda tok: sample_random_requests(tok, 8, 8, 1, 1.5, SEED), "range_ratio"),
]


@pytest.mark.parametrize("name,call,field", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_bad_sampling_arguments_name_the_argument(r1, name, call, field):
    with pytest.raises(ValueError) as err:
        call(r1)
    assert str(err.value).startswith(field) and "got" in str(err.value)
    log_case("bad input: dataset arguments", "named the argument")
