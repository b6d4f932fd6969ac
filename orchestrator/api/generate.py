"""SGLang `/generate` request body as the router accepts it (one prompt, or a batch; other fields pass through)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GenerateBody(BaseModel):
    """SGLang `/generate`: one prompt (text or input_ids) or a batch; other SGLang fields pass through."""

    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False

    @model_validator(mode="after")
    def _one_prompt_field(self) -> "GenerateBody":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("set exactly one of 'text' or 'input_ids'")
        if self.input_ids is not None and (not self.input_ids or any(x == [] for x in self.input_ids)):
            raise ValueError("input_ids: a prompt needs at least one token id")
        n = self.sampling_params.get("max_new_tokens")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"sampling_params.max_new_tokens must be a non-negative integer (got {n!r})")
        return self
