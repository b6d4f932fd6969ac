"""pairs.request_shape: what the policies are told about a /generate body (prompt tokens, output budget)."""

from __future__ import annotations

from orchestrator.api.generate import SGLANG_DEFAULT_MAX_NEW_TOKENS
from orchestrator.router.dispatch.pairs import request_shape


def test_one_prompt_uses_its_max_new_tokens_or_sglangs_default():
    assert request_shape({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 7}}).max_new_tokens == 7
    shape = request_shape({"input_ids": [1, 2, 3]})
    assert (shape.prompt_tokens, shape.max_new_tokens, shape.prompt_ids) == (3, SGLANG_DEFAULT_MAX_NEW_TOKENS, [1, 2, 3])


def test_a_batch_with_one_sampling_params_counts_it_once_per_prompt():
    shape = request_shape({"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 4}})
    assert (shape.prompt_tokens, shape.max_new_tokens, shape.prompt_ids) == (3, 8, [1, 2])


def test_a_batch_with_sampling_params_per_prompt_sums_them():
    shape = request_shape({"input_ids": [[1, 2], [3]], "sampling_params": [{"max_new_tokens": 4}, {}]})
    assert shape.max_new_tokens == 4 + SGLANG_DEFAULT_MAX_NEW_TOKENS
