"""benchmark.kind closed_loop: the workload is config, valid for any layout, bad values refused in one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "configs" / "qwen3-pd-2026.yaml"
AGGREGATED = ["layout.mode=aggregated", "layout.prefill=[]", "layout.decode=[]",
              "layout.aggregated=[{count: 4, tp: 4}]"]


def test_the_2026_preset_carries_the_contests_workload():
    b = load_config(QWEN).benchmark
    assert b.kind == "closed_loop" and b.closed_loop
    assert (b.input_tokens, b.output_tokens, b.warmup_s, b.window_s, b.grace_s) == (4000, 200, 60, 120, 30)
    assert (b.slo.ttft_ms, b.slo.itl_ms, b.slo.min_good_fraction) == (3000, 20, 0.90)
    assert b.concurrency == sorted(b.concurrency) and min(b.concurrency) >= 1


def test_a_closed_loop_is_valid_on_an_aggregated_layout_too():
    cfg = load_config(QWEN, AGGREGATED)
    assert cfg.layout.mode == "aggregated" and cfg.benchmark.closed_loop


@pytest.mark.parametrize("override, names", [
    ("benchmark.concurrency=[]", ("benchmark.concurrency", "positive integers")),
    ("benchmark.concurrency=[8, 0]", ("benchmark.concurrency", "positive integers")),
    ("benchmark.output_tokens=1", ("benchmark.output_tokens", "greater than or equal to 2")),
    ("benchmark.window_s=0", ("benchmark.window_s", "greater than 0")),
    ("benchmark.slo.min_good_fraction=1.5", ("benchmark.slo.min_good_fraction", "less than or equal to 1")),
    ("benchmark.slo.itl_ms=-1", ("benchmark.slo.itl_ms", "greater than 0")),
    ("benchmark.slo.ttft=3000", ("benchmark.slo.ttft", "did you mean ttft_ms")),
    ("benchmark.kind=open_loop", ("benchmark.kind", "'batch' or 'closed_loop'")),
    ("benchmark.num_prompts=2000", ("benchmark.num_prompts applies to kind batch", "set benchmark.kind: batch")),
])
def test_bad_closed_loop_values_get_one_line_naming_field_and_fix(override, names):
    with pytest.raises(ConfigError) as err:
        load_config(QWEN, [override])
    lines = str(err.value).splitlines()
    assert len(lines) == 1, lines
    assert all(n in lines[0] for n in names), lines[0]


def test_closed_loop_fields_on_a_batch_config_are_refused_not_ignored():
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "default.yaml", ["benchmark.concurrency=[4]"])
    assert str(err.value).splitlines() == [
        f"{ROOT / 'configs' / 'default.yaml'}: benchmark.concurrency applies to kind closed_loop, not batch; "
        "remove it or set benchmark.kind: closed_loop"]


def test_a_dumped_closed_loop_config_loads_back_the_same():
    from orchestrator.config import config_from_dict

    cfg = load_config(QWEN, ["benchmark.concurrency=[24, 32]"])
    again = config_from_dict(cfg.model_dump(mode="json"), "dump")
    assert again.benchmark == cfg.benchmark and again.benchmark.concurrency == [24, 32]
