"""Simulated /generate: a body validated by orchestrator.api.generate, split into one Item per prompt; text <-> ids."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

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
        self.text = ""
        self.surr_offset = 0
        self.read_offset = 0

    def update(self, codec: TextCodec, ids: list[int]) -> str:
        if len(ids) < self.read_offset:  # not the same growing sequence: start over
            self.__init__()
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


def normalise(body: GenerateBody, codec: TextCodec) -> list[Item]:
    """A validated body -> one Item per prompt, as SGLang's GenerateReqInput normalises a batch."""
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        prompts = [codec.encode(t) for t in texts]
    else:
        prompts = body.input_ids if body.is_batch else [body.input_ids]  # type: ignore[assignment,list-item]
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
                input_ids=list(prompt),  # type: ignore[arg-type]
                params=body.per_prompt("sampling_params", i) or SamplingParams(),
                bootstrap_host=body.per_prompt("bootstrap_host", i),
                bootstrap_port=body.per_prompt("bootstrap_port", i),
                bootstrap_room=room_i,
            )
        )
    return items
