"""Write the V2-Lite x H200 calibration profile from the 2026-11-21 device runs' own SGLang logs.

Reads benchmarks/results/device-h200x2-2026-11-21/raw.tar.xz (SGLang 0.5.17 server logs of the PD runs
(a) and (b)) and startup-times.json, and writes
orchestrator/perfmodel/profiles/h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs.json:

- decode points (steady intervals: the previous line <= 5 s before, same graph flag): SGLang's decode log line every 40 steps ("Decode batch, #running-req: N, #token: T,
  ... cuda graph: G, gen throughput (token/s): X"); step = N / X, context = T. Only lines with no
  pre-allocated or in-transfer requests (then #token is the running batch's KV) and N >= 4.
- prefill points: full 8192-token chunks while requests queued ("Prefill batch ... #new-token: 8192 ...
  #queue-req: Q > 0 ... input throughput (token/s): X"): one forward = 8192 / X (the throughput is over
  the time since the previous prefill batch, which is one forward while the queue is not empty).
- transfer: SGLang's kv_transfer latency/bootstrap/size means of runs (a) and 2 (page 1) and 4 (page 64);
- start-up: /server_info startup_time of every server of those runs (cold: the first server on the fresh
  machine; warm: the later ones); the cold one's first graph size from its log's capture progress bar
  (benchmarks/qwen3_startup_phases.first_size: with empty caches that size compiles what the others reuse).

These are the same runs the back-test checks for V2-Lite, so this profile is not independent of those
rows; a profile from `pd-orchestrator calibrate` on a fresh machine (D1's) takes precedence when shipped.

Run: .venv/bin/python benchmarks/backtest/profile_from_device_logs.py
"""

from __future__ import annotations

import io
import json
import re
import statistics
import sys
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.qwen3_startup_phases import LENDER_COLD_LOGS, RESULTS, first_size  # noqa: E402

NAME = "h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs"
RAW = ROOT / "benchmarks/results/device-h200x2-2026-11-21"
OUT = ROOT / f"orchestrator/perfmodel/profiles/{NAME}.json"

DECODE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+),.*#prealloc-req: (\d+), #transfer-req: (\d+),"
    r".*cuda graph: (True|False), gen throughput \(token/s\): ([0-9.]+)"
)
PREFILL = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+),.*#queue-req: (\d+),"
    r".*input throughput \(token/s\): ([0-9.]+)"
)
DECODE_LOGS = {"c4/c/engines/decode-0-0.log": "run (a)", "c3/b/decode.log": "run (b)"}
PREFILL_LOGS = {"c4/c/engines/prefill-0-0.log": "run (a)", "c3/b/prefill.log": "run (b)"}


def _read(tar: tarfile.TarFile, name: str) -> str:
    member = tar.extractfile(name)
    assert member is not None, name
    return io.TextIOWrapper(member, encoding="utf-8", errors="replace").read()


STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")


def decode_points(text: str) -> list[dict]:
    """Steady intervals only: the previous decode line <= 5 s earlier with the same graph flag (an interval
    that starts after idle time, or that mixes graph and eager steps, is not one step kind's cost)."""
    from datetime import datetime

    out = []
    previous: tuple[datetime, str] | None = None
    for line in text.splitlines():
        m = DECODE.search(line)
        stamp = STAMP.match(line)
        if not m or not stamp:
            continue
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
        running, tokens, prealloc, transfer, graph, tput = m.groups()
        steady = previous is not None and (when - previous[0]).total_seconds() <= 5 and previous[1] == graph
        previous = (when, graph)
        running, tokens, tput = int(running), int(tokens), float(tput)
        if not steady or int(prealloc) or int(transfer) or running < 4 or tput <= 0:
            continue
        out.append({
            "batch_size": running, "context_tokens": tokens, "step_s": round(running / tput, 6),
            "cuda_graph": graph == "True", "steps": 40,
        })
    return out


def prefill_points(text: str) -> list[dict]:
    out = []
    for m in PREFILL.finditer(text):
        seqs, new, cached, queue, tput = m.groups()
        if int(new) != 8192 or int(queue) == 0 or float(tput) <= 0:
            continue
        out.append({
            "new_tokens": 8192, "requests": int(seqs), "cached_tokens": int(cached),
            "time_s": round(8192 / float(tput), 6),
        })
    return out


LOCAL = ROOT / "benchmarks/results/device-h200x2-local-cluster-2026-11-21"
ITL = re.compile(r"^sglang:inter_token_latency_seconds_(sum|count)\{[^}]*\} ([0-9.e+]+)", re.M)


def mean_itl(tar_path: Path) -> float:
    """Mean inter-token latency of the decode server (its /metrics scrape at the end of the run)."""
    with tarfile.open(tar_path) as tar:
        name = next(m.name for m in tar.getmembers() if re.search(r"scrape/decode_\d+\.prom$", m.name))
        values = dict(ITL.findall(_read(tar, name)))
    return float(values["sum"]) / float(values["count"])


def page_size_effects() -> list[dict]:
    """Page 64 vs page 1: the decode server's mean inter-token latency in the local-cluster runs 2 and 4."""
    page1, page64 = mean_itl(LOCAL / "raw.tar.xz"), mean_itl(LOCAL / "raw-page64.tar.xz")
    return [{
        "page_size": 64, "decode_step_ratio": round(page64 / page1, 4),
        "evidence": (
            f"sglang:inter_token_latency_seconds mean {page64 * 1e3:.1f} ms (page 64, run 4, raw-page64.tar.xz) / "
            f"{page1 * 1e3:.1f} ms (page 1, run 2, raw.tar.xz), benchmarks/results/device-h200x2-local-cluster-2026-11-21/; "
            "the same batch and layout, one run each; this is the page-64 back-test row's own run"
        ),
    }]


def transfer_points(kv_bytes_per_token: int) -> list[dict]:
    """SGLang's prefill-side kv_transfer metrics (means over the 1016 requests of a run) at page 1 and 64."""
    sources = [
        (RAW / "a-kv-stats.json", 1),
        (LOCAL / "kv-stats.json", 1),
    ]
    out = []
    for path, page in sources:
        stats = next(iter(json.loads(path.read_text()).values()))
        out.append(_transfer(stats, page, kv_bytes_per_token))
    with tarfile.open(LOCAL / "raw-page64.tar.xz") as tar:
        name = next(m.name for m in tar.getmembers() if m.name.endswith("kv_stats.json"))
        stats = next(iter(json.loads(_read(tar, name)).values()))
    out.append(_transfer(stats, 64, kv_bytes_per_token))
    return out


def _transfer(stats: dict, page: int, kv_bytes_per_token: int) -> dict:
    nbytes = stats["kv_transfer_total_mb_mean"] * 1e6
    return {
        "tokens": round(nbytes / kv_bytes_per_token), "page_size": page, "bytes": round(nbytes),
        "time_s": round(stats["kv_transfer_latency_ms_mean"] / 1e3, 4),
        "bootstrap_s": round(stats["kv_transfer_bootstrap_ms_mean"] / 1e3, 4), "link": "nvlink",
    }


def startup_runs() -> list[dict]:
    """Every server's start-up; the cold one also its first graph size's capture (cold_first_graph())."""
    times = json.loads((RAW / "startup-times.json").read_text())
    runs = []
    for key, item in times.items():
        st = item["startup_time"]
        graph = st["cuda_graph"]["decode"]
        role = "prefill" if "prefill" in key else ("decode" if "decode" in key else "aggregated")
        ready = item.get("ready_after_s")  # None: a bench run's server (only its graph time is known)
        cold = key.startswith("call1/")
        runs.append({
            "caches": "cold" if cold else "warm",
            "role": role,
            "ready_s": round(ready, 2) if ready is not None else None,
            "weights_s": round(st["load_weight"], 3),
            "kv_alloc_s": round(st["kv_cache_allocation"], 3),
            "graph_capture_s": round(graph, 2) if role != "prefill" else None,
            "graph_batch_sizes": 36 if role != "prefill" else None,
            **({"first_graph_capture_s": cold_first_graph()[1]} if cold and role != "prefill" else {}),
            "tokenizer_s": round(st["tokenizer_e2e"], 2),
        })
    return runs


@lru_cache(maxsize=1)
def cold_log() -> tuple[str, str]:
    """The cold start's server log (the archive member qwen3_startup_phases.LENDER_COLD_LOGS names) and its text."""
    archive, member = next((a, m) for name, a, m in LENDER_COLD_LOGS if name == NAME)
    with tarfile.open(RESULTS / archive) as tar:
        return member, _read(tar, member)


def cold_first_graph() -> tuple[int, float]:
    """(sizes captured, seconds the first size took) from the cold log's capture progress bar; all 36 sizes."""
    member, text = cold_log()
    found = first_size(text)
    if found is None or found[0] != 36:
        raise SystemExit(f"{member}: no capture progress bar over 36 sizes ({found})")
    return found


def build_profile() -> dict[str, Any]:
    cfg = json.loads((ROOT / "models/deepseek-v2-lite/config.json").read_text())
    decode, prefill = [], []
    with tarfile.open(RAW / "raw.tar.xz") as tar:
        for name in DECODE_LOGS:
            decode += decode_points(_read(tar, name))
        for name in PREFILL_LOGS:
            prefill += prefill_points(_read(tar, name))
    startup = startup_runs()
    cold = next(r for r in startup if r.get("first_graph_capture_s") is not None)
    sizes, first = cold_first_graph()
    profile: dict[str, Any] = {
        "schema_version": 1,
        "name": NAME,
        "created": "2026-11-21T20:00:00Z",
        "command": "benchmarks/device_pd.sh (calls 1-3), then .venv/bin/python benchmarks/backtest/profile_from_device_logs.py",
        "raw": "benchmarks/results/device-h200x2-2026-11-21/",
        "gpu": {"name": "H200", "device_name": "NVIDIA H200", "memory_mib": 143771, "count": 1, "machine": "nvidia-h200-x2"},
        "model": {
            "name": "deepseek-v2-lite", "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
            "first_k_dense_replace": cfg["first_k_dense_replace"], "n_routed_experts": cfg["n_routed_experts"],
            "num_experts_per_tok": cfg["num_experts_per_tok"], "moe_intermediate_size": cfg["moe_intermediate_size"],
            "num_attention_heads": cfg["num_attention_heads"], "kv_lora_rank": cfg["kv_lora_rank"],
            "qk_rope_head_dim": cfg["qk_rope_head_dim"], "quantization": "bf16", "load_format": "dummy",
        },
        "engine": {
            "sglang_version": "0.5.17", "attention_backend": "triton", "sampling_backend": "pytorch",
            "tp": 1, "page_size": 1, "context_length": 16384, "mem_fraction_static": 0.85,
            "cuda_graph_max_bs": 256, "disaggregation_mode": "decode",
            "extra_args": ["--disable-prefill-cuda-graph (prefill server)"],
            "reported_max_total_num_tokens": 3064755, "reported_max_running_requests": 4096,
            "reported_chunked_prefill_size": 8192,
        },
        "decode": decode,
        "prefill": prefill,
        "startup": startup,
        "transfer": transfer_points(cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2),
        "page_size_effects": page_size_effects(),
        "notes": [
            "2026-11-26 (hqwen2, issue 25): the cold start's first_graph_capture_s, read by this generator from the raw log's capture "
            f"progress bar, raw.tar.xz {cold_log()[0]} (1/{sizes} at {first} s/it; {cold['graph_capture_s']} s in all): "
            "with empty caches the first size compiles the kernels the later sizes reuse "
            "(benchmarks/qwen3_startup_phases.py prints it)",
            "Derived from the server logs of the 2026-11-21 PD runs (a) and (b); not independent of the "
            "back-test rows of those runs.",
            f"prefill forwards: median {statistics.median(p['time_s'] for p in prefill):.3f} s per 8192-token chunk "
            f"over {len(prefill)} chunks",
        ],
    }
    return profile


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=1) + "\n"


def main() -> None:
    profile = build_profile()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render(profile))
    decode, prefill = profile["decode"], profile["prefill"]
    print(f"wrote {OUT.relative_to(ROOT)}: {len(decode)} decode, {len(prefill)} prefill, {len(profile['startup'])} start-up points")


if __name__ == "__main__":
    main()
