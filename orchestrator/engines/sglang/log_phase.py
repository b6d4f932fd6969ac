"""SGLang 0.5.17's start-up as its log tells it: the marker lines in order, and the phase a server is in after the last
one it printed (what a ready timeout names)."""

from __future__ import annotations

import re

# phase marker -> regex on the message part of a timestamped line (first match wins), in start-up order
MARKERS = {
    "server_args": re.compile(r"^server_args=ServerArgs\("),
    "dist_init_begin": re.compile(r"^Init torch distributed begin"),
    "load_weight_begin": re.compile(r"^Load weight begin"),
    "load_weight_end": re.compile(r"^Load weight end"),
    "kv_cache_allocated": re.compile(r"^KV Cache is allocated"),
    "memory_pool_end": re.compile(r"^Memory pool end"),
    "cuda_graph_begin": re.compile(r"^Capture .*CUDA graph begin"),
    "cuda_graph_end": re.compile(r"^Capture .*CUDA graph end"),
    "limits": re.compile(r"^max_total_num_tokens="),
    "nixl_init": re.compile(r"NIXL KVManager initialized"),
    "engine_timings": re.compile(r"^Engine startup timings"),
    "uvicorn_running": re.compile(r"Uvicorn running on"),
    "warmup_begin": re.compile(r"Start of (pd disaggregation )?warmup|Start of prefill warmup"),
    "ready": re.compile(r"The server is fired up and ready to roll"),
}
# what the server is doing once a marker is its latest line
PHASE_AFTER = {
    "server_args": "initialising torch distributed",
    "dist_init_begin": "initialising torch distributed",
    "load_weight_begin": "loading weights",
    "load_weight_end": "allocating the KV cache",
    "kv_cache_allocated": "allocating the memory pool",
    "memory_pool_end": "starting CUDA-graph capture",
    "cuda_graph_begin": "capturing CUDA graphs",
    "cuda_graph_end": "finishing start-up after CUDA-graph capture",
    "limits": "finishing start-up after CUDA-graph capture",
    "nixl_init": "finishing start-up after CUDA-graph capture",
    "engine_timings": "starting its HTTP server",
    "uvicorn_running": "running its own warm-up request",
    "warmup_begin": "running its own warm-up request",
    "ready": "ready by its log, its readiness URLs not answering",
}
_MESSAGE = re.compile(r"^\[[^\]]*\] (.*)$")


def startup_phase(log_text: str) -> str:
    """The phase after the latest start-up marker in the log ("launching ..." before the first)."""
    markers = list(MARKERS.items())
    latest = -1  # the index in MARKERS of the furthest marker seen: lines may interleave, the order may not go back
    for line in log_text.splitlines():
        message = m.group(1) if (m := _MESSAGE.match(line)) else line
        latest = max([latest] + [i for i, (_, rx) in enumerate(markers) if rx.search(message)])
    return PHASE_AFTER[markers[latest][0]] if latest >= 0 else "launching (no SGLang start-up line in its log yet)"
