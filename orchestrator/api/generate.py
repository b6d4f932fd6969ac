"""SGLang's `/generate` request body: one model for the router's ingress, the simulated engine and the clients.

It follows SGLang 0.5.17's `GenerateReqInput` (text or input_ids, one prompt or a batch, per-prompt lists,
sampling_params, stream, logprob fields, bootstrap_host/port/room for PD) and `SamplingParams.verify`, and is
stricter where SGLang would fail late or silently: exactly one of text/input_ids (SGLang lets text win), strict
JSON types (no "5" for 5, no true for 1), a per-prompt list must have one entry per prompt, no empty prompt,
only n=1 (a PD pair has one bootstrap room per prompt). As SGLang, a batch's rids must be unique.
Fields SGLang has and we do not model pass through (`extra="allow"`). Every error is one line naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams.max_new_tokens when a request does not say

Port = Annotated[int, Field(ge=1, le=65535)]
Room = Annotated[int, Field(ge=0, lt=2**64)]


class SamplingParams(BaseModel):
    """SGLang's sampling parameters with the ranges its `SamplingParams.verify` enforces; others pass through."""

    model_config = ConfigDict(extra="allow", strict=True)

    max_new_tokens: int = Field(SGLANG_DEFAULT_MAX_NEW_TOKENS, ge=0)
    min_new_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)  # the simulator accepts it; its outputs are deterministic anyway
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0, le=1)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = Field(1, ge=1, description="only n=1: one bootstrap room per prompt, and the simulator answers once")

    @model_validator(mode="after")
    def _sglang_verify(self) -> "SamplingParams":
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        if self.n != 1:
            raise ValueError(f"n={self.n}: only n=1 is served (a PD pair has one bootstrap room per prompt); "
                             "send the prompt n times instead")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens "
                             f"({self.max_new_tokens})")
        return self


# fields that may be one value for the whole batch or a list with one value per prompt
PER_PROMPT = ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
              "bootstrap_host", "bootstrap_port", "bootstrap_room")


class GenerateBody(BaseModel):
    """SGLang `/generate`: one prompt (text or input_ids) or a batch, with SGLang's per-prompt fields."""

    model_config = ConfigDict(extra="allow", strict=True)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: Annotated[int, Field(ge=0)] | list[Annotated[int, Field(ge=0)]] | None = None
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: Port | list[Port | None] | None = None
    bootstrap_room: Room | list[Room | None] | None = None

    @model_validator(mode="after")
    def _prompts_and_batch_lists(self) -> "GenerateBody":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("text, input_ids: send exactly one of them (the prompt as text, or as token ids)")
        prompts = self.text if self.text is not None else self.input_ids
        if self.input_ids == []:
            raise ValueError("input_ids: empty prompt; send at least one token id")
        if self.is_batch:
            if not prompts:
                raise ValueError("text: empty batch; send at least one prompt")
            for i, ids in enumerate(self.input_ids or []):
                if not ids:
                    raise ValueError(f"input_ids.{i}: empty prompt; send at least one token id per prompt")
        n = self.batch_size
        for name in PER_PROMPT:
            value = getattr(self, name)
            if isinstance(value, list) and not self.is_batch:
                raise ValueError(f"{name}: a list is for a batch (text or input_ids as a list of prompts); "
                                 "send one value for one prompt")
            if isinstance(value, list) and len(value) != n:
                raise ValueError(f"{name}: {len(value)} values for a batch of {n} prompts; send one per prompt "
                                 "or one value for all")
        if isinstance(self.rid, list) and len(set(self.rid)) != len(self.rid):
            twice = sorted({r for r in self.rid if self.rid.count(r) > 1})
            raise ValueError(f"rid: {twice} used more than once in the batch; send unique request ids")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids and isinstance(self.input_ids[0], list))

    @property
    def batch_size(self) -> int:
        prompts = self.text if self.text is not None else self.input_ids
        return len(prompts or ()) if self.is_batch else 1

    def per_prompt(self, name: str, i: int) -> Any:
        """Field `name` for prompt i: its own entry of a per-prompt list, else the one value."""
        value = getattr(self, name)
        return value[i] if isinstance(value, list) else value


class BadRequest(ValueError):
    """A request body that cannot be served; its text is the one-line message the client gets."""


def _field_path(loc: Sequence[Any]) -> str:
    """pydantic's error location without union-branch tags or FastAPI's 'body' ('input_ids.list[int].0' ->
    'input_ids.0')."""
    tags = {"body", "int", "str", "float", "bool", "none"}
    parts = [str(p) for p in loc if isinstance(p, int) or not (p in tags or "[" in p or "-" in p or p[:1].isupper())]
    return ".".join(parts)


def invalid_body_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """One line for the first validation error: the field, what is wrong, what was sent."""
    if not errors:
        return "invalid request"
    e = errors[0]
    kind = e.get("type", "")
    if kind == "json_invalid":
        return f"invalid request: body is not valid JSON ({(e.get('ctx') or {}).get('error', 'parse error')})"
    where = _field_path(e.get("loc", ()))
    if kind in ("model_type", "model_attributes_type", "dict_type") and not where:
        if isinstance(e.get("input"), bytes):  # FastAPI parses JSON only under a JSON content type (curl -d: a form)
            return ("invalid request: body: not read as JSON (its Content-Type is not application/json); send the "
                    "header Content-Type: application/json")
        return f"invalid request: body: send a JSON object (got {type(e.get('input')).__name__})"
    msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "missing":
        return f"invalid request: {where}: required, not sent"
    if kind == "value_error":  # a validator's own message already says what to send
        return f"invalid request: {where + ': ' if where else ''}{msg}"
    got = json.dumps(e.get("input"), default=str)
    got = got if len(got) <= 40 else got[:37] + "..."
    return f"invalid request: {where or 'body'}: {msg} (got {got})"


def invalid_field(errors: Sequence[Mapping[str, Any]]) -> str | None:
    """The field the first validation error is about (OpenAI's error `param`), None for the body as a whole."""
    if not errors or errors[0].get("type") == "json_invalid":
        return None
    return _field_path(errors[0].get("loc", ())) or None


def parse_generate_body(raw: bytes | str) -> GenerateBody:
    """A /generate body from its JSON text; BadRequest with the one-line message when it is not valid."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid request: body is not valid JSON ({exc})") from None
    try:
        return GenerateBody.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(invalid_body_message(exc.errors())) from None
