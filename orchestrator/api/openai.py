"""OpenAI `/v1/completions` and `/v1/chat/completions` request bodies (with SGLang 0.5.17's extra fields), the
sampling parameters SGLang derives from them, and the chat templates of the models we serve.

One definition for the router's gateway and the simulated engine's OpenAI routes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.api.generate import SGLANG_DEFAULT_MAX_NEW_TOKENS, Port, Room

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


DEFAULT_CHAT_TOKENS = SGLANG_DEFAULT_MAX_NEW_TOKENS


class SglangExtras(BaseModel):
    """Fields SGLang's OpenAI routes take beyond OpenAI's: `min_tokens`, `ignore_eos`, a request id, and PD's
    bootstrap address (one value, or one per prompt of a batch, as SGLang's GenerateReqInput)."""

    model_config = ConfigDict(extra="ignore")

    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    rid: str | list[str] | None = None
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: Port | list[Port | None] | None = None
    bootstrap_room: Room | list[Room | None] | None = None


# OpenAI fields a PD pair behind /generate does not serve: a client that sets one gets a 400 naming it, not an answer
# that silently lacks what it asked for (logprobs: null, no tool calls, free text instead of JSON)
UNSERVED = ("logprobs", "top_logprobs", "echo", "logit_bias", "tools", "tool_choice", "functions", "function_call",
            "response_format", "suffix", "best_of")
# sampling fields passed to SGLang's /generate as they are (OpenAI's, and SGLang's extra ones)
PASSED_SAMPLING = ("temperature", "top_p", "stop", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                   "repetition_penalty", "stop_token_ids")


def _asks_for_something(name: str, value: Any) -> bool:
    """Whether an unserved field asks for behaviour (its OpenAI no-op values pass)."""
    if name == "response_format":
        return isinstance(value, dict) and value.get("type", "text") != "text"
    if name in ("tool_choice", "function_call"):
        return value not in (None, "none")
    if name == "best_of":
        return value not in (None, 1)
    return value not in (None, False, 0, "", [], {})


class OpenAISampling(SglangExtras):
    """The sampling fields both OpenAI routes take and SGLang applies, and the ones refused (UNSERVED)."""

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    seed: int | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    echo: Any = None
    logit_bias: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    suffix: Any = None
    best_of: Any = None

    @field_validator("top_k")
    @classmethod
    def _top_k_disabled_or_positive(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be -1 (disabled) or at least 1, got 0")
        return value

    @field_validator(*UNSERVED)
    @classmethod
    def _refuse_unserved(cls, value: Any, info: Any) -> Any:
        if _asks_for_something(info.field_name, value):
            raise ValueError("not served by this gateway (it returns text only: no logprobs, tools or JSON "
                             "mode); leave the field out")
        return value


def _budget_at_least_one(value: int | None) -> int | None:
    # OpenAI refuses a zero budget (and SGLang's /v1/completions does); chat's 0 would fall back to the default
    if value is not None and value < 1:
        raise ValueError(f"must be at least 1 (OpenAI's minimum), got {value}; leave it out for the default budget")
    return value


class CompletionBody(OpenAISampling):
    """OpenAI `/v1/completions` (the fields engines act on; unknown ones are accepted and ignored)."""

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1: PD rooms per sample are not worth the risk")
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    _max_tokens_at_least_one = field_validator("max_tokens")(_budget_at_least_one)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatBody(OpenAISampling):
    """OpenAI `/v1/chat/completions` (text content only)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    _budgets_at_least_one = field_validator("max_tokens", "max_completion_tokens")(_budget_at_least_one)


def requested_max_tokens(body: CompletionBody | ChatBody) -> int | None:
    """The completion budget the body asks for (chat: `max_completion_tokens` wins, as in SGLang), or None."""
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens


def sampling_params(body: CompletionBody | ChatBody, max_new_tokens: int) -> dict[str, Any]:
    """SGLang `/generate` sampling parameters for an OpenAI body (unset fields stay at SGLang's defaults)."""
    sp: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for key in PASSED_SAMPLING:
        value = getattr(body, key)
        if value is not None:
            sp[key] = value
    if body.min_tokens:
        sp["min_new_tokens"] = body.min_tokens  # above max_new_tokens: SGLang's 400, not a silent clamp
    if body.ignore_eos:
        sp["ignore_eos"] = True
    return sp


def include_usage(body: CompletionBody | ChatBody) -> bool:
    """A stream ends with a usage chunk when `stream_options.include_usage` asks for it."""
    return bool((body.stream_options or {}).get("include_usage"))


def finish_reason_type(meta: dict) -> str | None:
    """OpenAI's finish_reason from SGLang's meta_info.finish_reason ({"type": "length"|"stop"|"abort", ...})."""
    reason = meta.get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def chat_template_of(model_name: str) -> str:
    """The chat template a model's tokenizer_config carries: Qwen's ChatML, else DeepSeek's."""
    return "chatml" if "qwen" in model_name.lower() else "deepseek"


def chat_prompt(messages: list[ChatMessage], template: str) -> str:
    """The prompt text of a chat under the model's template: "deepseek" (R1, V2) or "chatml" (Qwen)."""
    return chatml_prompt(messages) if template == "chatml" else deepseek_chat_prompt(messages)


def chatml_prompt(messages: list[ChatMessage]) -> str:
    """Qwen3's chat template for text turns (no tools, no thinking block): ChatML with an open assistant turn."""
    turns = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        turns.append(f"<|im_start|>{role}\n{m.text()}<|im_end|>\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def deepseek_chat_prompt(messages: list[ChatMessage]) -> str:
    """DeepSeek-R1's chat template in its simplest form (system first, then turns, open assistant turn)."""
    system = "".join(m.text() for m in messages if m.role in ("system", "developer"))
    turns = []
    for m in messages:
        if m.role == "user":
            turns.append("<｜User｜>" + m.text())
        elif m.role == "assistant":
            turns.append("<｜Assistant｜>" + m.text() + "<｜end▁of▁sentence｜>")
    return system + "".join(turns) + "<｜Assistant｜>"
