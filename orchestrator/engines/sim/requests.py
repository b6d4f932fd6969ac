"""Simulated /generate bodies: SGLang's request fields, normalised into one Item per prompt, and text <-> ids."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("orchestrator.engines.sim.server")


# ----- text <-> ids ----------------------------------------------------------------------------------------
class TextCodec:
    """The model's tokenizer (orchestrator.workload.tokenizer) when it loads, else bytes (labelled in /server_info)."""

    def __init__(self, model_path: str | None):
        self.kind = "bytes"
        self._tok: Any = None
        try:
            from orchestrator.workload.tokenizer import load_tokenizer

            self._tok = load_tokenizer(model_path)
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
class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_new_tokens: int = Field(128, ge=0)
    ignore_eos: bool = False
    temperature: float = Field(1.0, ge=0)  # accepted; outputs are deterministic (dummy weights, greedy-like)


class GenerateBody(BaseModel):
    """The /generate fields the simulator uses; others are accepted and ignored, as SGLang ignores unused ones."""

    model_config = ConfigDict(extra="allow")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int | None] | None = None


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


class BadRequest(ValueError):
    """A 400 with SGLang's error body."""


def _pick(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) else value


def normalise(body: GenerateBody, codec: TextCodec) -> tuple[list[Item], bool]:
    """Body -> items (batch or single) as SGLang's GenerateReqInput normalises them."""
    if (body.text is None) == (body.input_ids is None):
        raise BadRequest("Either text or input_ids should be provided (exactly one of them).")
    if body.text is not None:
        is_batch = isinstance(body.text, list)
        prompts = [codec.encode(t) for t in (body.text if is_batch else [body.text])]  # type: ignore[union-attr]
    else:
        ids = body.input_ids or []
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]  # type: ignore[assignment]
    n = len(prompts)
    for name in ("sampling_params", "rid", "bootstrap_host", "bootstrap_port", "bootstrap_room"):
        value = getattr(body, name)
        if isinstance(value, list) and name != "sampling_params" and len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries but the batch has {n} prompts")
    if isinstance(body.sampling_params, list) and len(body.sampling_params) != n:
        raise BadRequest(f"sampling_params has {len(body.sampling_params)} entries but the batch has {n} prompts")
    items = []
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise BadRequest(f"prompt {i} is empty; send at least one token")
        room = body.bootstrap_room
        room_i = room + i if isinstance(room, int) else _pick(room, i)  # scalar room -> room + i, as SGLang
        rid = _pick(body.rid, i)
        if rid is None:
            rid = uuid.uuid4().hex
        elif isinstance(body.rid, str) and is_batch:
            rid = f"{rid}_{i}"
        items.append(
            Item(
                index=i,
                rid=rid,
                input_ids=list(prompt),
                params=_pick(body.sampling_params, i) or SamplingParams(),
                bootstrap_host=_pick(body.bootstrap_host, i),
                bootstrap_port=_pick(body.bootstrap_port, i),
                bootstrap_room=room_i,
            )
        )
    return items, is_batch
