"""The three DP-attention 2 + EP2 back-test rows (h200x2-r1s6-dpattn2-ep2-*) term by term: what the client wall of each
point is made of in the raw files, next to the planner's terms for the same server.

Raw (out-of-sample; nothing here is fitted): benchmarks/results/2026-11-26-two-gpu-h200x2/call3-calibration/
  calibration-twogpu-b.json (the points: client wall, median decode step per DP rank) and logs-twogpu-b.tar.xz
  (twogpu-b/server-twogpu-dpattn2-ep2.log: SGLang 0.5.17's "Prefill batch" lines per DP rank).

A "Prefill batch" line is printed when that rank's prefill result is processed (managers/scheduler_components/
batch_result_processor.py -> metrics_reporter.report_prefill_stats) and its "input throughput" is the batch's new
tokens over the time since that rank's previous prefill line, so tokens / throughput is the gap between two
consecutive prefill results of a rank: one lockstep forward in steady state, longer when the rank waited. The first
gap of a point is measured from the previous point's last prefill and is left out.

The client (orchestrator/calibrate/client.py) sends the k prompts from k threads, one HTTP connection each; every
request of a decode point ends within a few decode steps of the others, so wall - a request's latency is about when
it was sent after the pool started: the harness's own send spread, which the planner (all k sent at once) has not.

Per point: wall = (prefill phase, incl. the answer latency) + (steps - 1) x the measured decode step; the model's
wall is the back-test's prediction of the row (plan/backtest/predict.py), its terms the same server's (two_gpu_vs_model.
server_model) prefill forwards for the k prompts sent at once (scheduling/steps.py burst_prefill) and 99 decode steps.

Usage (repo root; no GPU):  .venv/bin/python benchmarks/dp_attention_rows.py
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.perfmodel.parallel.two_gpu_vs_model import server_model  # noqa: E402
from orchestrator.perfmodel.scheduling.limits import server_limits  # noqa: E402
from orchestrator.perfmodel.scheduling.steps import burst_prefill  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, load_dataset  # noqa: E402
from orchestrator.plan.backtest.predict import predict_row  # noqa: E402

CALL = ROOT / "benchmarks/results/2026-11-26-two-gpu-h200x2/call3-calibration"
RAW = CALL / "calibration-twogpu-b.json.xz"
LOGS = CALL / "logs-twogpu-b.tar.xz"
LOG_MEMBER = "twogpu-b/server-twogpu-dpattn2-ep2.log"
TP2_RAW = ROOT / "benchmarks/results/2026-11-26-two-gpu-tp2-h200x2/calibration-twogpu-tp2.json.xz"  # another host
ROWS = (("h200x2-r1s6-dpattn2-ep2-decode-128x256", "decode", 128, 256),
        ("h200x2-r1s6-dpattn2-ep2-decode-512x256", "decode", 512, 256),
        ("h200x2-r1s6-dpattn2-ep2-long-16x8192", "context", 16, 8192))
LINE = re.compile(r"\[\S+ \S+ (DP\d) TP\d EP\d\] (Prefill|Decode) batch, (.*)")
STALL = 3.0  # a gap this many times the point's median forward is reported as a stall


def _fields(text: str) -> dict[str, float]:
    """{'new-seq': 16.0, 'input throughput': 95689.36, ...} of one log line's "name: number" pairs."""
    pairs = (part.rsplit(": ", 1) for part in text.split(", ") if ": " in part)
    return {name.lstrip("#").replace(" (token/s)", ""): float(v) for name, v in pairs
            if v.replace(".", "", 1).isdigit()}


def log_lines() -> list[tuple[str, str, dict[str, float]]]:
    with tarfile.open(LOGS) as tar:
        member = tar.extractfile(LOG_MEMBER)
        assert member is not None
        text = member.read().decode()
    return [(m.group(1), m.group(2), _fields(m.group(3))) for m in map(LINE.search, text.splitlines()) if m]


def point_prefills(lines, point: dict) -> list[tuple[str, dict[str, float]]]:
    """The prefill lines of one point: those between the previous point's decode lines and this point's first."""
    _, rank, running, tokens, _ = point["decode_lines"][0]
    first = next(i for i, (r, kind, f) in enumerate(lines) if kind == "Decode" and r == rank.split()[0]
                 and f["running-req"] == running and f["token"] == tokens)
    out: list[tuple[str, dict[str, float]]] = []
    for r, kind, f in reversed(lines[:first]):
        if kind == "Decode" and out:
            break
        if kind == "Prefill":
            out.append((r, f))
    return out[::-1]


def log_terms(prefills) -> dict:
    """Forwards per rank, the lone first forward, the gaps (median, stalls) and the continuations after a prefix hit."""
    by_rank: dict[str, list[dict[str, float]]] = {}
    for rank, f in prefills:
        by_rank.setdefault(rank, []).append(f)
    gaps = {r: [f["new-token"] / f["input throughput"] * 1e3 for f in fs[1:]] for r, fs in by_rank.items()}
    median = statistics.median(g for gs in gaps.values() for g in gs)
    stalls = sorted({round(g) for r, gs in gaps.items() for g, f in zip(gs, by_rank[r][1:]) if g > STALL * median})
    # gaps[r][i] ends at result i + 1; a rank's results from its first prefix hit on carry a continuation
    hit = {r: i for r, fs in by_rank.items() for i in [next((i for i, f in enumerate(fs) if f["cached-token"] > 0), -1)]
           if i >= 0}
    after = [g for r, i in hit.items() for g in gaps[r][i:] if g <= STALL * median]
    before = [g for r, gs in gaps.items() for g in (gs[:hit[r] - 1] if r in hit else gs) if g <= STALL * median]
    return dict(forwards={r: len(fs) for r, fs in by_rank.items()},
                first_seqs=int(prefills[0][1]["new-seq"]), median_ms=median, stalls_ms=stalls,
                before_hit_ms=statistics.median(before) if before else None,
                after_hit_ms=statistics.median(after) if after else None,
                hits=hit)


def main() -> int:
    raw = json.loads(read_text(RAW))
    run = next(r for r in raw["runs"] if r["variant"] == "dpattn2-ep2")
    model = server_model(run, "H200", 6)
    lines = log_lines()
    data = load_dataset()
    rows = {r["id"]: r for r in data["runs"]}
    print(f"DP-attention 2 + EP2, R1 shape x 6, two H200s ({RAW.relative_to(ROOT)}; log {LOGS.name}:{LOG_MEMBER})")
    flag = int(model.chunked_prefill_tokens or 0)
    print(f"model: {model.tp=} {model.dp=} {model.ep=} dp_attention chunk flag {flag} "
          f"(each rank {flag // model.attn_dp}); answer latency {model.gpu.answer_latency_s * 1e3:.1f} ms\n")
    for row_id, measure, k, length in ROWS:
        point = next(p for p in run[measure] if p["batch_size"] == k and p["context_tokens"] == length)
        steps, step_ms, wall = point["decode_steps"], point["step_ms_median"], point["client"]["wall_s"]
        decode_s = (steps - 1) * step_ms / 1e3
        terms = log_terms(point_prefills(lines, point))
        forwards = burst_prefill(server_limits(model), model, [length] * k)
        m_prefill = sum(f.duration_s for f in forwards)
        m_step = model.decode_step_s(k, k * (length + 50))
        predicted = predict_row(rows[row_id], data.get("batches", {}), DATASET.parent)
        assert not isinstance(predicted.predicted, str) and not isinstance(predicted.measured, str)
        m_wall = predicted.measured / predicted.predicted * wall  # tokens over the wall: the same tokens
        print(f"{row_id}: wall measured {wall:.3f} s, back-test prediction {m_wall:.3f} s ({predicted.error:+.1%} tok/s)")
        print(f"  decode, {steps - 1} steps: measured {step_ms:.2f} ms/step = {decode_s:.3f} s; model "
              f"{m_step * 1e3:.2f} ms/step = {(steps - 1) * m_step:.3f} s")
        print(f"  prefill phase (wall - decode, incl. answer latency): measured {wall - decode_s:.3f} s; model "
              f"{len(forwards)} forwards {m_prefill:.3f} s + answer {model.gpu.answer_latency_s:.3f} s "
              f"(first forward {len(forwards[0].prefill)} request(s), {forwards[0].duration_s * 1e3:.1f} ms)")
        print(f"  log: prefill results per rank {terms['forwards']}, the server's first forward holds "
              f"{terms['first_seqs']} request(s); median gap {terms['median_ms']:.1f} ms; stalls (> {STALL:g}x the "
              f"median) {terms['stalls_ms'] or 'none'} ms")
        client = point["client"]
        print(f"  client (every request ends within a few steps of the others): wall - latency max / median "
              f"{(wall - client['latency_s_max']) * 1e3:.0f} / {(wall - client['latency_s_median']) * 1e3:.0f} ms, "
              f"the time after the pool started that the slowest and the median request were sent")
        if terms["hits"]:
            print(f"  log: a prefix hit (#cached-token > 0) at result {terms['hits']} of its rank makes one request "
                  f"chunked; gaps before {terms['before_hit_ms']:.1f} ms, from then on {terms['after_hit_ms']:.1f} ms "
                  f"(every later batch of that rank carries a continuation: the absorbed MLA path)")
        print()
    print("the harness's send spread, both two-GPU files (wall - latency median / max, ms; decode and context points):")
    for path, variant in ((TP2_RAW, "tp2"), (RAW, "dpattn2-ep2")):
        other = next(r for r in json.loads(read_text(path))["runs"] if r["variant"] == variant)
        cells = [f"{p['batch_size']}x{p['context_tokens']} {(p['client']['wall_s'] - p['client']['latency_s_median']) * 1e3:.0f}"
                 f"/{(p['client']['wall_s'] - p['client']['latency_s_max']) * 1e3:.0f}"
                 for p in other["decode"] + other["context"] if p["batch_size"] >= 32]
        print(f"  {variant:12s} " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
