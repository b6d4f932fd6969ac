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


def _raw_of(tmp_path, backend: str, fusion_off: bool = True, name: str = "raw") -> str:
    """A raw file of the model's own steps for a server of `backend`, recorded as calibrate single records it."""
    model = lease14.probe_model(backend=backend)
    rows = [{"batch_size": b, "running_batch": b, "context_tokens": c, "kv_tokens_median": kv, "cuda_graph": True,
             "step_ms_median": model.decode_step_s(b, kv) * 1e3, "repeat": rep}
            for b, c, kv in lease14.points() for rep in (0, 1)]
    flags = ["--tp-size", "4", "--attention-backend", backend]
    flags += ["--enforce-disable-flashinfer-allreduce-fusion"] if fusion_off else []
    raw = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "model": {"config": {"num_hidden_layers": 94}},
           "runs": [{"flags": flags, "derived": {"attention_backend": backend}, "decode": rows}]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_fa3_and_triton_of_one_host_are_read_side_by_side_and_the_triton_context_growth_is_gone(tmp_path, capsys) -> None:
    fa3, triton = _raw_of(tmp_path, "fa3", name="fa3"), _raw_of(tmp_path, "triton", name="triton")
    assert lease14.main(["read", fa3, triton]) == 0
    out = capsys.readouterr().out
    assert "attention fa3, FlashInfer all-reduce fusion off" in out and "attention triton" in out
    assert "A/B on H100-SXM, 94 layers: Triton - FA3" in out
    assert "outcome (FA3 vs Triton): FA3 REMOVES THE TRITON CONTEXT GROWTH (as modelled)" in out
    assert "FA3 batch growth 1 -> 64 at 4096: measured / model 1.00 (as modelled)" in out


def test_a_server_with_the_fusion_on_is_compared_with_the_same_backend_with_it_off(tmp_path, capsys) -> None:
    off, on = _raw_of(tmp_path, "fa3", name="off"), _raw_of(tmp_path, "fa3", fusion_off=False, name="on")
    assert lease14.main(["read", off, on]) == 0
    out = capsys.readouterr().out
    assert "A/B on H100-SXM, 94 layers: fusion ON - fusion off" in out
    assert "outcome (fusion): the fusion saves a median 0.00 of the model's all-reduce term (nothing changes)" in out


def test_fa3_predictions_price_the_probe_as_the_planners_own_fa3_decode_worker() -> None:
    result = lease14.predict(backend="fa3")
    assert result["server"]["attention_backend"] == "fa3"
    for p in result["points"]:
        assert p["attention_wait"] == 0.0 and abs(p["step"] - p["preset_decode_ms"]) < 1e-3


LEASE17_PLAN = lease14.ROOT / "benchmarks/calibration/plans/lease17-qwen3-tp2-ep2-fa3.json"


def _tp2_raw(tmp_path, layers: int, extra_ms: float) -> str:
    """Lease 17's server (TP 2 x EP 2, 32 / 2 heads, FA3) at `layers` layers: the model's own steps plus `extra_ms`."""
    model = lease14.probe_model("H200", layers, "fa3", tp=2, heads=(32, 2))
    rows = [{"batch_size": b, "running_batch": b, "context_tokens": c, "kv_tokens_median": kv, "cuda_graph": True,
             "step_ms_median": model.decode_step_s(b, kv) * 1e3 + extra_ms, "repeat": rep}
            for b, c, kv in lease14.points(LEASE17_PLAN) for rep in (0, 1)]
    flags = ["--tp-size", "2", "--attention-backend", "fa3", "--enforce-disable-flashinfer-allreduce-fusion"]
    raw = {"gpu": {"name": "NVIDIA H200"},
           "model": {"config": {"num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 2}},
           "runs": [{"flags": flags, "derived": {"attention_backend": "fa3", "tp_size": 2}, "decode": rows}]}
    path = tmp_path / f"q3l{layers}-{extra_ms}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_a_gap_that_halves_with_the_layers_reads_per_layer_and_one_that_stays_reads_per_step(tmp_path, capsys) -> None:
    assert lease14.main(["read", _tp2_raw(tmp_path, 20, 0.65), _tp2_raw(tmp_path, 40, 1.3)]) == 0
    out = capsys.readouterr().out
    assert "split over [20, 40] layers at TP 2 x EP 2 on H200" in out
    assert "gap all rows: F - the model's fixed part +0.650 ms at 20 layers, +1.300 ms at 40" in out
    assert "gap(20) / gap(40) = 0.50: (a) PER LAYER" in out
    assert lease14.main(["read", _tp2_raw(tmp_path, 20, 1.3), _tp2_raw(tmp_path, 40, 1.3)]) == 0
    assert "gap(20) / gap(40) = 1.00: (b) PER STEP" in capsys.readouterr().out
    assert lease14.main(["read", _tp2_raw(tmp_path, 20, 0.0), _tp2_raw(tmp_path, 40, 0.0)]) == 0
    assert "no gap to split at 40 layers" in capsys.readouterr().out
