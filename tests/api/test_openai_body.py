"""What an OpenAI body's sampling fields become on SGLang's /generate: each one SGLang applies is passed on as sent,
OpenAI's no-op values of the refused fields are accepted, and nothing a client asks for is dropped silently."""

from __future__ import annotations

import pytest

from orchestrator.api.generate import SamplingParams
from orchestrator.api.openai import ChatBody, CompletionBody, sampling_params

MESSAGES = [{"role": "user", "content": "x"}]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "stop": ["\n"], "top_k": 20, "min_p": 0.05, "frequency_penalty": 0.5,
            "presence_penalty": -0.5, "repetition_penalty": 1.1, "stop_token_ids": [7]}


@pytest.mark.parametrize("body", [ChatBody.model_validate({"messages": MESSAGES, **SAMPLING}),
                                  CompletionBody.model_validate({"prompt": "x", **SAMPLING})])
def test_every_sampling_field_sglang_applies_reaches_generate_as_sent(body):
    sent = sampling_params(body, 32)
    assert sent == {"max_new_tokens": 32, **SAMPLING}
    assert SamplingParams.model_validate(sent).top_k == 20  # and the engine's own checks take it


def test_an_integer_penalty_is_sent_as_a_float_the_strict_engine_accepts():
    sent = sampling_params(ChatBody.model_validate({"messages": MESSAGES, "frequency_penalty": 1}), 8)
    assert sent["frequency_penalty"] == 1.0 and isinstance(sent["frequency_penalty"], float)
    SamplingParams.model_validate(sent)


def test_openais_no_op_values_of_the_refused_fields_pass():
    body = ChatBody.model_validate({"messages": MESSAGES, "logprobs": False, "tool_choice": "none", "tools": [],
                                    "response_format": {"type": "text"}, "seed": 1})
    assert sampling_params(body, 4) == {"max_new_tokens": 4}
    CompletionBody.model_validate({"prompt": "x", "logprobs": 0, "echo": False, "best_of": 1, "suffix": None})
