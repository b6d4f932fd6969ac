"""`pd-orchestrator sweep`: accuracy gate -> per ISL/OSL pair: warm-up -> fixed-concurrency levels -> table, plot, JSON.

InferenceMAX-style serving sweep against our router's HTTP API: random-length prompts cut from ShareGPT
text as SGLang's `random` dataset does (`orchestrator.workload.random_prompts`), each level
closed-loop at a fixed concurrency with streaming `/generate` (`orchestrator.api.client`). The
accuracy gate (`orchestrator.run.accuracy`) runs first and aborts the sweep when outputs are wrong.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.api.client import LevelMetrics, auth_headers, run_at_concurrency, summarize
from orchestrator.config import RunConfig
from orchestrator.records import BenchRequest
from orchestrator.run import accuracy

DEFAULT_PAIRS = "1024/1024,1024/8192,8192/1024"
DEFAULT_CONCURRENCY = "4,8,16,32,64"
PROMPTS_PER_CONCURRENCY = 10  # InferenceMAX sends 10 x concurrency prompts per level
WARMUP_MAX_OUTPUT_TOKENS = 32  # as bench_serving: warm-up requests are capped at 32 output tokens


class SweepError(ValueError):
    """Bad sweep arguments; the message names the flag and the accepted form."""


class WarmupFailed(RuntimeError):
    """Every warm-up request failed: the deployment is not serving, so measuring it would be meaningless."""


@dataclass(frozen=True)
class SweepPlan:
    """What to measure: ISL/OSL pairs x concurrency levels, and how many prompts each level sends."""

    pairs: list[tuple[int, int]]
    concurrencies: list[int]
    range_ratio: float = 1.0
    num_prompts_per_level: int | None = None  # None: PROMPTS_PER_CONCURRENCY x concurrency
    warmup: int = 8
    seed: int = 2025
    dataset_path: str | None = None
    request_timeout_s: float = 3600.0

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts_per_level or PROMPTS_PER_CONCURRENCY * concurrency


@dataclass
class PairResult:
    """All levels of one ISL/OSL pair."""

    isl: int
    osl: int
    range_ratio: float
    levels: list[LevelMetrics] = field(default_factory=list)
    table_path: str | None = None
    plot_path: str | None = None


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """'1024/1024,8192/1024' -> [(1024, 1024), (8192, 1024)]."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        isl, sep, osl = part.partition("/")
        if not sep or not isl.strip().isdigit() or not osl.strip().isdigit() or int(isl) < 1 or int(osl) < 1:
            raise SweepError(f"--isl-osl: {part!r} is not ISL/OSL with positive integers, e.g. 1024/1024")
        pairs.append((int(isl), int(osl)))
    if not pairs:
        raise SweepError("--isl-osl: give at least one ISL/OSL pair, e.g. 1024/1024")
    return pairs


def parse_concurrencies(text: str) -> list[int]:
    """'4,8,16' -> [4, 8, 16]."""
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SweepError(f"--concurrency: {text!r} is not a comma list of integers, e.g. 4,8,16") from None
    if not levels or min(levels) < 1:
        raise SweepError(f"--concurrency: {text!r} needs at least one level, each >= 1")
    return levels


def gpu_count(cfg: RunConfig) -> int:
    """GPUs the layout occupies: servers x GPUs per server over every worker group."""
    return sum(g.count * g.gpus_per_server for _, _, g in cfg.layout.groups())


def sample_pair_requests(plan: SweepPlan, cfg: RunConfig, isl: int, osl: int, count: int) -> list[BenchRequest]:
    """`count` random-length prompts for one pair, cut from ShareGPT text like SGLang's `random` dataset."""
    from orchestrator.workload.random_prompts import sample_random_requests
    from orchestrator.workload.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.path)
    return list(
        sample_random_requests(
            tokenizer, input_len=isl, output_len=osl, num_prompts=count, range_ratio=plan.range_ratio,
            seed=plan.seed, dataset_path=plan.dataset_path,
        )
    )


def _reindex(requests: list[BenchRequest]) -> list[BenchRequest]:
    return [BenchRequest(index=i, input_ids=r.input_ids, output_len=r.output_len, prompt_len=r.prompt_len,
                         text=r.text) for i, r in enumerate(requests)]


def run_pair(
    url: str, plan: SweepPlan, requests: list[BenchRequest], isl: int, osl: int, num_gpus: int,
    headers: dict[str, str], log=print,
) -> PairResult:
    """Warm up, then run every concurrency level on consecutive slices of `requests`."""
    result = PairResult(isl=isl, osl=osl, range_ratio=plan.range_ratio)
    cursor = 0
    if plan.warmup:
        warm = [
            BenchRequest(index=i, input_ids=r.input_ids, output_len=min(r.output_len, WARMUP_MAX_OUTPUT_TOKENS),
                         prompt_len=r.prompt_len, text=r.text)
            for i, r in enumerate(requests[: plan.warmup])
        ]
        cursor = plan.warmup
        results, _ = asyncio.run(
            run_at_concurrency(url, warm, max(plan.concurrencies), plan.request_timeout_s, headers)
        )
        if not any(r.ok for r in results):
            raise WarmupFailed(f"every warm-up request to {url} failed; first error: {results[0].error}")
    for concurrency in plan.concurrencies:
        n = plan.prompts_for(concurrency)
        level_requests = _reindex(requests[cursor : cursor + n])
        cursor += n
        results, duration = asyncio.run(
            run_at_concurrency(url, level_requests, concurrency, plan.request_timeout_s, headers)
        )
        metrics = summarize(results, duration, concurrency, num_gpus)
        log(
            f"  {isl}/{osl} c={concurrency}: {metrics.completed}/{metrics.num_prompts} ok, "
            f"{metrics.output_throughput_per_gpu:.1f} out tok/s/GPU, "
            f"median e2e {_fmt(metrics.e2e.median_ms)} ms"
            + (f" (first error: {metrics.first_error})" if metrics.failed else "")
        )
        result.levels.append(metrics)
    return result


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_table(pair: PairResult, num_gpus: int, simulated: bool) -> str:
    """Markdown table of one pair: throughput (total and per GPU) and TTFT/TPOT/ITL/e2e mean/median/p99."""
    label = " (SIMULATED engine)" if simulated else ""
    lines = [
        f"### ISL/OSL {pair.isl}/{pair.osl}, range ratio {pair.range_ratio}, {num_gpus} GPUs{label}",
        "",
        "| conc | ok/fail | req/s | out tok/s | total tok/s | out tok/s/GPU | total tok/s/GPU "
        "| TTFT ms mean/med/p99 | TPOT ms mean/med/p99 | ITL ms mean/med/p99 | e2e ms mean/med/p99 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in pair.levels:
        stats = [
            "/".join(_fmt(v) for v in (s.mean_ms, s.median_ms, s.p99_ms)) for s in (m.ttft, m.tpot, m.itl, m.e2e)
        ]
        lines.append(
            f"| {m.concurrency} | {m.completed}/{m.failed} | {m.request_throughput:.2f} | {m.output_throughput:.1f} "
            f"| {m.total_throughput:.1f} | {m.output_throughput_per_gpu:.1f} | {m.total_throughput_per_gpu:.1f} | "
            + " | ".join(stats)
            + " |"
        )
    return "\n".join(lines) + "\n"


def render_plot(pair: PairResult, path: Path, simulated: bool) -> None:
    """PNG: output tok/s per GPU against median e2e latency (one point per concurrency), and TTFT/TPOT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    levels = [m for m in pair.levels if m.completed]
    e2e_s = [(m.e2e.median_ms or 0) / 1000 for m in levels]
    per_gpu = [m.output_throughput_per_gpu for m in levels]
    left.plot(e2e_s, per_gpu, marker="o")
    for m, x, y in zip(levels, e2e_s, per_gpu):
        left.annotate(f"c={m.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    left.set_xlabel("median end-to-end latency (s)")
    left.set_ylabel("output tok/s per GPU")
    left.grid(True, alpha=0.3)
    conc = [m.concurrency for m in levels]
    right.plot(conc, [m.ttft.median_ms or 0 for m in levels], marker="o", label="TTFT median")
    right.plot(conc, [m.tpot.median_ms or 0 for m in levels], marker="s", label="TPOT median")
    right.set_xscale("log", base=2)
    right.set_xlabel("concurrency")
    right.set_ylabel("ms")
    right.legend()
    right.grid(True, alpha=0.3)
    label = " — SIMULATED engine" if simulated else ""
    fig.suptitle(f"ISL/OSL {pair.isl}/{pair.osl}{label}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_sweep(
    cfg: RunConfig, url: str, plan: SweepPlan, gate: accuracy.AccuracyGateSpec, out_dir: Path, log=print,
) -> dict:
    """Gate, then every pair; writes sweep.json (+ a table and a plot per pair) and returns its content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    simulated = cfg.simulated
    num_gpus = gpu_count(cfg)
    headers = auth_headers(cfg.router.api_key_env)
    report: dict = {
        "kind": "pd-orchestrator/sweep/v1",
        "simulated": simulated,
        "config": cfg.name,
        "layout": cfg.layout.describe(),
        "num_gpus": num_gpus,
        "url": url,
        "started_at": time.time(),
        "plan": asdict(plan),
        "accuracy_gate": None,
        "aborted": None,
        "pairs": [],
    }
    json_path = out_dir / "sweep.json"
    try:
        gate_result = accuracy.run_gate(gate, url, cfg, headers)
    except accuracy.AccuracyGateError as exc:
        gate_result = accuracy.GateResult(accuracy.resolve_mode(gate, cfg), False, f"could not run: {exc}")
    report["accuracy_gate"] = gate_result.to_dict()
    log(f"accuracy gate [{gate_result.mode}]: {'PASS' if gate_result.passed else 'FAIL'}: {gate_result.detail}")
    if not gate_result.passed:
        report["aborted"] = f"accuracy gate failed: {gate_result.detail}"
        json_path.write_text(json.dumps(report, indent=2))
        return report
    for isl, osl in plan.pairs:
        needed = plan.warmup + sum(plan.prompts_for(c) for c in plan.concurrencies)
        requests = sample_pair_requests(plan, cfg, isl, osl, needed)
        try:
            pair = run_pair(url, plan, requests, isl, osl, num_gpus, headers, log)
        except WarmupFailed as exc:
            report["aborted"] = f"ISL/OSL {isl}/{osl}: {exc}"
            json_path.write_text(json.dumps(report, indent=2))
            return report
        stem = f"sweep_{isl}x{osl}"
        table = render_table(pair, num_gpus, simulated)
        (out_dir / f"{stem}.md").write_text(table)
        render_plot(pair, out_dir / f"{stem}.png", simulated)
        pair.table_path, pair.plot_path = str(out_dir / f"{stem}.md"), str(out_dir / f"{stem}.png")
        log(table)
        report["pairs"].append(asdict(pair))
        json_path.write_text(json.dumps(report, indent=2))  # keep partial results if a later pair dies
    report["finished_at"] = time.time()
    json_path.write_text(json.dumps(report, indent=2))
    return report


