"""The Qwen3-shaped closed-loop rows term by term: the batch the loop ran, its step there, the lone grid's step at that
batch, what the responses carried, and the planner's batch, step and ITL (issue 25).

    .venv/bin/python benchmarks/qwen3_closed_loop_terms.py

Measured, from the committed raw archives of the five closed-loop runs of models/qwen3-235b-a22b-fp8-l6 (two H200s, a
GPU per server: leases 2 and 5; one H100 shared by the pair: calls 9 and 15 through our gateway, call 10 through
sglang-router): AIPerf's per-request records (profile_export.jsonl: send, TTFT, end, response bytes), the decode
server's `Decode batch` lines (one per 40 decode steps, whole-second stamps). Per point (N), the measured window:
- in-system and decode batch: time averages over the window of the requests sent and not ended, and of those between
  their first token and their end (the decode server's running batch, seen from the client);
- the in-loop step: the window's seconds over 40 x its `Decode batch` lines (the logged #running-req beside it);
- ITL and TTFT p50 as AIPerf reports them; ITL is (end - first token) / 199, the mean step a request decoded through;
- the lone grid's step at that batch and context 4,096 (linear in batch between the measured points, the same model
  folder on one GPU of the same kind, random-id prompts: benchmarks/results/2026-11-26-qwen3-h200-lone, and the H100
  grid of lease 3's call 6);
- the responses: how many distinct byte totals, and (our gateway, whose chunk envelope is fixed: router/openai.py)
  the content bytes per output token those totals leave.
Modelled: the planner's closed-loop point at that N, with decode routing per request (as before
weights.decode_routing_tokens) and with the decode batch routing as at most two tokens (now): its time-average decode
batch, its step at the measured batch, its ITL / TTFT p50 and output tok/s.
The organisers' reference run at N = 32 (real weights, full size), from SGLang lines of their published logs copied by
hand (benchmarks/results/2026-11-27-organisers-n32-waves/): the decode server's running batch over time (waves or a
steady batch?), the prefill's full-chunk input throughput and its idle gaps, beside the planner's loop on
configs/qwen3-pd-2026.yaml at N = 32 (its send groups, its prefill of one prompt).
Checked on CPU: the dummy loader's argument (weights.py, DUMMY_GREEDY_CYCLE_TOKENS) on a small random stream: every
greedy chain of a symmetric argmax form ends in a cycle of at most two tokens.
"""

from __future__ import annotations

import io
import json
import re
import statistics
import sys
import tarfile
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.closedloop import client  # noqa: E402
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop  # noqa: E402
from orchestrator.router.json_response import json_bytes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RUNS = [  # (label, archive, AIPerf folder in it, config, GPU, lone grid, gateway is ours)
    ("H200 x2, lease 2", "2026-11-26-two-gpu-lease2-h200x2/call4-pd-serve/serve.tar.xz", "goodput-ours",
     "configs/device-h200x2-qwen3-serve.yaml", "H200", "H200", True),
    ("H200 x2, lease 5", "2026-11-26-two-gpu-lease5-h200x2/call4-qwen3-prepare-serve/prepare-serve.tar.xz",
     "goodput-ours", "configs/device-h200x2-qwen3-serve.yaml", "H200", "H200", True),
    ("H100 shared, call 9", "2026-11-26-qwen3-serve-one-h100/serve-call9.tar.xz", "goodput-ours",
     "configs/device-h100x1-qwen3-serve.yaml", "H100-SXM", "H100", True),
    ("H100 shared, call 15", "2026-11-26-qwen3-serve-one-h100/serve-call15.tar.xz", "goodput-ours",
     "configs/device-h100x1-qwen3-serve.yaml", "H100-SXM", "H100", True),
    ("H100 shared, sglang-router", "2026-11-26-qwen3-serve-one-h100/router-call10.tar.xz", "goodput-sglang-router",
     "configs/device-h100x1-qwen3-serve.yaml", "H100-SXM", "H100", False),
]
LONE = {"H200": "2026-11-26-qwen3-h200-lone/call2-profile/calibration-qwen3-l6.json.xz",
        "H100": "2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe/calibration-qwen3-l6.json.xz"}
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default: one `Decode batch` line per 40 decode steps
DECODE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] Decode batch, #running-req: (\d+)")
OSL, ISL_CONTEXT = 200, 4096


def read_archive(rel: str, folder: str) -> tuple[dict[int, list[dict]], list[tuple[float, int]]]:
    """{N: AIPerf records} and the decode server's (epoch s, running) per `Decode batch` line."""
    records: dict[int, list[dict]] = {}
    lines: list[tuple[float, int]] = []
    with tarfile.open(RESULTS / rel) as tar:
        for member in tar.getmembers():
            stream = tar.extractfile(member)
            if stream is None:
                continue
            path = Path(member.name)
            if path.name == "profile_export.jsonl" and folder in path.parts:
                n = int(path.parent.name.lstrip("c"))
                records[n] = [json.loads(x) for x in io.TextIOWrapper(stream, encoding="utf-8") if x.strip()]
            elif path.name in ("decode-0-0.log", "decode.log"):  # a `prepare` log lies outside every window
                for text in io.TextIOWrapper(stream, encoding="utf-8", errors="replace"):
                    if m := DECODE.match(text):
                        lines.append((datetime.fromisoformat(m.group(1) + "+00:00").timestamp(), int(m.group(2))))
    return records, lines


def window_terms(records: list[dict], decode_lines: list[tuple[float, int]]) -> dict:
    """The measured window's batch, step, ITL, TTFT and response bytes (see the module docstring)."""
    reqs = []
    for r in records:
        md, m = r["metadata"], r["metrics"]
        sent, end = md["request_start_ns"] / 1e9, md["request_end_ns"] / 1e9
        reqs.append({"phase": md["benchmark_phase"], "sent": sent, "end": end,
                     "first": sent + m["time_to_first_token"]["value"] / 1e3, "itl": m["inter_token_latency"]["value"],
                     "ttft": m["time_to_first_token"]["value"], "bytes": m["http_req_data_received"]["value"] * 1024,
                     "osl": m["output_sequence_length"]["value"]})
    window = [r for r in reqs if r["phase"] == "profiling"]
    t0, t1 = min(r["sent"] for r in window), max(r["end"] for r in window)

    def average(start: str) -> float:  # every request of the file (warm-up ones too) over the window
        return sum(max(0.0, min(t1, r["end"]) - max(t0, r[start])) for r in reqs) / (t1 - t0)

    in_window = [(t, run) for t, run in decode_lines if t0 <= t < t1 - 1]  # whole-second stamps: drop the last second
    step_ms = ((in_window[-1][0] - in_window[0][0]) / (DECODE_LOG_INTERVAL * (len(in_window) - 1)) * 1e3
               if len(in_window) > 2 else float("nan"))
    totals = sorted({round(r["bytes"]) for r in reqs})
    return {"requests": len(window), "in_system": average("sent"), "decode_batch": average("first"),
            "logged_running": statistics.fmean(run for _, run in in_window) if in_window else float("nan"),
            "step_ms": step_ms, "itl_p50": statistics.median(r["itl"] for r in window),
            "ttft_p50": statistics.median(r["ttft"] for r in window), "byte_totals": totals,
            "osl": sorted({r["osl"] for r in reqs}), "output_tok_s": sum(r["osl"] for r in window) / (t1 - t0)}


def content_bytes_per_token(total: int) -> float:
    """Our gateway's stream of one chat answer: a role chunk, one chunk per output token (the last with finish_reason
    'length'), [DONE]; ids and stamps of fixed width (router/openai.py, AIPerf sends no include_usage). What is left of
    `total` is the content, per token."""
    rid, model, created = "chatcmpl-" + uuid.uuid4().hex, "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", 1795698155

    def sse(obj) -> int:
        return len(b"data: " + json_bytes(obj) + b"\n\n")

    head = sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    empty = sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [{"index": 0, "finish_reason": None, "delta": {"content": ""}}]})
    last_extra = len(b'"length"') - len(b"null")
    return (total - head - len(b"data: [DONE]\n\n") - OSL * empty - last_extra) / OSL


def lone_step_ms(gpu_kind: str, batch: float) -> float:
    """The lone graphed grid's step at `batch` and context 4,096, linear in batch between its measured points."""
    raw = json.loads(read_text(RESULTS / LONE[gpu_kind]))
    points = sorted((p["batch_size"], p["step_ms_median"]) for p in raw["runs"][0]["decode"]
                    if p["context_tokens"] == ISL_CONTEXT and p.get("step_ms_median"))
    return float(np.interp(batch, [b for b, _ in points], [s for _, s in points]))


def planner(config: str, gpu: str, n: int, measured_batch: float, per_request_routing: bool) -> dict:
    """The planner's point at N (the config's window), its time-average decode batch, and its step at the measured
    batch; `per_request_routing`: each request of a decode batch routes its own token (the model before: no request
    of the loop names the greedy chain it shares)."""
    chain = None if per_request_routing else client.CHAT_TURN_CHAIN
    patch = mock.patch.object(client, "CHAT_TURN_CHAIN", None) if per_request_routing else None
    if patch is not None:
        patch.start()
    try:
        cfg = load_config(ROOT / config, [f"cluster.gpu={gpu}"], paths_from=ROOT)
        load = ClosedLoopLoad.of(cfg, n)
        busy: dict[str, float] = defaultdict(float)

        def observe(now, server, forward, _schedule):
            if server.startswith("decode") and forward.kind == "decode" and now < load.window_s:
                busy["s"] += forward.duration_s
                busy["req_s"] += forward.duration_s * len(forward.running)

        run = simulate_closed_loop(cfg, load, observe=observe)
        _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
        model = cost_model_for(cfg, "decode", group)
        lo = int(measured_batch)
        steps = [model.decode_step_s(b, b * (ISL_CONTEXT + OSL // 2), None if chain is None else [chain] * b) * 1e3
                 for b in (lo, lo + 1)]
        step = steps[0] + (measured_batch - lo) * (steps[1] - steps[0])
        return {"batch": busy["req_s"] / busy["s"], "step_at_measured_ms": step, "itl_p50": run.itl_ms()["p50"],
                "ttft_p50": run.ttft_ms()["p50"], "output_tok_s": run.output_tok_s}
    finally:
        if patch is not None:
            patch.stop()


def greedy_cycles(rows: int = 4096, width: int = 512, starts: int = 200, seed: int = 0) -> tuple[int, int]:
    """The dummy loader's argument on CPU: one uniform stream fills the embedding, an equal lm_head and the norm
    weight (same seed per parameter); x -> argmax_v <E[v], w * E[x]>. Returns (starts whose chain ended in a cycle of
    at most 2 tokens within 8 steps, starts)."""
    rng = np.random.default_rng(seed)
    stream = rng.uniform(-1e-3, 1e-3, rows * width)
    emb, norm = stream.reshape(rows, width), stream[:width]
    scores = emb @ (emb * norm).T  # scores[v, x]: a symmetric form
    nxt = scores.argmax(axis=0)
    ended = 0
    for x in rng.choice(rows, starts, replace=False):
        chain = [int(x)]
        for _ in range(8):
            chain.append(int(nxt[chain[-1]]))
        ended += chain[-1] == chain[-3]
    return ended, starts


ORGANISERS = "2026-11-27-organisers-n32-waves/organisers-n32-log-lines.json"


def organisers_waves() -> None:
    """The organisers' N = 32 lines against the planner's loop at that N (see the module docstring)."""
    raw = json.loads((RESULTS / ORGANISERS).read_text())
    running = [r for _, r, _, _ in raw["decode_lines"]]
    seconds = [datetime.fromisoformat("2026-10-09 " + t + "+00:00").timestamp() for t, *_ in raw["decode_lines"]]
    rises = [i for i in range(1, len(running)) if running[i] >= 16 > running[i - 1]]  # the batch fills up again
    full = [thr for _, _, tokens, _, _, thr in raw["prefill_lines"] if tokens == 8192 and thr < 60000]
    stamps = [datetime.fromisoformat("2026-10-09 " + t + "+00:00").timestamp() for t, *_ in raw["prefill_lines"]]
    gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b - a >= 2]
    print(f"\nThe organisers' N = 32 (published lines, {ORGANISERS}):")
    print(f"  decode-0 #running-req over {seconds[-1] - seconds[0]:.0f} s: {min(running)}..{max(running)}, reaching >= 16 at "
          f"{', '.join(raw['decode_lines'][i][0] for i in rises)} (every "
          f"{statistics.fmean(seconds[b] - seconds[a] for a, b in zip(rises, rises[1:])):.1f} s; between them it drains "
          f"to {min(running)}-8 while the next wave's KV is in transfer): waves")
    print(f"  prefill-0: full 8,192-token chunks at {statistics.median(full):,.0f} tok/s input (a 4,000-token prompt "
          f"{4000 / statistics.median(full) * 1e3:.0f} ms); idle gaps of {', '.join(f'{g:.0f}' for g in gaps)} s between bursts")
    cfg = load_config(ROOT / "configs/qwen3-pd-2026.yaml", paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "prefill")
    prefill_ms = cost_model_for(cfg, "prefill", group).prefill_time_s([4000]) * 1e3
    run = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, 32))
    groups = [len(w) for w in run.waves()]
    print(f"  the planner at N = 32: a 4,000-token prefill {prefill_ms:.0f} ms; its clients' send groups "
          f"{groups[:12]} ... (the first wave dissolves: {statistics.fmean(groups[5:]):.1f} per send after the fifth); "
          f"TTFT p50 {run.ttft_ms()['p50']:.0f} ms (measured 1,071)")


def main() -> int:
    print("Measured windows (AIPerf records + decode log) beside the lone grid and the planner; ms unless named\n")
    header = (f"{'run':<27}{'N':>3} {'reqs':>5} {'in sys':>6} {'batch':>6} {'logged':>6} {'step':>6} {'ITL p50':>7} "
              f"{'lone@b':>6} {'TTFT p50':>8} {'out tok/s':>9}")
    print(header)
    rows = []
    for label, rel, folder, config, gpu, lone, ours in RUNS:
        records, lines = read_archive(rel, folder)
        for n in sorted(records):
            t = window_terms(records[n], lines)
            t["lone_ms"] = lone_step_ms(lone, t["decode_batch"])
            rows.append((label, n, config, gpu, ours, t))
            print(f"{label:<27}{n:>3} {t['requests']:>5} {t['in_system']:>6.2f} {t['decode_batch']:>6.2f} "
                  f"{t['logged_running']:>6.2f} {t['step_ms']:>6.2f} {t['itl_p50']:>7.3f} {t['lone_ms']:>6.2f} "
                  f"{t['ttft_p50']:>8.1f} {t['output_tok_s']:>9,.0f}")
    print("\nbatch: time-average requests between first token and end; logged: mean #running-req of the window's "
          "decode lines;\nstep: window seconds / (40 x its decode lines); lone@b: the lone grid (same GPU kind, random-id "
          "prompts) at that batch, context 4,096")

    print("\nIn-loop step against the lone grid at the same batch (ITL p50 / lone@b - 1):")
    for label, n, *_, t in rows:
        print(f"  {label:<27} N={n:<3} ITL {t['itl_p50']:.2f} vs lone {t['lone_ms']:.2f}: {t['itl_p50'] / t['lone_ms'] - 1:+.0%}")

    print("\nWhat the responses carried (every request of each file, warm-up included):")
    for label, n, _, _, ours, t in rows:
        totals = t["byte_totals"]
        per_token = f", {content_bytes_per_token(totals[0]):.3f} content bytes per token" if ours and len(totals) == 1 else ""
        print(f"  {label:<27} N={n:<3} output tokens {t['osl']}, distinct response byte totals {len(totals)} "
              f"({totals[0]:,} B{per_token})")

    print("\nThe planner at each point: per-request decode routing (before) -> at most two routing tokens (now)")
    print(f"{'run':<27}{'N':>3} {'batch meas':>10} {'batch model':>12} {'step@meas':>14} {'ITL p50 model / meas':>26} "
          f"{'TTFT p50 model / meas':>26} {'out tok/s model / meas':>28}")
    seen: set[tuple[str, str, int]] = set()
    for label, n, config, gpu, _, t in rows:
        key = (config, gpu, n)
        before = planner(config, gpu, n, t["decode_batch"], True)
        after = planner(config, gpu, n, t["decode_batch"], False)
        seen.add(key)
        print(f"{label:<27}{n:>3} {t['decode_batch']:>10.2f} {before['batch']:>5.2f}->{after['batch']:<6.2f}"
              f"{before['step_at_measured_ms']:>6.2f}->{after['step_at_measured_ms']:<6.2f}"
              f"{before['itl_p50']:>7.2f}->{after['itl_p50']:.2f} / {t['itl_p50']:.2f}{'':>7}"
              f"{before['ttft_p50']:>7.0f}->{after['ttft_p50']:.0f} / {t['ttft_p50']:.0f}{'':>9}"
              f"{before['output_tok_s']:>7,.0f}->{after['output_tok_s']:,.0f} / {t['output_tok_s']:,.0f}")
    organisers_waves()
    ended, starts = greedy_cycles()
    print(f"\nThe dummy loader's argument on CPU (4,096 x 512 random stream, lm_head = embedding, norm = the stream's head): "
          f"{ended} of {starts} greedy chains end in a cycle of at most 2 tokens within 8 steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
