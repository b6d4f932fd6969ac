"""SGLang's /generate body (orchestrator.api.generate): what the router, the simulated engine and the clients all
accept, and the one-line error each of them answers for what they refuse.

That the router and the sim really give the same answer for the same body is checked end to end in
tests/router/test_router_http.py (test_router_and_sim_refuse_a_bad_body_with_the_same_message).
"""

from __future__ import annotations

import json

import pytest

from orchestrator.api.client import generate_body
from orchestrator.api.generate import BadRequest, GenerateBody, parse_generate_body
from orchestrator.records import BenchRequest


@pytest.mark.parametrize("body, batch_size", [
    ({"text": "Hello"}, 1),
    ({"input_ids": [1, 2, 3]}, 1),
    ({"text": ["a", "b", "c"]}, 3),
    ({"input_ids": [[1], [2, 3]], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}],
      "rid": ["x", "y"], "bootstrap_host": ["h", None], "bootstrap_port": [8998, None], "bootstrap_room": [1, 2]}, 2),
    ({"input_ids": [1], "stream": True, "return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": -1,
      "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 2**63 - 1}, 1),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0, "temperature": 0, "top_p": 1, "top_k": 20,
                                            "min_p": 0.1, "repetition_penalty": 1.1, "stop": ["\n"], "n": 1}}, 1),
])
def test_sglang_forms_are_accepted(body, batch_size):
    parsed = parse_generate_body(json.dumps(body))
    assert parsed.batch_size == batch_size
    assert parsed.is_batch == (batch_size > 1)


def test_fields_we_do_not_model_pass_through_untouched_and_no_default_is_added():
    raw = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 3, "json_schema": "{}"},
           "lora_path": "a", "x_tag": 2**70}
    parsed = GenerateBody.model_validate(raw)
    assert parsed.model_dump(exclude_unset=True, exclude_none=True) == raw  # what the router forwards


def test_per_prompt_values_for_a_batch():
    body = parse_generate_body('{"input_ids": [[1], [2]], "rid": "r", "bootstrap_host": ["a", "b"]}')
    assert [body.per_prompt("bootstrap_host", i) for i in range(2)] == ["a", "b"]
    assert body.per_prompt("rid", 1) == "r"  # one value for all (the sim then suffixes _i, as SGLang)


@pytest.mark.parametrize("raw, message", [
    ("{not json", "invalid request: body is not valid JSON"),
    ("[1, 2]", "invalid request: body: send a JSON object (got list)"),
    ("{}", "text, input_ids: send exactly one of them"),
    ('{"text": "a", "input_ids": [1]}', "text, input_ids: send exactly one of them"),
    ('{"input_ids": []}', "input_ids: empty prompt; send at least one token id"),
    ('{"input_ids": [[1], []]}', "input_ids.1: empty prompt"),
    ('{"text": []}', "text: empty batch"),
    ('{"input_ids": ["a"]}', 'input_ids.0: Input should be a valid integer (got "a")'),
    ('{"input_ids": [true]}', "input_ids.0: Input should be a valid integer (got true)"),
    ('{"input_ids": "abc"}', 'input_ids: Input should be a valid list (got "abc")'),
    ('{"input_ids": [1], "stream": "yes"}', "stream: Input should be a valid boolean"),
    ('{"input_ids": [1], "sampling_params": {"max_new_tokens": -3}}',
     "sampling_params.max_new_tokens: Input should be greater than or equal to 0 (got -3)"),
    ('{"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}}', "sampling_params.max_new_tokens"),
    ('{"input_ids": [1], "sampling_params": {"temperature": -0.5}}', "sampling_params.temperature"),
    ('{"input_ids": [1], "sampling_params": {"top_p": 0}}', "sampling_params.top_p"),
    ('{"input_ids": [1], "sampling_params": {"top_k": 0}}', "sampling_params: top_k must be -1 (disabled) or at least 1"),
    ('{"input_ids": [1], "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}}',
     "min_new_tokens (5) must not exceed max_new_tokens (2)"),
    ('{"input_ids": [1], "sampling_params": {"repetition_penalty": 0}}', "sampling_params.repetition_penalty"),
    ('{"input_ids": [1], "sampling_params": {"n": 2}}', "sampling_params: n=2: only n=1 is served"),
    ('{"input_ids": [1], "top_logprobs_num": -1}', "top_logprobs_num"),
    ('{"input_ids": [1], "bootstrap_port": 70000}', "bootstrap_port: Input should be less than or equal to 65535"),
    ('{"input_ids": [1], "bootstrap_room": -1}', "bootstrap_room: Input should be greater than or equal to 0"),
    ('{"input_ids": [[1], [2]], "rid": ["a"]}', "rid: 1 values for a batch of 2 prompts; send one per prompt"),
    ('{"input_ids": [[1], [2]], "sampling_params": [{}]}', "sampling_params: 1 values for a batch of 2 prompts"),
    ('{"input_ids": [[1], [2]], "rid": ["a", "a"]}', "rid: ['a'] used more than once in the batch"),
    ('{"input_ids": [1], "bootstrap_room": [1]}', "bootstrap_room: a list is for a batch"),
])
def test_bad_bodies_are_refused_in_one_line_naming_the_field(raw, message):
    with pytest.raises(BadRequest) as exc:
        parse_generate_body(raw)
    text = str(exc.value)
    assert message in text
    assert text.startswith("invalid request: ") and "\n" not in text


def test_the_client_builds_bodies_with_the_same_model():
    req = BenchRequest(index=0, input_ids=[1, 2, 3], output_len=4)
    body = generate_body(req, stream=True)
    assert body == {"input_ids": [1, 2, 3], "stream": True,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}}
    assert generate_body(BenchRequest(index=1, input_ids=[], text="hi", output_len=1), stream=False)["text"] == "hi"
    with pytest.raises(BadRequest, match="sampling_params.max_new_tokens"):
        generate_body(BenchRequest(index=2, input_ids=[1], output_len=-1), stream=False)
