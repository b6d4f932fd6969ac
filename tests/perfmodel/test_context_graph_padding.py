"""The MLA decode context cost with and without graph padding, from the raw one-H100 A/B (issue 25, hctx):
what docs/fidelity.md says the call decided, read back from the raw files through SGLang's split heuristic."""

from __future__ import annotations

from benchmarks.dp_attention_vs_tp2 import CONTEXT_RUNS, _run, kv_grid

LAYERS = 6


def _per_tile_ns(label: str) -> list[float]:
    """ns per extra 32-token tile and layer between consecutive context points of one run."""
    _, path, variant, sms, heads, requests = next(r for r in CONTEXT_RUNS if r[0] == label)
    run = _run(path, variant)
    graph = min(b for b in run["derived"]["cuda_graph_decode_bs"] if b >= requests)
    points = [(row["step_ms_median"], kv_grid([row["context_tokens"] + 50] * requests + [1] * (graph - requests),
                                              heads, sms)[1]) for row in run["context"]]
    return [(b[0] - a[0]) / LAYERS * 1e6 / (b[1] - a[1]) for a, b in zip(points, points[1:])]


def test_a_padded_graph_splits_every_request_to_the_cap() -> None:
    # 16 requests of 8,242 tokens in the graph of 32: the 16 rows of length 1 set the split count to the cap (64 with
    # --triton-attention-split-tile-size 256): chunks of 129 tokens, rounded up to 5 tiles, leave 52 non-empty
    # splits per request; in a graph of 16 the SM-count heuristic gives 8 splits of 33 tiles
    assert kv_grid([8242] * 16 + [1] * 16, 128, 132) == (16 * 8 * 52 + 16 * 8, 16 * 8 * 52 * 5 + 16 * 8)
    assert kv_grid([8242] * 16, 128, 132) == (16 * 8 * 8, 16 * 8 * 8 * 33)


def test_on_one_h100_padding_lowers_the_cost_per_tile_to_the_one_gpu_h200_level() -> None:
    captured = _per_tile_ns("H100 TP1, 16 captured (hctx)")
    padded = _per_tile_ns("H100 TP1, 16 not captured (hctx)")
    h200_padded = _per_tile_ns("H200 TP1 (one-GPU machine)")[:2]
    assert padded[1] < 0.6 * captured[1]                  # 8,192: 15.5 vs 27.5 ns
    assert abs(padded[1] - h200_padded[1]) < 0.1 * padded[1]  # the same as the padded H200 (15.5 ns)
    # the captured run repeats the 2026-11-24 H100 calibration (another host) within 5 %
    for ours, earlier in zip(captured, _per_tile_ns("H100 TP1 (one-GPU machine)")):
        assert abs(ours - earlier) < 0.05 * earlier


def test_padding_does_not_explain_the_two_gpu_machines_cost() -> None:
    captured = _per_tile_ns("H100 TP1, 16 captured (hctx)")
    for label in ("H200 TP2 (two-GPU machine)", "H200 DP-attn 2 rank (two-GPU machine)"):
        two_gpu = _per_tile_ns(label)[-1]   # 2,048 -> 8,192, unpadded there too (graphs of 16 / 8)
        assert two_gpu > 1.5 * captured[-1]  # 45.8 / 46.7 vs 27.5 ns


def test_on_one_gpu_of_a_two_gpu_host_tp1_costs_what_it_costs_on_a_one_gpu_host() -> None:
    # lease 3 (hgpu): the same plan on GPU 0 of a two-H100 machine gives the one-H100 machine's cost per tile,
    # captured and padded alike, so a two-GPU host by itself does not make the 46-48 ns of the TP 2 / DP ranks
    for two_gpu_host, one_gpu_host in (("H100 TP1, two-GPU host, 16 captured", "H100 TP1, 16 captured (hctx)"),
                                       ("H100 TP1, two-GPU host, 16 padded", "H100 TP1, 16 not captured (hctx)")):
        for ours, theirs in zip(_per_tile_ns(two_gpu_host), _per_tile_ns(one_gpu_host)):
            assert abs(ours - theirs) < 0.05 * theirs
    assert _per_tile_ns("H200 TP2 (two-GPU machine)")[-1] > 1.5 * _per_tile_ns("H100 TP1, two-GPU host, 16 captured")[-1]


def test_the_46_48_ns_per_tile_come_with_the_tp2_grid_not_the_h200_hosts() -> None:
    # lease 4 (hgpu3): graphed TP 2 and TP 1 context on ONE two-H100 host, the same graph list
    tp2 = _per_tile_ns("H100 TP2, two-GPU host, 16 captured (l4)")
    tp1 = _per_tile_ns("H100 TP1, two-GPU host, 16 captured (l4)")
    for ours, h200 in zip(tp2, _per_tile_ns("H200 TP2 (two-GPU machine)")):
        assert abs(ours - h200) < 0.1 * h200      # 49.5 / 45.6 ns on H100s, 47.9 / 45.8 on the H200 pair
    for with_tp2, with_tp1 in zip(tp2, tp1):
        assert with_tp2 > 1.5 * with_tp1           # TP 1 on the same host: 28.9 / 27.4, the one-GPU H100's
