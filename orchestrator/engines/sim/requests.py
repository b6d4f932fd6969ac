"""Simulated /generate: a body validated by orchestrator.api.generate, split into one Item per prompt; text <-> ids."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, cast

from orchestrator.api.generate import BadRequest, GenerateBody, SamplingParams

log = logging.getLogger("orchestrator.engines.sim.server")


# ----- text <-> ids ----------------------------------------------------------------------------------------
class TextCodec:
    """The model's tokenizer (orchestrator.workload.tokenizer) when it loads, else bytes (labelled in /server_info)."""

    def __init__(self, model_path: str | None, preset: str | None = None):
        self.kind = "bytes"
        self._tok: Any = None
        try:
            from orchestrator.workload.tokenizer import load_tokenizer

            self._tok = load_tokenizer(model_path, preset)
            self.kind = "tokenizer"
        except Exception as exc:  # no tokenizer available must not stop a simulator; ids still work
            log.warning("tokenizer unavailable (%s); text prompts are tokenized as UTF-8 bytes", exc)

    def encode(self, text: str) -> list[int]:
        if self._tok is not None:
            return list(self._tok.encode(text))
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            try:
                return self._tok.decode(ids)
            except Exception:
                pass
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


class IncrementalText:
    """SGLang's incremental detokenization: decode only a window of recent ids; hold back a partial character.

    The window (surr_offset..read_offset) is re-decoded with the new ids; its text grows by the difference,
    unless the new text ends in U+FFFD (an unfinished UTF-8 sequence), which waits for the next ids.
    """

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.text = ""
        self.surr_offset = 0
        self.read_offset = 0

    def update(self, codec: TextCodec, ids: list[int]) -> str:
        if len(ids) < self.read_offset:  # not the same growing sequence: start over
            self._start()
        surr = codec.decode(ids[self.surr_offset : self.read_offset])
        new = codec.decode(ids[self.surr_offset :])
        if len(new) > len(surr) and not new.endswith("\ufffd"):
            self.text += new[len(surr) :]
            self.surr_offset, self.read_offset = self.read_offset, len(ids)
        return self.text


# ----- request bodies -------------------------------------------------------------------------------------
@dataclass
class Item:
    """One prompt of a /generate call, normalised."""

    index: int
    rid: str
    input_ids: list[int]
    params: SamplingParams
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None


def require_codec(codec: TextCodec | None) -> TextCodec:
    """The server's tokenizer; it loads before the server reports ready, so a text prompt before that is refused."""
    if codec is None:
        raise BadRequest("text prompts need the tokenizer, which is still loading; send input_ids or retry")
    return codec


def normalise(body: GenerateBody, codec: TextCodec | None) -> list[Item]:
    """A validated body -> one Item per prompt, as SGLang's GenerateReqInput normalises a batch."""
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        prompts = [require_codec(codec).encode(t) for t in texts]
    else:  # the body's validator made input_ids ints, or lists of ints for a batch
        prompts = cast("list[list[int]]", body.input_ids if body.is_batch else [body.input_ids])
    items = []
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise BadRequest(f"text.{i}: encodes to no token; send a non-empty prompt" if body.is_batch
                             else "text: encodes to no token; send a non-empty prompt")
        room = body.bootstrap_room
        room_i = room + i if isinstance(room, int) else body.per_prompt("bootstrap_room", i)  # as SGLang
        rid = body.per_prompt("rid", i)
        if rid is None:
            rid = uuid.uuid4().hex
        elif isinstance(body.rid, str) and body.is_batch:
            rid = f"{rid}_{i}"
        items.append(
            Item(
                index=i,
                rid=rid,
                input_ids=list(prompt),
                params=body.per_prompt("sampling_params", i) or SamplingParams(),
                bootstrap_host=body.per_prompt("bootstrap_host", i),
                bootstrap_port=body.per_prompt("bootstrap_port", i),
                bootstrap_room=room_i,
            )
        )
    return items
