"""benchmarks/lease18_kv.py (lease 18, issue 25): the grid's predictions from the planner, the descriptor count of a GQA
request, the registered class thresholds, and the read of a committed `calibrate pd` file."""

from __future__ import annotations

from pathlib import Path

from benchmarks import lease18_kv as kv

ROOT = Path(__file__).resolve().parents[1]
V2LITE_H200X2 = ROOT / "benchmarks/results/2026-11-24-kv-transfer-h100-s5/calibration-pd-call2-h200x2.json.xz"


def test_a_gqa_request_has_a_k_and_a_v_descriptor_per_page_per_layer() -> None:
    assert kv.descriptors(1000, 6, 1) == 12_000
    assert kv.descriptors(1000, 6, 64) == 16 * 6 * 2   # 15.6 pages round up
    assert kv.descriptors(1024, 12, 64) == 16 * 12 * 2


def test_the_planner_prices_the_grid_with_the_bytes_only_so_page_size_does_not_move_it() -> None:
    res = kv.predict()
    assert res["lengths"]["n"] == 192 and 256 <= res["lengths"]["min"] and res["lengths"]["max"] < 2048
    by = {(p["gpu"], p["layers"], p["page"]): p for p in res["points"]}
    assert len(by) == len(kv.GPUS) * len(kv.LAYERS) * len(kv.PAGES)
    for gpu in kv.GPUS:
        for layers in kv.LAYERS:
            times = {by[(gpu, layers, page)]["kv_transfer_ms_p50"] for page in kv.PAGES}
            assert len(times) == 1
        assert by[(gpu, 12, 1)]["bytes_per_request_mean"] == 2 * by[(gpu, 6, 1)]["bytes_per_request_mean"]
        assert by[(gpu, 6, 1)]["kv_bytes_per_token"] == 6 * 2 * 4 * 128 * 2


def test_the_registered_thresholds() -> None:
    assert [kv.descriptor_class(x) for x in (None, 12.0, 10.0, 5.0, 1.5, 1.0)] == [
        "not measured", "per descriptor", "per descriptor", "mixed", "not by descriptors", "not by descriptors"]
    assert [kv.layer_class(x) for x in (2.0, 1.7, 1.5, 1.3, 1.0)] == [
        "per layer", "per layer", "mixed", "per request", "per request"]
    assert kv.queue_class(0.5, 2.0) == "queue serialisation"
    assert kv.queue_class(0.5, 1.2) == "mixed"   # a large share that the four workers do not shorten
    assert kv.queue_class(0.05, None) == "not queued"
    assert kv.rank_corr([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kv.rank_corr([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0


def test_read_of_lease_s5s_two_gpu_v2_lite_file(capsys) -> None:
    assert kv.read([V2LITE_H200X2], "H200") == 0
    out = capsys.readouterr().out
    assert "| 27 | 1 | base | 3 | 32888.2 | 8.3 / 12.624 | 2.532 / 6.212 |" in out
    assert "27 layers page 1: queues [1], share 0.31, base/shard 1.36" in out
    assert "-> mixed" in out and "D = None -> not measured" in out


def test_hkvs_registered_points_are_read_per_gpu() -> None:
    path = ROOT / "benchmarks/results/2026-11-27-lease18-predicted/predicted-hkv.txt"
    h100, h200 = kv.hkv_predictions(path, "H100-SXM"), kv.hkv_predictions(path, "H200")
    assert set(h100) == set(h200) == {(L, p) for L in (6, 12) for p in (1, 16, 64)}
    assert h100[(6, 1)]["ready_to_seen"]["p50"] == 9.46 and h200[(12, 64)]["ready_to_seen"]["p50"] == 11.36
