"""OpenAI `/v1/completions` and `/v1/chat/completions` request bodies, and DeepSeek's chat template."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.generate import SGLANG_DEFAULT_MAX_NEW_TOKENS

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


DEFAULT_CHAT_TOKENS = SGLANG_DEFAULT_MAX_NEW_TOKENS


class CompletionBody(BaseModel):
    """OpenAI `/v1/completions` (the fields engines act on; unknown ones are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1: PD rooms per sample are not worth the risk")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    seed: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatBody(BaseModel):
    """OpenAI `/v1/chat/completions` (text content only)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    seed: int | None = None


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
