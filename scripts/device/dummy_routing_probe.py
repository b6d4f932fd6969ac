"""One-GPU dummy-weight routing probe (issue 25): R1-shaped layers (benchmarks/calibration/r1-shaped, 6 layers,
FP8 block, `--load-format dummy`) on one GPU, four server starts in one device call (scripts/device/dummy_routing.sh).
Any MoE config.json works as --model-path: the Qwen3-235B-A22B shape (models/qwen3-235b-a22b-fp8-l6, 128 experts,
top 8, softmax router) runs the two count variants in scripts/device/qwen3_probe.sh.

  dummy-graphs        decode step vs batch 1..512 (context 256) and vs context (batch 16), CUDA graphs: the step
                      a contest run takes (calibrate single's decode / context measurements)
  dummy-eager-count   eager (--disable-cuda-graph): how many distinct routed experts each MoE layer call touches at
                      batch 1..512 (sitecustomize.py records select_experts), and the eager step time
  random-eager-count  the same with every MoE gate randomised after the dummy load (real-like routing)
  random-graphs       decode vs batch and context with the randomised gates: the uniform-routing step

Writes OUT/summary.json (per variant: decode steps; distinct experts per decode batch) next to the raw
calibration JSONs, server logs and traces, as it goes. Stdlib only on this side (the hook needs torch, which
the GPU machine's SGLang tree has). `--dry-run` prints the plan and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
HOOK_DIR = Path(__file__).resolve().parent / "dummy_routing"
VARIANTS = {  # name: (randomised gate, eager + expert trace, share of the budget)
    "dummy-graphs": (False, False, 4),
    "dummy-eager-count": (False, True, 2),
    "random-eager-count": (True, True, 2),
    "random-graphs": (True, False, 3),
}
COUNT_BATCHES = [1, 8, 32, 128, 512]
COUNT_PROMPT, COUNT_STEPS = 256, 24


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="a folder with the R1-shaped config.json")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, required=True, help="wall seconds for all variants (one device call: <= 600)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--count-batches", default=",".join(map(str, COUNT_BATCHES)), help="decode batches of the counts")
    p.add_argument("--count-prompt", type=int, default=COUNT_PROMPT,
                   help="prompt tokens per request of the counts (a prefill call of k prompts has k times this many "
                        "tokens: pick one whose multiples are no decode batch, e.g. 250 for power-of-two batches)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--flag", action="append", default=[], help="extra SGLang flag for every server (repeat; --flag=--x)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    a = p.parse_args(argv)
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or not a.variants:
        p.error(f"--variants: unknown {bad or 'empty'}; use a subset of {','.join(VARIANTS)}")
    try:
        a.count_batches = [int(x) for x in a.count_batches.split(",") if x.strip()]
    except ValueError:
        p.error(f"--count-batches {a.count_batches!r}: not a comma-separated list of integers")
    if not a.count_batches or min(a.count_batches) < 1:
        p.error("--count-batches: batch sizes must be >= 1")
    if a.budget_s < 120:
        p.error(f"--budget-s {a.budget_s:g}: a server start alone takes about a minute; give at least 120")
    if a.count_prompt < 1:
        p.error(f"--count-prompt {a.count_prompt}: prompts need at least one token")
    config = Path(a.model_path) / "config.json"
    if not config.is_file():
        p.error(f"--model-path {a.model_path}: no config.json there; give the model folder (R1- or Qwen3-shaped)")
    if not routed_experts(json.loads(config.read_text())):
        p.error(f"--model-path {a.model_path}: its config.json names no routed experts (n_routed_experts or "
                "num_experts); give an MoE model folder")
    return a


def routed_experts(config: dict) -> int:
    """Routed experts per MoE layer: DeepSeek's n_routed_experts, Qwen2/3-MoE's num_experts; 0 for a dense model."""
    return int(config.get("n_routed_experts") or config.get("num_experts") or 0)


def env_for(name: str, out: Path) -> dict[str, str]:
    gate, eager, _ = VARIANTS[name]
    env = {"PYTHONPATH": os.pathsep.join([str(HOOK_DIR), os.environ.get("PYTHONPATH", "")])}
    if gate:
        env["PDO_PROBE_GATE"] = "random"
    if eager:
        env["PDO_PROBE_TRACE"] = str(out / f"trace-{name}.jsonl")
    return env


# decode graphs only at the measured batches (calibrate single's DECODE_BATCHES), no prefill graphs: a start
# captures 9 sizes instead of 36 (the H100 calibration's cold capture took 124 s for 36)
GRAPH_FLAGS = ["--cuda-graph-bs-decode", "1", "8", "32", "64", "128", "192", "256", "384", "512",
               "--disable-prefill-cuda-graph"]


def flags_for(name: str, extra: list[str]) -> list[str]:
    mode = ["--disable-cuda-graph"] if VARIANTS[name][1] else GRAPH_FLAGS
    return ["--mem-fraction-static", "0.70", "--context-length", "16384", *mode, *extra]


def distinct_by_batch(trace: Path, batches: list[int]) -> dict:
    """Mean / median / min / max distinct routed experts per MoE layer call at each decode batch (calls with
    tokens == B; the median is robust to a prefill call of exactly B tokens)."""
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()] if trace.is_file() else []
    out = {}
    for b in batches:
        seen = [r["distinct"] for r in rows if r["tokens"] == b]
        if seen:
            out[str(b)] = {"calls": len(seen), "mean": round(statistics.mean(seen), 2), "min": min(seen), "max": max(seen),
                           "median": statistics.median(seen), "experts": rows[0]["experts"]}
    return out


def run_count(name: str, a: argparse.Namespace, budget_s: float) -> dict:
    """An eager server: decode batches of COUNT_STEPS steps; the step time from SGLang's log, the experts from the trace."""
    from orchestrator.calibrate import logparse
    from orchestrator.calibrate.client import generate_many, random_ids
    from orchestrator.calibrate.server import ServerDied, SglangServer

    out = Path(a.out)
    vocab = int(json.loads((Path(a.model_path) / "config.json").read_text())["vocab_size"])
    rng, end = random.Random(2025), time.monotonic() + budget_s
    srv = SglangServer(f"probe/{name}", a.model_path, a.port, out / f"server-{name}.log", flags_for(name, a.flag),
                       env=env_for(name, out))
    result: dict = {"variant": name, "flags": flags_for(name, a.flag), "points": []}
    try:
        srv.start()
        result["ready_after_s"] = srv.wait_ready(max(30.0, end - time.monotonic() - 20))
        for b in a.count_batches:
            if end - time.monotonic() < 20:
                result["points"].append({"batch_size": b, "skipped": "time budget"})
                continue
            offset = srv.log_size()
            s = generate_many(srv.url, [random_ids(rng, a.count_prompt, vocab) for _ in range(b)], COUNT_STEPS)
            step = logparse.decode_step_ms(logparse.decode_lines(srv.log_since(offset)), b)
            result["points"].append({"batch_size": b, "ok": s["ok"], "n": s["n"], **step})
            print(f"  {name} B={b}: eager step {step.get('step_ms_median')} ms, ok {s['ok']}/{s['n']}", flush=True)
            if not srv.alive():
                result["server_died"] = True
                break
    except (ServerDied, TimeoutError, OSError, ValueError) as exc:
        result["error"] = f"{type(exc).__name__}: {str(exc)[-800:]}"
    finally:
        srv.stop()
    result["distinct_experts"] = distinct_by_batch(out / f"trace-{name}.jsonl", a.count_batches)
    return result


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out = Path(a.out)
    if a.dry_run:
        for name in a.variants:
            env = {k: v for k, v in env_for(name, out).items() if k != "PYTHONPATH"}
            print(f"{name}: sglang.launch_server {' '.join(flags_for(name, a.flag))} env {env} "
                  f"{'(counts at batches ' + ','.join(map(str, a.count_batches)) + f', {a.count_prompt}-token prompts)' if VARIANTS[name][1] else '(decode vs batch and context)'}")
        return 0
    from orchestrator.calibrate.single import run_single

    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + a.budget_s
    config = json.loads((Path(a.model_path) / "config.json").read_text())
    summary: dict = {"model": a.model_path, "routed_experts": routed_experts(config),
                     "top_k": config.get("num_experts_per_tok"), "count_prompt_tokens": a.count_prompt, "variants": {}}
    for i, name in enumerate(a.variants):
        weights = [VARIANTS[v][2] for v in a.variants[i:]]
        share = (end - time.monotonic()) * VARIANTS[name][2] / sum(weights)
        if share < 60:
            summary["variants"][name] = {"skipped": f"time budget ({share:.0f} s)"}
            continue
        print(f"[probe] {name}: {share:.0f} s", flush=True)
        if VARIANTS[name][1]:
            summary["variants"][name] = run_count(name, a, share)
        else:
            res = run_single(a.model_path, name, out, share, port=a.port, common_flags=flags_for(name, a.flag),
                             env=env_for(name, out), plan=[{"name": name, "cache_state": "cold" if i == 0 else "warm",
                                                            "flags": [], "measure": ["decode", "context"], "min_left_s": 45}])
            run = res["runs"][0]
            summary["variants"][name] = {"ready_after_s": run.get("ready_after_s"), "error": run.get("error"),
                                         "decode": [{k: r.get(k) for k in ("batch_size", "context_tokens", "step_ms_median",
                                                                          "cuda_graph")} for r in (run.get("decode") or []) + (run.get("context") or [])]}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
