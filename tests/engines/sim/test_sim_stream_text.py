"""Streamed text of the simulated engine: detokenized incrementally (SGLang's way), equal to the whole decode."""

from __future__ import annotations

import random

from orchestrator.engines.sim.requests import IncrementalText, TextCodec


class CountingCodec(TextCodec):
    """The real tokenizer codec, remembering how many ids each decode call got."""

    def __init__(self) -> None:
        super().__init__(None)
        self.sizes: list[int] = []

    def decode(self, ids: list[int]) -> str:
        self.sizes.append(len(ids))
        return super().decode(ids)


def test_incremental_text_grows_by_prefixes_and_ends_equal_to_the_whole_decode():
    codec = CountingCodec()
    assert codec.kind == "tokenizer"
    ids = codec.encode("Grüße aus Zürich — 東京の天気は晴れです 🌤️. " * 20)
    rng = random.Random(7)
    ids += [rng.randrange(1000, 100000) for _ in range(300)]  # arbitrary model output, as the sim emits
    detok = IncrementalText()
    texts = []
    for n in range(1, len(ids) + 1):
        texts.append(detok.update(codec, ids[:n]))
    whole = codec.decode(ids)
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)  # a client reading cumulative chunks never sees text taken back
    assert whole.startswith(texts[-1]) and len(whole) - len(texts[-1]) <= 4  # at most a held-back partial char
    # each step decodes a small window, not everything so far: linear, not quadratic, in the output length
    steps = codec.sizes[: 2 * len(ids)]
    assert max(steps) <= 16 and sum(steps) < 10 * len(ids)


def test_incremental_text_holds_back_an_unfinished_utf8_character():
    codec = TextCodec(None)
    ids = codec.encode("a🌤️b")
    detok = IncrementalText()
    partial = [detok.update(codec, ids[:n]) for n in range(1, len(ids) + 1)]
    assert all("\ufffd" not in t for t in partial)
    assert partial[-1] == codec.decode(ids)


def test_a_shorter_sequence_starts_the_state_over():
    codec = TextCodec(None)
    detok = IncrementalText()
    a = codec.encode("first sequence of words")
    for n in range(1, len(a) + 1):
        detok.update(codec, a[:n])
    b = codec.encode("two")
    assert detok.update(codec, b) == codec.decode(b)
