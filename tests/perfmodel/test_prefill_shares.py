"""Prefill share of peak per GPU and per attention path, from the forwards SGLang's logs timed in the calibration
runs (perfmodel/prefill_log.py -> profile -> calibration.fit_prefill_shares -> PrefillTerms.prefill_time_s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.compressed import read_text
from orchestrator.config import config_from_dict
from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.perfmodel.calibration import fit_prefill_shares
from orchestrator.perfmodel.calibration_lookup import find_calibration
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.prefill_log import forwards, prefill_lines

ROOT = Path(__file__).resolve().parents[2]
H200_RUN = ROOT / "benchmarks/results/2026-11-26-dummy-routing-h200/call2"


def test_the_log_gives_each_forward_its_requests_and_time() -> None:
    raw = json.loads(read_text(H200_RUN / "calibration-dummy-graphs.json.xz"))
    log = read_text(H200_RUN / "server-dummy-graphs-dummy-graphs.log.xz")  # committed compressed
    points = forwards(raw, log, "dummy-graphs")
    fresh = [p for p in points if p.per_request == [[8192, 0]]]  # context point 16 x 8192: one prompt per forward
    assert len(fresh) == 15 and all(0.24 < p.time_s < 0.25 for p in fresh)
    # 16 x 15,000: the second forward holds the first prompt's last 6,808 tokens on top of its 8,192 and the next
    # prompt's first 1,384 (chunked prefill 8192), and takes far longer than a fresh chunk
    tail = next(p for p in points if p.per_request == [[6808, 8192], [1384, 0]])
    assert tail.cached_tokens == 8192 and tail.time_s > 5 * fresh[0].time_s
    with pytest.raises(ValueError, match="--variant 'nope'"):
        forwards(raw, log, "nope")
    assert prefill_lines("no prefill here") == []


def test_a_forward_that_did_not_wait_behind_another_is_not_timed() -> None:
    raw = {"runs": [{"variant": "v", "measure": ["decode"], "decode": [
        {"batch_size": 2, "context_tokens": 100, "prefill_batches": 2, "prefill_tokens_logged": 200}]}]}
    line = ("[t] Prefill batch, #new-seq: {s}, #new-token: {t}, #cached-token: 0, token usage: 0.00, #running-req: 0, "
            "#queue-req: {q}, #pending-token: 0, cuda graph: False, input throughput (token/s): {thr}\n")
    waited = line.format(s=1, t=100, q=1, thr=1.0) + line.format(s=1, t=100, q=0, thr=1000.0)
    assert [p.time_s for p in forwards(raw, waited, "v")] == [0.1]  # the first of a point is never timed
    alone = line.format(s=1, t=100, q=0, thr=1.0) + line.format(s=1, t=100, q=0, thr=1000.0)
    assert forwards(raw, alone, "v") == []  # the second arrived after the first ran: the gap is not a forward


def test_shares_are_fitted_per_part_and_robust_to_a_stalled_gap() -> None:
    # (GEMM, MHA attention, absorbed attention at 100 % of peak, measured): GEMMs at 30 %, MHA 5 %, absorbed 4 %
    rows = [(0.03, 0.0003, 0, 0.03 / 0.3 + 0.0003 / 0.05)] * 5 + [(0.03, 0.008, 0, 0.1 + 0.008 / 0.05)] * 4
    rows += [(0.03, 0, 0.05, 0.1 + 0.05 / 0.04)] * 4 + [(0.03, 0.0003, 0, 0.9)]  # one gap with a stall in it
    shares = fit_prefill_shares(rows)
    assert shares.gemm == pytest.approx(0.3, rel=0.01)
    assert shares.attention == pytest.approx(0.05, rel=0.05) and shares.absorbed == pytest.approx(0.04, rel=0.02)
    assert fit_prefill_shares([(0.03, 0.0003, 0, 0.001)]).gemm is None  # faster than peak: a gap artefact


def test_each_gpu_uses_its_own_measured_prefill_shares() -> None:
    h100, h200 = (find_calibration(gpu, DEEPSEEK_R1, "fp8") for gpu in ("H100-SXM", "H200"))
    for cal in (h100, h200):
        assert cal.prefill_points >= 40 and cal.absorbed_points >= 20
        assert 0.2 < cal.efficiency_prefill < 0.45 and cal.efficiency_absorbed < cal.efficiency_attention < 0.1
    assert h100.profile.startswith("h100") and h200.profile.startswith("h200")
    assert h100.efficiency_prefill != h200.efficiency_prefill  # each from its own GPU's forwards


def r1_server(backend: str | None):
    cfg = config_from_dict({
        "cluster": {"gpu": "H200"}, "model": {"quantization": "fp8"},
        "engine": {"kind": "sglang", "sglang": {"attention_backend": backend, "mem_fraction_static": 0.9}},
        "layout": {"mode": "aggregated", "aggregated": [{"tp": 8}]},
    })
    return cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])


def test_a_prefix_in_a_triton_batch_moves_all_its_attention_to_the_absorbed_path() -> None:
    triton, fa3 = r1_server("triton"), r1_server(None)
    fresh = triton.prefill_time_s([8192], [0])
    continued = triton.prefill_time_s([8192], [4096])
    # the same chunk on top of 4,096 cached tokens: 1.5x the pairs, but every pair at the absorbed share
    assert triton.absorbed_prefill([4096]) and not triton.absorbed_prefill([0])
    assert continued > 2 * fresh
    assert not fa3.absorbed_prefill([4096])  # FA3 runs MHA over a long prefix (chunked KV): not measured, not taxed
    assert fa3.prefill_time_s([8192], [4096]) < 1.6 * fa3.prefill_time_s([8192], [0])
