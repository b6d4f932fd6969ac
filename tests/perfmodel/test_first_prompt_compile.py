"""The cold first-prompt compile of a PD prefill (StartupTerms.first_prompt_compile_s) is what the two fresh-machine
prefill logs measured, and it applies only where the logs say it does: cold caches, a server without decode graphs."""

from __future__ import annotations

import re
import statistics
import tarfile
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.server.startup import COLD_FIRST_PROMPT_COMPILE_S, COLD_SECOND_SHAPE_COMPILE_S

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# the fresh-machine PD runs whose bench warm-up met both compiles (lease 9, lease 13)
ARCHIVES = [RESULTS / "2026-11-27-warmup-fix-h100" / "pd-warmupfix.tar.xz",
            RESULTS / "2026-11-27-lease13-h100" / "call5-pd" / "pd-warmupfix.tar.xz"]
_ITER = re.compile(r"PDO_ITER .*?run_ms=([0-9.]+)")
_BATCH = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")


def prompt_forwards_after_ready(text: str) -> list[tuple[int, int, float]]:
    """(sequences, new tokens, run_batch ms) of every prefill forward after `ready to roll`: each PDO_ITER times the
    batch whose `Prefill batch` line follows it (SGLang logs that line as it processes the result)."""
    out, run_ms = [], None
    for line in text.split("The server is fired up and ready to roll", 1)[1].splitlines():
        if m := _ITER.search(line):
            run_ms = float(m.group(1))
        elif (m := _BATCH.search(line)) and run_ms is not None:
            out.append((int(m.group(1)), int(m.group(2)), run_ms))
            run_ms = None
    return out


def first_two_compiles(archive: Path) -> tuple[float, float]:
    """run_batch seconds of the prefill's first prompt forward (more than one token) after ready, and of its next
    one-sequence prompt forward."""
    with tarfile.open(archive) as tar:
        name = next(n for n in tar.getnames() if n.endswith("/prefill-0-0.log"))
        text = tar.extractfile(name).read().decode()
    prompts = [f for f in prompt_forwards_after_ready(text) if f[1] > 1]
    first = prompts[0]
    second = next(f for f in prompts[1:] if f[0] == 1)
    return first[2] / 1000, second[2] / 1000


def test_the_cold_compile_figures_are_the_two_prefill_logs_means() -> None:
    measured = [first_two_compiles(a) for a in ARCHIVES]
    assert measured == [(pytest.approx(11.193, abs=1e-3), pytest.approx(3.010, abs=1e-3)),
                        (pytest.approx(10.177, abs=1e-3), pytest.approx(2.315, abs=1e-3))]
    assert COLD_FIRST_PROMPT_COMPILE_S == pytest.approx(statistics.mean(m[0] for m in measured), abs=1e-3)
    assert COLD_SECOND_SHAPE_COMPILE_S == pytest.approx(statistics.mean(m[1] for m in measured), abs=1e-3)


def test_only_a_server_without_decode_graphs_pays_it_and_only_on_cold_caches() -> None:
    cfg = load_config(ROOT / "configs/device-h100x1-1p1d.yaml")
    prefill = cost_model_for(cfg, "prefill", cfg.layout.prefill[0])
    decode = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    assert not prefill.graph_batch_sizes() and decode.graph_batch_sizes()
    assert prefill.first_prompt_compile_s(jit_cached=False) == pytest.approx(
        COLD_FIRST_PROMPT_COMPILE_S + COLD_SECOND_SHAPE_COMPILE_S)
    assert prefill.first_prompt_compile_s(jit_cached=True) == 0.0
    assert decode.first_prompt_compile_s(jit_cached=False) == 0.0
    agg = load_config(ROOT / "configs/device-h100x1-agg.yaml")
    assert cost_model_for(agg, "aggregated", agg.layout.aggregated[0]).first_prompt_compile_s(jit_cached=False) == 0.0


def test_block_fp8_prefills_pay_no_first_prompt_compile_and_bf16_ones_do() -> None:
    """Over every cold PD prefill log on record (benchmarks/startup_capture_by_shape.py COLD_PREFILLS): the bf16 V2-Lite
    ones spent >= 10 s on their first prompt forward after ready, none of the block-FP8 Qwen3-shaped ones spent 1.5 s on
    any of their first three; the model charges the compile by weight format accordingly."""
    from benchmarks.startup_capture_by_shape import COLD_PREFILLS, RESULTS as LOGS, prefill_forwards, read_member

    first: dict[str, list[float]] = {"bf16": [], "FP8": []}
    for shape, _, archive in COLD_PREFILLS:
        prompts = [f for f in prefill_forwards(read_member(LOGS / archive, "prefill-0-0.log")) if f[0] and f[2] > 1]
        first["FP8" if "FP8" in shape else "bf16"].append(max(f[3] for f in prompts[:3]) / 1000)
    assert len(first["FP8"]) == 5 and len(first["bf16"]) == 2
    assert min(first["bf16"]) >= 10 and max(first["FP8"]) < 1.5
    qwen3 = load_config(ROOT / "configs/device-h100x1-qwen3-serve.yaml")
    fp8 = cost_model_for(qwen3, "prefill", qwen3.layout.prefill[0])
    assert fp8.quantization == "fp8" and not fp8.graph_batch_sizes()
    assert fp8.first_prompt_compile_s(jit_cached=False) == 0.0
    v2lite = load_config(ROOT / "configs/device-h100x1-1p1d.yaml")
    bf16 = cost_model_for(v2lite, "prefill", v2lite.layout.prefill[0])
    assert bf16.quantization == "bf16"
    assert bf16.first_prompt_compile_s(jit_cached=False) == pytest.approx(
        COLD_FIRST_PROMPT_COMPILE_S + COLD_SECOND_SHAPE_COMPILE_S)
