"""Read SGLang 0.5.17 server logs: start-up phases, derived limits, decode step times.

Pure text parsing (stdlib only), so it runs on the GPU machine inside the harness and here on committed
raw logs. Log lines look like `[2026-11-21 20:00:02] Load weight end. elapsed=0.21 s, ...` (1 s resolution);
the precise numbers come from SGLang's own `Engine startup timings (s): ...` line and `/server_info`.
"""

from __future__ import annotations

import re
import statistics
import time

from orchestrator.engines.sglang.log_phase import MARKERS

# `[stamp] msg`, or `[stamp DP1 PP0 TP1 EP1] msg` from a scheduler of a server with more than one rank (SGLang's
# logger prefix; with SGLANG_LOG_MS the stamp has milliseconds)
_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{1,6})?((?: [A-Z_]+\d+)*)\] (.*)$")
_NIXL_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) NIXL (.*)$")

# compile / JIT activity: first and last timestamp of lines matching these
JIT_PATTERNS = {
    "deep_gemm": re.compile(r"deep_?gemm|DeepGEMM", re.I),
    "triton_moe_config": re.compile(r"Using default MoE kernel config|Using MoE kernel config", re.I),
    "flashinfer_jit": re.compile(r"flashinfer.*(jit|compil)", re.I),
    "torch_compile": re.compile(r"torch\.compile|inductor", re.I),
}

_KV = re.compile(r"KV Cache is allocated\. .*#tokens: (\d+), KV size: ([\d.]+) GB")
_WEIGHT = re.compile(r"Load weight end\. elapsed=([\d.]+) s.*?mem usage=([\d.]+) GB")
_GRAPH_BEGIN = re.compile(r"Capture (.*?)CUDA graph begin\..*?bs=\[([0-9, ]*)\]")
_GRAPH_END = re.compile(r"Capture (.*?)CUDA graph end\. elapsed=([\d.]+) s, mem usage=([\d.]+) GB")
_LIMITS = re.compile(r"(\w+)=([\d.]+)(?: GB)?")
_TIMINGS = re.compile(r"(\w+)=([\d.]+)")
_DECODE = re.compile(
    r"Decode batch.*?#running-req: (\d+), #token: (\d+),.*?(?:graph): (True|False), "
    r"gen throughput \(token/s\): ([\d.]+)")
# a PD decode server's queues on the same line (disaggregation/decode.py): pre-allocation, transfer, retracted
_DECODE_PD = re.compile(r"#prealloc-req: (\d+), #transfer-req: (\d+), #retracted-req: (\d+)")
_QUEUE = re.compile(r"#queue-req: (\d+)")
_BOOTSTRAP = re.compile(r"#bootstrap-req: (\d+)")  # a PD prefill's requests still waiting for their decode's bootstrap
_INPUT_RATE = re.compile(r"input throughput \(token/s\): ([\d.]+)")
_PREFILL = re.compile(r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def _epoch(stamp: str) -> float:
    # The server writes local time on the same machine the harness reads its own clock on.
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def timestamped(text: str):
    """Yield (epoch_s, message) for every timestamped line (SGLang's and NIXL's formats)."""
    for ts, _, msg in timestamped_ranks(text):
        yield ts, msg


def timestamped_ranks(text: str):
    """Yield (epoch_s, ranks, message): ranks is the scheduler's prefix ("DP1 TP1", "PP0 TP0", "" for none)."""
    for line in text.splitlines():
        if m := _TS.match(line):
            yield _epoch(m.group(1)), m.group(2).strip(), m.group(3)
        elif m := _NIXL_TS.match(line):
            yield _epoch(m.group(1)), "", m.group(2)


def startup(text: str, launched_at: float | None = None) -> dict:
    """Start-up phases of one server start from its log.

    `marks_s`: seconds from launch (or from the first log line when `launched_at` is None) at which each
    marker first appeared (1 s resolution). `phases_s`: differences between consecutive markers that
    exist. `engine_timings_s`: SGLang's own precise line. Also the KV pool, weights, CUDA-graph batch
    sizes and the limits line as SGLang printed them.
    """
    marks: dict[str, float] = {}
    jit: dict[str, list[float]] = {}
    out: dict = {"cuda_graphs": []}
    first = None
    for ts, msg in timestamped(text):
        first = ts if first is None else first
        for name, rx in MARKERS.items():
            if name not in marks and rx.search(msg):
                marks[name] = ts
        for name, rx in JIT_PATTERNS.items():
            if not msg.startswith("server_args=") and rx.search(msg):
                jit.setdefault(name, [ts, ts])[1] = ts
        if m := _KV.search(msg):
            out["kv_cache_tokens"] = int(m.group(1))
            out["kv_cache_gb"] = float(m.group(2))
        if m := _WEIGHT.search(msg):
            out["load_weight_s"] = float(m.group(1))
            out["weights_gb"] = float(m.group(2))
        if m := _GRAPH_BEGIN.search(msg):
            bs = [int(x) for x in m.group(2).replace(" ", "").split(",") if x]
            out["cuda_graphs"].append({"kind": m.group(1).strip() or "decode", "bs": bs})
        if (m := _GRAPH_END.search(msg)) and out["cuda_graphs"]:
            out["cuda_graphs"][-1].update(capture_s=float(m.group(2)), mem_gb=float(m.group(3)))
        if MARKERS["limits"].search(msg):
            out["limits"] = {k: (float(v) if "." in v else int(v)) for k, v in _LIMITS.findall(msg)}
        if MARKERS["engine_timings"].search(msg):
            out["engine_timings_s"] = _engine_timings(msg)
    base = launched_at if launched_at is not None else first
    if base is None:
        return {**out, "marks_s": {}, "phases_s": {}, "jit_windows_s": {}}
    out["marks_s"] = {k: round(v - base, 1) for k, v in sorted(marks.items(), key=lambda kv: kv[1])}
    order = [k for k in MARKERS if k in marks]
    phases = {}
    prev_name, prev_t = "launch", base
    for name in order:
        phases[f"{prev_name}->{name}"] = round(marks[name] - prev_t, 1)
        prev_name, prev_t = name, marks[name]
    out["phases_s"] = phases
    out["jit_windows_s"] = {k: [round(a - base, 1), round(b - base, 1)] for k, (a, b) in jit.items()}
    if launched_at is not None and first is not None:
        out["launch_to_first_log_s"] = round(first - launched_at, 1)
    return out


def _engine_timings(msg: str) -> dict:
    """`Engine startup timings (s): load_weight=0.21, ..., cuda_graph={prefill=0.00, decode=20.12, ...}, tokenizer_e2e=46.4`"""
    body = msg.split(":", 1)[1]
    graphs = {}
    if "{" in body:
        inner = body[body.index("{") + 1: body.index("}")]
        graphs = {k: float(v) for k, v in _TIMINGS.findall(inner)}
        body = body[: body.index("cuda_graph")] + body[body.index("}") + 1:]
    res: dict = {k: float(v) for k, v in _TIMINGS.findall(body)}
    if graphs:
        res["cuda_graph"] = graphs
    return res


def decode_lines(text: str) -> list[dict]:
    """Every `Decode batch` line: running requests, KV tokens, CUDA graph used, gen throughput (token/s), and where
    the line has them the waiting queue (`queue`) and a PD decode's `prealloc`, `transfer` and `retracted` requests."""
    rows = []
    for ts, ranks, msg in timestamped_ranks(text):
        if m := _DECODE.search(msg):
            row = {"t": ts, "ranks": ranks, "running": int(m.group(1)), "tokens": int(m.group(2)),
                   "cuda_graph": m.group(3) == "True", "gen_tok_s": float(m.group(4))}
            if pd := _DECODE_PD.search(msg):
                row.update(prealloc=int(pd.group(1)), transfer=int(pd.group(2)), retracted=int(pd.group(3)))
            if q := _QUEUE.search(msg):
                row["queue"] = int(q.group(1))
            rows.append(row)
    return rows


def prefill_lines(text: str) -> list[dict]:
    """Every `Prefill batch` line: new requests, new and cached tokens, and where the line has it SGLang's input
    throughput (`input_tok_s`: the batch's new tokens over the time since the previous prefill line), its waiting
    queue (`queue`) and, on a PD prefill, its bootstrap queue (`bootstrap`)."""
    rows = []
    for ts, msg in timestamped(text):
        if m := _PREFILL.search(msg):
            row = {"t": ts, "new_seq": int(m.group(1)), "new_tokens": int(m.group(2)), "cached_tokens": int(m.group(3))}
            if rate := _INPUT_RATE.search(msg):
                row["input_tok_s"] = float(rate.group(1))
            if q := _QUEUE.search(msg):
                row["queue"] = int(q.group(1))
            if b := _BOOTSTRAP.search(msg):
                row["bootstrap"] = int(b.group(1))
            rows.append(row)
    return rows


def decode_step_ms(rows: list[dict], batch_size: int) -> dict:
    """Decode step time at a steady batch of `batch_size` from the `Decode batch` lines of one run.

    SGLang logs every `--decode-log-interval` steps the tokens generated since its last line over the
    wall time since then, so with a constant running batch B one step takes B / throughput. The first
    line at B is dropped (its interval can hold the last prefill); the median of the rest is reported.
    """
    at_b = [r for r in rows if r["running"] == batch_size and r["gen_tok_s"] > 0]
    steady = at_b[1:] if len(at_b) > 1 else at_b
    if not steady:
        seen = sorted({r["running"] for r in rows})
        return {"step_ms_median": None, "samples": 0, "running_seen": seen[-8:]}
    steps = sorted(1000.0 * batch_size / r["gen_tok_s"] for r in steady)
    mid = len(steps) // 2
    med = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
    return {"step_ms_median": round(med, 3), "step_ms_min": round(steps[0], 3), "samples": len(steps),
            "cuda_graph": all(r["cuda_graph"] for r in steady),
            "kv_tokens_median": sorted(r["tokens"] for r in steady)[len(steady) // 2]}


def _stream(ranks: str) -> str:
    """The request stream a log line speaks for: its DP and PP ranks (TP / EP ranks of one stream log alike)."""
    return " ".join(p for p in ranks.split() if p.startswith(("DP", "PP")))


def decode_step(rows: list[dict], batch_size: int) -> dict:
    """Decode step time of a server of any layout at `batch_size` requests running in all.

    One stream (TP only: rank 0 logs): decode_step_ms. DP attention: every DP rank logs its own requests and
    tokens; they step together, so each line gives running / throughput; the median over the ranks' lines at
    their plateau (the most requests they held; first line dropped) is the step. Pipeline stages: a line
    names one micro-batch's requests but counts the tokens of every micro-batch since the last line, so
    the step a request sees is batch_size / throughput (first and last line of each stage dropped).
    `streams` keeps each stream's own median, `estimator` says which rule was used.
    """
    streams: dict[str, list[dict]] = {}
    for r in rows:
        streams.setdefault(_stream(r.get("ranks", "")), []).append(r)
    if set(streams) <= {""}:
        return {**decode_step_ms(rows, batch_size), "estimator": "one stream: batch / throughput"}
    pipelined = any("PP" in key for key in streams)
    steps, per_stream = [], {}
    for key, lines in sorted(streams.items()):
        live = [r for r in lines if r["gen_tok_s"] > 0]
        if pipelined:
            steady = live[1:-1] if len(live) > 2 else live
            own = [1000.0 * batch_size / r["gen_tok_s"] for r in steady]
        else:
            top = max((r["running"] for r in live), default=0)
            at_top = [r for r in live if r["running"] == top]
            steady = at_top[1:] if len(at_top) > 1 else at_top
            own = [1000.0 * r["running"] / r["gen_tok_s"] for r in steady]
        per_stream[key] = {"step_ms_median": _median_ms(own), "samples": len(own),
                           "running": sorted({r["running"] for r in steady}),
                           "cuda_graph": all(r["cuda_graph"] for r in steady) if steady else None}
        steps += own
    return {"step_ms_median": _median_ms(steps), "step_ms_min": round(min(steps), 3) if steps else None,
            "samples": len(steps), "cuda_graph": all(s["cuda_graph"] for s in per_stream.values() if s["samples"]),
            "estimator": ("pipeline: batch / throughput per stage" if pipelined
                          else "DP ranks: running / throughput per rank"), "streams": per_stream}


def _median_ms(steps_ms: list[float]) -> float | None:
    """The median step, rounded to the microsecond; None without samples."""
    return round(statistics.median(steps_ms), 3) if steps_ms else None
