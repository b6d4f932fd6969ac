"""rules apac-hpcai-2026: PD required, all 16 GPUs, the FP8 Qwen3 checkpoint, KV >= FP8, the fixed closed loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.rules import RulesError, check_config, load_profile

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "configs" / "qwen3-pd-2026.yaml"
RULES = load_profile("apac-hpcai-2026")


def _fields(*overrides: str) -> set[str]:
    return {v.field for v in check_config(load_config(QWEN, list(overrides)), RULES).violations}


@pytest.mark.parametrize("preset", ["qwen3-pd-2026.yaml", "qwen3-pd-2026-h200.yaml", "qwen3-pd-2026-search.yaml"])
def test_the_2026_presets_comply(preset):
    cfg = load_config(ROOT / "configs" / preset)
    assert cfg.rules == "apac-hpcai-2026" and check_config(cfg, RULES).compliant, check_config(cfg, RULES).summary()
    assert _fields("cluster.gpu=H200") == set()


@pytest.mark.parametrize("overrides, field, words", [
    (["layout.mode=aggregated", "layout.prefill=[]", "layout.decode=[]",
      "layout.aggregated=[{tp: 8, node_role: prefill}, {tp: 8, node_role: decode}]"],
     "layout.mode", "colocated (aggregated) serving is prohibited"),
    (["layout.decode.0.count=1"], "layout", "uses all 16 GPUs"),
    (["engine.sglang.kv_cache_dtype=fp4_e2m1"], "engine.sglang.kv_cache_dtype", "fp8_e4m3"),
    (["model.quantization=w4a8"], "model.quantization", "further quantization"),
    (["benchmark.slo.itl_ms=40"], "benchmark.slo.itl_ms", "set benchmark.slo.itl_ms: 20"),
    (["benchmark.input_tokens=1000"], "benchmark.input_tokens", "set benchmark.input_tokens: 4000"),
    (["benchmark.slo.min_good_fraction=0.5"], "benchmark.slo.min_good_fraction", "0.9"),
    (["cluster.gpu=cpu-fast"], "cluster.gpu", "H100-SXM or H200"),
    (["layout.decode.0.extra_args=['--quantization', 'w8a8_fp8']"], "layout.decode.0.extra_args", "no further"),
])
def test_each_rule_names_its_field_and_the_fix(overrides, field, words):
    verdict = check_config(load_config(QWEN, overrides), RULES)
    (v,) = [v for v in verdict.violations if v.field == field]
    assert words in v.line(), v.line()
    assert verdict.summary().startswith("rules apac-hpcai-2026: NOT COMPLIANT")


def test_fp8_kv_is_allowed_and_a_batch_workload_is_not():
    assert _fields("engine.sglang.kv_cache_dtype=fp8_e4m3") == set()
    batch = load_config(ROOT / "configs" / "default.yaml")
    fields = {v.field for v in check_config(batch, RULES).violations}
    assert {"benchmark.kind", "model.preset"} <= fields


def test_a_bad_rule_value_is_one_line(tmp_path):
    data = yaml.safe_load((ROOT / "orchestrator/rules/profiles/apac-hpcai-2026.yaml").read_text())
    data["name"] = "bad"
    data["layout"] = {"require_pd": "sometimes"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RulesError) as err:
        load_profile(str(path))
    assert len(str(err.value).splitlines()) == 1 and "layout.require_pd" in str(err.value)
