"""Layout search: what it enumerates, how it ranks, and that the configs it writes load and run."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import config_from_dict, load_config
from orchestrator.plan.search import (
    PP_NOT_WRITABLE,
    PlanError,
    enumerate_layouts,
    search_layouts,
    write_top_configs,
)
from orchestrator.plan.simulate import simulate_run, synthetic_batch

ROOT = Path(__file__).resolve().parents[1]
BATCH = synthetic_batch(200, seed=5)


def test_two_nodes_of_eight_enumerate_pd_splits_aggregated_spans_dp_attention_and_pp() -> None:
    labels = [label for label, _ in enumerate_layouts(load_config(ROOT / "configs/default.yaml"))]
    for expected in (
        "pd 1PxTP8 / 1DxTP8", "pd 2PxTP4 / 1DxTP8", "pd 1PxTP8 / 1DxTP8DP8-attn",
        "agg 2AxTP8", "agg 1AxTP16", "agg 1AxTP16DP16-attn", "agg 1AxTP8xPP2",
    ):
        assert expected in labels
    assert len(labels) == len(set(labels))


def test_every_enumerated_layout_is_a_valid_config() -> None:
    cfg = load_config(ROOT / "configs/default.yaml")
    for label, layout in enumerate_layouts(cfg):
        data = cfg.model_dump(mode="json")
        data["layout"] = layout
        config_from_dict(data, label)


def test_search_drops_layouts_that_do_not_fit_and_ranks_the_rest_by_throughput() -> None:
    ranked = search_layouts(load_config(ROOT / "configs/default.yaml"), BATCH)
    fitting = [c for c in ranked if c.budget is not None]
    assert fitting and all(c.memory.fits for c in fitting)
    assert ranked[: len(fitting)] == fitting  # non-fitting sink to the bottom, unsimulated
    throughputs = [c.throughput for c in fitting]
    assert throughputs == sorted(throughputs, reverse=True)
    by_label = {c.label: c for c in ranked}
    assert by_label["pd 2PxTP4 / 1DxTP8"].budget is None  # W4A8 R1 at TP4 is ~92 GB/GPU on H100
    assert by_label["agg 1AxTP8xPP2"].note == PP_NOT_WRITABLE


def test_written_configs_load_keep_the_users_settings_and_reproduce_the_ranking(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs/h200-1p1d-tp8.yaml")
    ranked = search_layouts(cfg, BATCH)
    paths = write_top_configs(cfg, ranked, top=3, write_dir=tmp_path, gpu="H200")
    assert len(paths) == 3
    writable = [c for c in ranked if c.budget is not None and c.writable][:3]
    for path, candidate in zip(paths, writable):
        written = load_config(path)
        assert path.read_text().startswith("# Written by `pd-orchestrator plan --search`")
        assert written.engine.kind == "sglang" and written.cluster.gpu == "H200"
        assert written.transfer.ucx.tls == cfg.transfer.ucx.tls
        assert written.layout.model_dump(mode="json") == config_from_dict(
            {**cfg.model_dump(mode="json"), "layout": candidate.layout}).layout.model_dump(mode="json")
        assert simulate_run(written, BATCH).output_throughput == pytest.approx(candidate.throughput)


def test_more_than_two_nodes_is_a_clear_error() -> None:
    cfg = config_from_dict({"cluster": {"num_nodes": 3}, "layout": {"prefill": [{"tp": 8}], "decode": [{"tp": 8}]}})
    with pytest.raises(PlanError, match="cluster.num_nodes=3"):
        enumerate_layouts(cfg)


def test_one_node_splits_its_gpus_between_prefill_and_decode() -> None:
    cfg = config_from_dict({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "H200"},
        "model": {"preset": "DeepSeek-V2-Lite", "quantization": "bf16"},
        "layout": {"prefill": [{"tp": 1}], "decode": [{"tp": 1}]},
    })
    ranked = search_layouts(cfg, BATCH)
    labels = {c.label for c in ranked if c.budget is not None}
    assert "pd 1PxTP1 / 1DxTP1" in labels and "agg 2AxTP1" in labels
