"""Two-GPU calibration (issue 25; its run is issue 29): what one GPU cannot show, on two GPUs of one node.

One device call (`scripts/device/calibrate.sh twogpu` on an nvidia-h100-x2 / nvidia-h200-x2):
1. collectives: NCCL all-reduce, all-to-all and a point-to-point send between the two GPUs at the message
   sizes decode and prefill use (bf16 activations of 1 ... 8192 tokens of R1's hidden size), by
   scripts/device/collectives_bench.py under torch.distributed.run (torch only on the GPU machine);
2. per layout, one SGLang server (the R1-shaped model of benchmarks/calibration/r1-shaped/) through
   single.py's plan runner: its start-up, prefill forwards (one request and k at once: the PP bubble is one
   chunk's latency against the per-chunk time of k chunks in flight) and decode steps vs batch and context:
     tp2          --tp-size 2                                          (two all-reduces per layer)
     dpattn2-ep2  --tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2   (gather / all-to-all MoE)
     pp2          --pp-size 2                                          (micro-batches over two stages)
     tp2-eager    tp2 with --disable-cuda-graph: eager decode steps and context only, each point twice in a row
     pp2-tail     pp2's decode batch 512 and context points only
Everything lands in OUT/calibration-twogpu.json (+ collectives.json) as it is measured. The driver is stdlib
only, like the rest of orchestrator/calibrate; `--dry-run` prints the plan and commands and starts nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

LAYOUTS: dict[str, list[str]] = {
    # 2026-11-26 (issue 29, 2 x H200): with SGLang's auto-enabled FlashInfer all-reduce fusion (DeepseekV3, SM90)
    # the tp2 start hung twice after its symmetric-memory set-up; DP attention and PP did not enable it and started
    "tp2": ["--tp-size", "2", "--enforce-disable-flashinfer-allreduce-fusion"],
    "dpattn2-ep2": ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"],
    "pp2": ["--pp-size", "2"],
    # issue 25 (h25eager): an eager TP2 decode step (no CUDA graph: what a decode runs past its captured batches),
    # the fusion off as in tp2
    "tp2-eager": ["--tp-size", "2", "--enforce-disable-flashinfer-allreduce-fusion", "--disable-cuda-graph"],
    # pp2's points that the first run's budget cut off (decode batch 512, context), same flags and graphs as pp2
    "pp2-tail": ["--pp-size", "2"],
}
# layouts that measure only some points (the others were measured by the layout they extend)
ONLY: dict[str, dict] = {
    # each eager point twice in a row: the first use of a shape against a warm repeat (lease 3, issue 25)
    "tp2-eager": {"measure": ["decode", "context"], "cuda_graphs": False, "repeats": 2},
    "pp2-tail": {"measure": ["decode", "context"], "decode_batches": [512]},
}
# tokens of one collective: decode batches and prefill chunks (bytes = tokens x hidden x 2, bf16)
COLLECTIVE_TOKENS = [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
COLLECTIVES_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "collectives_bench.py"
MIN_BUDGET_S = 120


class TwoGpuArgsError(ValueError):
    """A bad argument of `calibrate twogpu`: the message names the flag and the fix."""


def parse_layouts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if not names or unknown:
        raise TwoGpuArgsError(f"--layouts {text!r}: unknown {unknown or 'empty'}; use a comma-separated subset of "
                              f"{','.join(LAYOUTS)}")
    return names


def parse_tokens(text: str) -> list[int]:
    try:
        tokens = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TwoGpuArgsError(f"--collective-tokens {text!r}: not a comma-separated list of integers") from None
    if not tokens or min(tokens) < 1:
        raise TwoGpuArgsError(f"--collective-tokens {text!r}: token counts must be >= 1")
    return tokens


def check_budget(budget_s: float) -> None:
    if budget_s < MIN_BUDGET_S:
        raise TwoGpuArgsError(f"--budget-s {budget_s:g}: two server starts alone take minutes; give at least "
                              f"{MIN_BUDGET_S} s (one device call allows 600)")


# Fewer points than the one-GPU plan (single.py), so that three starts fit one 600 s call: CUDA graphs only at the
# decode batches measured (8 captures instead of 36: the cold start's Triton compiles scale with them), prefill up
# to 16,000 tokens (two chunks: the pipeline can overlap them) and k chunks at once, context at batch 16.
GRAPH_BATCHES = [1, 8, 16, 32, 64, 128, 256, 512]
DECODE_BATCHES = [1, 8, 32, 64, 128, 256, 512]
PREFILL_LENGTHS = [256, 1024, 4096, 8192, 16000]
PREFILL_CONCURRENT = [[4, 1024], [16, 1024], [8, 4096]]
CONTEXT_LENGTHS = [256, 2048, 8192]
MIN_LEFT_S = 150   # a start with less left than this could not measure anything: skip it
READY_TIMEOUT_S = 240   # one cold R1-shaped start with 36 graphs took 196 s on an H100, 140 s on an H200


def plan(layouts: list[str], mem_fraction: str = "0.70") -> list[dict]:
    """single.py variants, one per layout: start-up, prefill (one chunk and k chunks), decode, context."""
    graphs = ["--cuda-graph-max-bs-decode", str(max(GRAPH_BATCHES)),
              "--cuda-graph-bs-decode", *[str(b) for b in GRAPH_BATCHES]]
    variants = []
    for i, name in enumerate(layouts):
        only = ONLY.get(name, {})
        variants.append({"name": name, "cache_state": "warm" if i else "cold",
                         "flags": [*LAYOUTS[name], "--mem-fraction-static", mem_fraction,
                                   *(graphs if only.get("cuda_graphs", True) else [])],
                         "measure": only.get("measure", ["prefill", "decode", "context"]),
                         "prefill_lengths": PREFILL_LENGTHS, "prefill_concurrent": PREFILL_CONCURRENT,
                         "decode_batches": only.get("decode_batches", DECODE_BATCHES),
                         "context_lengths": CONTEXT_LENGTHS, "min_left_s": MIN_LEFT_S,
                         "repeats": only.get("repeats", 1)})
    return variants


def collectives_command(out_dir: Path, hidden: int, tokens: list[int], python: str = sys.executable) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(COLLECTIVES_SCRIPT),
            "--out", str(out_dir / "collectives.json"), "--hidden", str(hidden),
            "--tokens", ",".join(str(t) for t in tokens)]


def pp_bubble(prefill_rows: list[dict]) -> dict | None:
    """One chunk alone against the per-chunk time of k chunks at once, for each k measured (pp2 only)."""
    alone = {r["input_tokens"]: r["latency_s_median"] for r in prefill_rows
             if r.get("concurrency") == 1 and r.get("latency_s_median")}
    out = {}
    for r in prefill_rows:
        k, L, t = r.get("concurrency"), r.get("input_tokens"), r.get("latency_s_median")
        if k and k > 1 and t and alone.get(L):
            out[f"{k}x{L}"] = round(alone[L] / (t / k), 3)  # > 1: chunks overlap across the stages
    return out or None


def run_twogpu(model_path: str, out_dir: Path, budget_s: float, layouts: list[str], tokens: list[int],
               collectives: bool = True, flags: list[str] | None = None, port: int = 30000) -> dict:
    from .single import Budget, run_single

    budget = Budget(budget_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    hidden = int(json.loads((Path(model_path) / "config.json").read_text())["hidden_size"])
    summary: dict = {"layouts": layouts, "collectives": None}
    if collectives:
        cmd = collectives_command(out_dir, hidden, tokens)
        print("collectives: " + " ".join(cmd), flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, min(150.0, budget.left() / 4)))
            (out_dir / "collectives.log").write_text(done.stdout + done.stderr)
            summary["collectives"] = {"rc": done.returncode, "wall_s": round(time.monotonic() - started, 1)}
        except subprocess.TimeoutExpired:
            summary["collectives"] = {"rc": None, "error": "timed out"}
    # a start that hangs (a collective that never completes) must not eat the layouts after it
    result = run_single(model_path, "twogpu", out_dir, budget.left() - 5, port=port, plan=plan(layouts),
                        common_flags=flags, ready_timeout_s=READY_TIMEOUT_S)
    for run in result["runs"]:
        if run["variant"] == "pp2" and run.get("prefill"):
            run["pp_bubble"] = pp_bubble(run["prefill"])
    result["twogpu"] = summary
    (out_dir / "calibration-twogpu.json").write_text(json.dumps(result, indent=1))
    return result


def dry_run(model_path: str, out_dir: Path, layouts: list[str], tokens: list[int], flags: list[str]) -> str:
    """What a run would do, without starting anything."""
    lines = [f"two-GPU calibration of {model_path} -> {out_dir}",
             "collectives: " + " ".join(collectives_command(out_dir, 7168, tokens))]
    for variant in plan(layouts):
        points = {"prefill": f"prefill L {variant['prefill_lengths']} + k x L {variant['prefill_concurrent']}",
                  "decode": f"decode B {variant['decode_batches']}",
                  "context": f"context B=16 C {variant['context_lengths']}"}
        twice = f"; each decode/context point {variant['repeats']} times in a row" if variant["repeats"] > 1 else ""
        lines.append(f"server {variant['name']}: sglang.launch_server {' '.join([*variant['flags'], *flags])}; "
                     f"measure {', '.join(variant['measure'])} ({'; '.join(points[m] for m in variant['measure'])}){twice}; "
                     f"skipped with < {variant['min_left_s']} s left")
    return "\n".join(lines)
