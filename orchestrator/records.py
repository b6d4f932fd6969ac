"""Plain records that cross process boundaries: worker endpoints, benchmark requests and their results.

They travel through Ray (pickled) and into the JSON result, so they stay flat dataclasses of builtins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Role = Literal["prefill", "decode", "aggregated"]

# The first word of RequestResult.error when the client went away before its answer ended (the router's failure
# reason): AIPerf keeps no record of the requests it cancels at the end of its grace period, so the SLA counters
# (observe/metrics.py) leave these out of the good fraction's denominator.
CLIENT_LEFT_REASON = "cancelled"


@dataclass(frozen=True)
class WorkerEndpoint:
    """One running engine server as the router sees it."""

    role: Role
    name: str  # unique, e.g. "prefill-0/1" (group/replica)
    url: str  # http://ip:port
    bootstrap_host: str | None = None  # prefill only: host of its bootstrap server, as decode must reach it
    bootstrap_port: int | None = None  # prefill only
    node_id: str | None = None
    node_ip: str | None = None
    gpu_ids: tuple[int, ...] = ()
    log_path: str | None = None
    cache_state: str = "n/a"  # compile caches at engine start: warm | cold | n/a (an engine without any)


@dataclass
class BenchRequest:
    """One prompt of the batch: token ids (sent as input_ids, counted client-side) and output length."""

    index: int
    input_ids: list[int]
    output_len: int
    prompt_len: int = 0
    text: str | None = None  # kept only for endpoints that must send text

    def __post_init__(self) -> None:
        if not self.prompt_len:
            self.prompt_len = len(self.input_ids)


# How a stopped batch (SIGTERM/Ctrl-C to bench: scancel, qdel, a walltime) names its unfinished prompts; the driver
# adds the stop's reason after a colon
CUT_OFF_IN_FLIGHT = "cut off in flight"  # sent to its engines, aborted there by the stop
NEVER_SENT = "never sent"  # still waiting for its turn (or for a pair) when the stop came


@dataclass
class RequestResult:
    """How one prompt ended. status 'ok' or 'failed' (with error); times are seconds."""

    index: int
    status: Literal["ok", "failed"]
    prompt_len: int
    output_len: int  # requested max_new_tokens
    completion_tokens: int = 0  # as reported by the server
    ttft_s: float | None = None
    e2e_s: float | None = None
    kv_wait_s: float | None = None  # send -> prefill leg answered (prefill + KV transfer)
    sent_at: float | None = None  # wall clock (time.time()) when first sent
    done_at: float | None = None
    # the router's own legs of the last attempt, on sent_at's clock (None where the leg never got that far; aggregated:
    # its one leg is the decode's): the POST handed to the socket, the answer's first bytes read (docs/running.md)
    prefill_posted_at: float | None = None
    prefill_first_byte_at: float | None = None
    decode_posted_at: float | None = None
    decode_first_byte_at: float | None = None
    prefill_worker: str | None = None
    decode_worker: str | None = None
    attempts: int = 1
    error: str | None = None
    output_ids: list[int] = field(default_factory=list)

    def to_dict(self, with_output_ids: bool = False) -> dict:
        d = asdict(self)
        if not with_output_ids:
            d.pop("output_ids")
        return d
