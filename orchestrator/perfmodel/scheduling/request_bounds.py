"""What SGLang 0.5.17 lets one request do on a server of given limits: its longest prompt, its largest output, and
whether, alone on the server, it would ever run to its end (the planner refuses, naming the request, what would
otherwise wait forever; the simulated engine cuts max_new_tokens as SGLang does).

ServerLimits (limits.py) + (prompt_len, max_new_tokens) -> max_prompt_tokens / max_new_tokens_allowed / never_runs
"""

from __future__ import annotations

from orchestrator.perfmodel.scheduling.limits import ServerLimits


def max_new_tokens_allowed(limits: ServerLimits, prompt_len: int) -> int:
    """The output SGLang 0.5.17 lets a request of `prompt_len` generate on this server (managers/scheduler.py
    init_req_max_new_tokens): page-rounded prompt + max_new_tokens + a page stays below the KV pool, and
    prompt + max_new_tokens below max_req_len = pool - 1 (a larger max_new_tokens is cut to this)."""
    page, pool = limits.page_size, limits.kv_capacity_tokens
    paged_prompt = -(-prompt_len // page) * page
    return max(0, min(pool - 1 - prompt_len - 1, pool - paged_prompt - page - 1))


def max_prompt_tokens(limits: ServerLimits) -> int:
    """SGLang's max_req_input_len (tp_worker.get_worker_info): prompts of this many tokens or more are aborted."""
    return limits.kv_capacity_tokens - 1 - 5


def never_preallocated(limits: ServerLimits, prompt_len: int) -> bool:
    """PD decode: its prompt + --num-reserved-decode-tokens exceed the KV pool, so its KV is never pre-allocated
    (SGLang 0.5.17 aborts only prompts above the pool, DecodePreallocQueue._check_if_req_exceed_kv_capacity, and
    leaves one in between queued until the prefill's bootstrap timeout)."""
    return limits.role == "decode" and prompt_len + limits.reserved_decode_tokens > limits.kv_capacity_tokens


def never_runs(limits: ServerLimits, prompt_len: int, max_new_tokens: int) -> str | None:
    """Why a request, alone on this server, would never run to its max_new_tokens as SGLang 0.5.17 schedules it
    (None: it runs): SGLang aborts its prompt, cuts its output, or (PD decode) never pre-allocates its KV."""
    pool = limits.kv_capacity_tokens
    if prompt_len >= max_prompt_tokens(limits):
        return (f"its prompt of {prompt_len:,} tokens reaches the {pool:,}-token KV pool: SGLang aborts prompts of "
                f"{max_prompt_tokens(limits):,} tokens or more (Input length exceeds the maximum allowed length)")
    if never_preallocated(limits, prompt_len):
        return (f"the PD decode pre-allocates its prompt + {limits.reserved_decode_tokens} reserved decode tokens "
                f"(--num-reserved-decode-tokens), {prompt_len + limits.reserved_decode_tokens:,} > the {pool:,}-token "
                f"KV pool: it would wait for KV forever")
    allowed = max_new_tokens_allowed(limits, prompt_len)
    if limits.role != "prefill" and max_new_tokens > allowed:
        return (f"prompt {prompt_len:,} + output {max_new_tokens:,} tokens + a page must stay below the {pool:,}-token "
                f"KV pool: SGLang cuts its output to {allowed:,} tokens")
    return None
