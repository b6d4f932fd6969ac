"""Lease 14's predict/read (benchmarks/lease14_tp4_step.py) on raw files made from the model itself: the model's own steps
read back as in the bound with F(94) = the split's 9.273 ms; the same steps less 5 ms a step read as a fixed part lower
than the split, with both growths as modelled (the registered class (b)); prefill prompts cut as chunked prefill cuts."""

from __future__ import annotations

import json

from benchmarks import lease14_tp4_step as lease14


def _raw(tmp_path, less_ms: float) -> str:
    model = lease14.probe_model()
    rows = [{"batch_size": b, "running_batch": b, "context_tokens": c, "kv_tokens_median": kv, "cuda_graph": True,
             "step_ms_median": model.decode_step_s(b, kv) * 1e3 - less_ms, "repeat": rep}
            for b, c, kv in lease14.points() for rep in (0, 1)]
    raw = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "model": {"config": {"num_hidden_layers": 94}},
           "runs": [{"decode": rows, "prefill": [{"input_tokens": 4000, "concurrency": 1, "latency_s_median": 0.2}]}]}
    path = tmp_path / f"raw-{less_ms}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_the_models_own_steps_read_back_inside_the_bound_and_as_modelled(tmp_path, capsys) -> None:
    assert lease14.main(["read", _raw(tmp_path, 0.0)]) == 0
    out = capsys.readouterr().out
    assert "inside the +-15% tok/s bound: 36 of 36" in out
    assert "F(94) measured (median over 36 graphed rows of measured - the model's non-fixed part): 9.273 ms" in out
    assert "fixed: as modelled" in out and "batch growth (routed experts): measured / model 1.00 (as modelled" in out
    assert "1 x 4000: measured 200.0 ms, model 183.5 ms (-8.2%)" in out


def test_a_batch_flat_offset_reads_as_a_lower_fixed_part_with_the_growths_as_modelled(tmp_path, capsys) -> None:
    assert lease14.main(["read", _raw(tmp_path, 5.0)]) == 0
    out = capsys.readouterr().out
    assert "F(94) measured" in out and ": 4.273 ms" in out
    assert "fixed: LOWER than the split carried to 94 layers (4.27 vs 9.27 ms)" in out
    assert "context growth (KV read): measured / model 1.00 (as modelled" in out
    assert "inside the +-15% tok/s bound: 36 of 36" not in out


def test_prompts_are_cut_into_chunks_and_resume_on_their_cached_part() -> None:
    assert lease14.prefill_chunks(1, 4000, 8192) == [([4000], [0])]
    assert lease14.prefill_chunks(4, 4000, 8192) == [([4000, 4000, 192], [0, 0, 0]), ([3808, 4000], [192, 0])]
