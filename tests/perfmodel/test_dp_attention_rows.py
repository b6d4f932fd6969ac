"""The DP-attention 2 + EP2 rows term by term (benchmarks/dp_attention_rows.py): the first-request rule of the step
loop read back from the two-GPU server logs it comes from, and the out-of-phase DP ranks it produces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.dp_attention_rows import RAW, log_lines, main, point_prefills
from orchestrator.compressed import read_text
from orchestrator.perfmodel.parallel.two_gpu_vs_model import server_model
from orchestrator.perfmodel.scheduling.limits import server_limits
from orchestrator.perfmodel.scheduling.steps import burst_prefill

ROOT = Path(__file__).resolve().parents[2]


def _dp_run() -> dict:
    return next(r for r in json.loads(read_text(RAW))["runs"] if r["variant"] == "dpattn2-ep2")


def test_every_burst_the_dp_attention_server_logged_starts_with_one_request():
    lines, run = log_lines(), _dp_run()
    points = [p for key in ("decode", "context") for p in run[key] if p["batch_size"] > 1]
    assert len(points) == 9
    for point in points:
        prefills = point_prefills(lines, point)
        assert prefills[0][1]["new-seq"] == 1, point["batch_size"]  # the server's first forward: one request
        assert sum(f["new-seq"] for _, f in prefills) >= point["batch_size"]  # every request prefilled in the point


class _Recording:
    """The DP server's cost model, recording each prefill forward's (new tokens, cached tokens) as the loop asks."""

    def __init__(self, model) -> None:
        self.model, self.chunks = model, []

    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        self.chunks.append(sorted(zip(cached_tokens or [0] * len(new_tokens), new_tokens)))
        return self.model.prefill_time_s(new_tokens, cached_tokens, chunk_follows)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.model.decode_step_s(batch_size, context_tokens)

    def prefill_launch_s(self, requests: int) -> float:
        return self.model.prefill_launch_s(requests)


def test_a_burst_of_long_prompts_puts_the_dp_ranks_one_chunk_out_of_phase_as_the_log_shows():
    model = server_model(_dp_run(), "H200", 6)
    cost = _Recording(model)
    forwards = burst_prefill(server_limits(model), cost, [8192] * 16)
    assert cost.chunks[0] == [(0, 4096)]  # the first request alone, one rank's chunk
    # then in every forward one rank continues its prompt while the other starts the next
    assert all(chunks == [(0, 4096), (4096, 4096)] for chunks in cost.chunks[1:-1])
    assert cost.chunks[-1] == [(4096, 4096)] and len(forwards) == 17  # the log: 16 prefill results per rank
    measured_s = 10.0398 - 99 * 7.199e-3  # the point's client wall less its decode steps (calibration-twogpu-b.json.xz)
    assert sum(f.duration_s for f in forwards) == pytest.approx(measured_s, rel=0.05)  # not fitted: 9.22 vs 9.33 s


def test_the_script_prints_each_rows_terms(capsys):
    assert main() == 0
    out = capsys.readouterr().out
    for row in ("decode-128x256", "decode-512x256", "long-16x8192"):
        assert f"h200x2-r1s6-dpattn2-ep2-{row}: wall measured" in out
    assert "stalls (> 3x the median) [672, 674] ms" in out and "from then on 68.9 ms" in out
