"""Lease 11's read (benchmarks/lease11_read.py) on the committed one-H100 Qwen3 serve run (2026-11-26, calls 8 and 9),
laid out as a lease-11 folder: the rows it gives are the ones closed_loop.yaml holds for that run, and the transfer
line's figures are hwaves' part 6 (docs/fidelity.md, "What keeps closed-loop clients in waves")."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks import lease11_read

ONE_H100 = Path(__file__).resolve().parents[1] / "benchmarks/results/2026-11-26-qwen3-serve-one-h100"


def test_rows_and_the_transfer_line_read_a_serve_and_a_prepare_archive(tmp_path, capsys) -> None:
    shutil.copy(ONE_H100 / "serve-call9.tar.xz", tmp_path / "serve.tar.xz")
    shutil.copy(ONE_H100 / "prepare-call8.tar.xz", tmp_path / "prepare.tar.xz")
    rows = lease11_read.rows(tmp_path)
    assert rows[4] == {"output_tok_s": 1140.83, "good_fraction": 1.0, "ttft_p50_ms": 131.58, "itl_p50_ms": 2.714,
                       "ready_s": 104.6, "ready_cold_s": 188.0}
    assert rows[16]["ttft_p50_ms"] == 769.94
    lease11_read.transfer_line(tmp_path, [4, 16])
    out = capsys.readouterr().out
    assert "queue p50 1.0 ms, NIXL p50 13.4 ms" in out and "the line does not queue a wave" in out
    assert "queue p50 391.5 ms, NIXL p50 42.8 ms; CV KV enqueued -> landed 0.42 -> 0.65 (+0.23)" in out
    assert "the line queues and re-forms the wave" in out
    assert lease11_read.layers(tmp_path) == 1  # no layers.tar: said, not an error trace
