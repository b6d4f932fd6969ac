"""Benchmarks' own logic: SGLang's MLA descriptor layout, run coalescing, a real NIXL transfer, ordering limits,
the py-spy summary behind the router profiles, the planning examples' command lines, and repository paths read from
any directory."""

from __future__ import annotations

import importlib.util
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from benchmarks import kv_transfer, ordering, pyspy_summary
from orchestrator.compressed import read_text
from orchestrator.config import load_config
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.simulation.simulate import synthetic_batch
from orchestrator.workload.batch import order_lengths
from tests.support import HAVE_NIXL

ROOT = Path(__file__).resolve().parents[1]


def test_mla_layout_is_one_descriptor_per_page_per_layer():
    lay = kv_transfer.make_layout(layers=3, tokens=64, page_size=16, run_pages=2, seed=1)
    rows = kv_transfer.descriptors(lay, base=1000, pages=lay.dst_pages, device_id=1)
    assert len(rows) == 3 * 4
    page_bytes = 16 * 576 * 2
    assert (rows[:, 1] == page_bytes).all() and (rows[:, 2] == 1).all()
    # layer-major: layer 2, page i sits at base + 2 * layer_bytes + dst_page[i] * page_bytes
    assert rows[2 * 4 + 1, 0] == 1000 + 2 * lay.layer_bytes + int(lay.dst_pages[1]) * page_bytes
    assert len(set(lay.dst_pages.tolist())) == len(lay.dst_pages), "target pages must not collide"


def test_coalescing_merges_only_runs_contiguous_on_both_sides():
    lay = kv_transfer.make_layout(layers=2, tokens=32, page_size=1, run_pages=4, seed=3)
    src = kv_transfer.descriptors(lay, 0, lay.src_pages, 0)
    dst = kv_transfer.descriptors(lay, 10**9, lay.dst_pages, 0)
    cs, cd = kv_transfer.coalesce(src, dst)
    assert cs[:, 1].sum() == src[:, 1].sum() == cd[:, 1].sum()
    assert len(cs) <= 2 * 8 and len(cs) < len(src)  # at most one descriptor per 4-page run per layer
    # every original (src, dst) pair is still covered at the same relative offset
    for (sa, _, _), (da, _, _) in zip(src, dst):
        i = np.searchsorted(cs[:, 0], sa, side="right") - 1
        assert cs[i, 0] <= sa < cs[i, 0] + cs[i, 1]
        assert cd[i, 0] + (sa - cs[i, 0]) == da


@pytest.mark.skipif(not (HAVE_NIXL and importlib.util.find_spec("torch")), reason="needs torch and NIXL (nixl-cu12)")
def test_nixl_transfer_lands_every_page_where_the_layout_says(monkeypatch):
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    layouts = [kv_transfer.make_layout(layers=2, tokens=32, page_size=p, run_pages=2, seed=5) for p in (1, 16)]
    rows = kv_transfer.run_knob("default", "cpu", layouts, iters=1)  # raises if any checked byte is wrong
    assert {(r["page_bytes"], r["mode"]) for r in rows} == {
        (p * 1152, m) for p in (1, 16) for m in ("prepped", "per-page", "coalesced")}
    assert all(r["s"] > 0 and r["bytes"] == 2 * 32 * 1152 for r in rows)


def test_orderings_and_kv_derived_limits():
    batch = synthetic_batch(200, seed=7)
    longest = order_lengths(batch, "longest-first")
    assert [p + o for p, o in longest] == sorted((p + o for p, o in batch), reverse=True)
    assert sorted(order_lengths(batch, "interleave")) == sorted(batch)
    cfg = load_config(ROOT / "configs" / "default.yaml", [])
    limits = ordering.limits(cfg, batch, ["kv/4", "kv/2", "kv"])
    assert 1 <= limits["kv/4"] <= limits["kv/2"] <= limits["kv"]
    # `kv` requests of the batch's mean size fit in the decode servers' KV as the memory check sizes it, one more does not
    mean = sum(p + o for p, o in batch) / len(batch)
    decode_kv = sum(g.kv_capacity_tokens * cfg.layout.decode[g.index].count
                    for g in check_layout_fits(cfg).groups if g.role == "decode")
    assert limits["kv"] * mean <= decode_kv < (limits["kv"] + 1) * mean
    with pytest.raises(SystemExit, match="kv/3.*choose from"):
        ordering.limits(cfg, batch, ["kv/3"])


RESULTS = ROOT / "benchmarks" / "results"


def test_the_pyspy_summary_reproduces_every_committed_summary_from_its_raw_profile():
    # the committed ones are xz-compressed (2.6 MB raw, carried by every device call); a plain *.raw is read as well
    raws = sorted([*RESULTS.rglob("*.raw"), *RESULTS.rglob("*.raw.xz")])
    assert len(raws) >= 5  # the router profiles of 2026-11-24
    for raw in raws:
        summary = raw.with_name(raw.name.removesuffix(".xz").removesuffix(".raw") + ".summary.txt")
        with (lzma.open if raw.suffix == ".xz" else open)(raw, "rt") as profile:
            assert pyspy_summary.summarise(profile) == summary.read_text(), summary.relative_to(ROOT)


def test_the_kv_table_reproduces_its_committed_table_from_the_compressed_calibration_runs():
    import subprocess
    import sys

    folder = RESULTS / "2026-11-26-sglang-one-h100"
    runs = [folder / "calibration-pd-early-call1.json.xz", folder / "calibration-pd-nooverlap-call2.json.xz"]
    done = subprocess.run([sys.executable, str(ROOT / "scripts/device/kv_table.py"), *map(str, runs)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == (folder / "kv-table-calls1-2.md").read_text()  # rows named as written: X.json


def test_the_pyspy_summary_counts_a_function_once_per_stack_and_self_time_at_the_innermost_frame():
    text = pyspy_summary.summarise(["main (a.py:1);f (b.py:3);f (b.py:7) 3", "main (a.py:1);g (c.py:2) 1", ""])
    lines = text.splitlines()
    assert lines[0] == "total samples 4"
    assert lines[lines.index("--- self top 30") + 1] == " 75.0% f (b.py:7)"
    inclusive = lines[lines.index("--- inclusive top 60") + 1:]
    assert inclusive == ["100.0% main (a.py", " 75.0% f (b.py", " 25.0% g (c.py"]


PLANNING_EXAMPLES = RESULTS / "2026-11-26-planning-examples"


def _planning_runs() -> dict[str, list[str]]:
    """`run NAME ARGS...` lines of benchmarks/planning_examples.sh: {NAME: pd-orchestrator ARGS}."""
    import shlex

    script = (ROOT / "benchmarks" / "planning_examples.sh").read_text()
    return {words[1]: words[2:] for words in (shlex.split(line) for line in script.splitlines()
                                              if line.startswith("run "))}


def test_the_planning_examples_script_is_what_made_the_examples_folder():
    import subprocess

    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "planning_examples.sh")]).returncode == 0
    runs = _planning_runs()
    assert set(runs) == {p.stem for p in PLANNING_EXAMPLES.glob("*.txt")}
    for name, args in runs.items():
        first = (PLANNING_EXAMPLES / f"{name}.txt").read_text().splitlines()[0]
        assert first == "$ pd-orchestrator " + " ".join(args), name


def test_the_planning_examples_do_not_name_the_checkout_that_recorded_them():
    import re

    for path in sorted(PLANNING_EXAMPLES.glob("*.txt")):
        text = path.read_text()
        assert not re.search(r"/\S*/\.venv/", text), f"{path.name}: an absolute venv path (planning_examples.sh cuts it)"
        assert str(ROOT) not in text, path.name


def test_every_planning_example_command_parses_and_names_configs_that_exist():
    from orchestrator.cli import build_parser

    parser = build_parser()
    for name, args in _planning_runs().items():
        parsed = parser.parse_args(args)
        configs = [parsed.config] if getattr(parsed, "config", None) else list(getattr(parsed, "configs", []))
        assert configs and all((ROOT / c).is_file() for c in configs), (name, configs)


def test_a_pending_row_is_predicted_as_the_back_test_will_predict_it_once_measured(tmp_path, capsys) -> None:
    # benchmarks/pending_rows.py records a prediction before the run; it must be the number the back-test prints
    # for the same row once the measurement is added (same config, overrides, batch and path)
    import yaml

    from benchmarks import pending_rows
    from orchestrator.plan.backtest.dataset import DATASET, load_dataset
    from orchestrator.plan.backtest.predict import predict_row

    data = load_dataset()
    row = next(r for r in data["runs"] if r["id"] == "h200x2-r1s6-tp2-eager-decode-8x256")
    pending = {k: v for k, v in row.items() if k != "measured"}
    path = tmp_path / "pending.yaml"
    path.write_text(yaml.safe_dump({"rows": [pending, {**pending, "id": "tp1", "set": pending["set"][:-1]}],
                                    "derived": [{"id": "tp2/tp1", "numerator": row["id"], "denominator": "tp1"}]}))
    assert pending_rows.main([str(path), "--json", str(tmp_path / "p.json")]) == 0
    out = json.loads((tmp_path / "p.json").read_text())
    expected = predict_row(row, data["batches"], DATASET.parent).predicted
    assert out["rows"][row["id"]]["total_tok_s"] == pytest.approx(expected, abs=0.1)
    assert out["rows"]["tp1"]["total_tok_s"] != out["rows"][row["id"]]["total_tok_s"]   # tp=2 dropped: another server
    assert out["derived"]["tp2/tp1"] == pytest.approx(out["rows"][row["id"]]["total_tok_s"] / out["rows"]["tp1"]["total_tok_s"], rel=1e-3)
    # a ShareGPT-batch row the back-test would refuse (no `ordering`: the order its client sends) is refused here too
    sharegpt = next(r for r in data["runs"] if r["id"] == "h200x2-v2lite-pd-product-warm")
    path.write_text(yaml.safe_dump({"rows": [{k: v for k, v in sharegpt.items() if k not in ("measured", "ordering")}]}))
    assert pending_rows.main([str(path)]) == 2
    assert "ordering must be one of arrival, longest-first, interleave" in capsys.readouterr().err


def test_a_benchmark_reads_the_repositorys_config_and_its_model_folder_from_any_directory(tmp_path, monkeypatch) -> None:
    # configs/device-h200x2-qwen3-serve.yaml names its model by folder (models/qwen3-235b-a22b-fp8-l6), not a preset
    from benchmarks import eager_inrun_predict, qwen3_decode_terms, qwen3_routing_read

    monkeypatch.chdir(tmp_path)
    # eager_inrun_predict: the V2-Lite configs and models/deepseek-v2-lite, named from the repository root
    lone = eager_inrun_predict.server_model(eager_inrun_predict.AGG, "aggregated", ["layout.aggregated.0.tp=1"], "H100-SXM")
    assert lone.tp == 1 and eager_inrun_predict.step_row(lone, 600, 362.0)["step_ms"] > 0
    per_expert, top_k, experts, moe_layers = qwen3_routing_read.expert_bytes_per_layer(
        "configs/device-h200x2-qwen3-serve.yaml", "H200")
    assert (top_k, experts, moe_layers) == (8, 128, 6) and per_expert > 0
    _, config, gpu = qwen3_decode_terms.LONE  # benchmarks/backtest/configs/qwen3-l6-lone.yaml: the same model folder
    assert qwen3_decode_terms.model_terms(config, gpu, 64, 1024)["step"] > 0


def test_the_pd_terms_read_a_rows_logs_and_the_planners_own_trace_of_it() -> None:
    # benchmarks/pd_decode_terms.py: lease 3's PD pair (decode mem 0.65 on H100). The log's pool and queues are read
    # from the committed archive; the planner's trace is the back-test's run (the observer changes nothing)
    from benchmarks import pd_decode_terms as terms
    from orchestrator.plan.backtest.dataset import DATASET, load_dataset
    from orchestrator.plan.backtest.predict import predict_row

    data = load_dataset()
    row = next(r for r in data["runs"] if r["id"] == "h100x2-v2lite-pd-product-mem065-lease3")
    measured, trace = terms.read_measured(row), terms.model_trace(row, data["batches"])
    assert measured.kv_pool_tokens == 743_459 and measured.duration_s == pytest.approx(row["measured"]["duration_s"], abs=0.01)
    assert abs(trace.kv_pool_tokens / measured.kv_pool_tokens - 1) < 0.02  # MemoryTerms' pool, not fitted to this log
    assert max(r["prealloc"] for r in measured.decode) == 201 and max(s[4] for s in trace.decode) > 0
    assert max(r["retracted"] for r in measured.decode) == 0 and trace.retracted == 0
    predicted = predict_row(row, data["batches"], DATASET.parent)
    assert (row["measured"]["input_tokens"] + row["measured"]["output_tokens"]) / trace.duration_s == pytest.approx(
        predicted.predicted, rel=1e-9)
    steps = terms.intervals(measured, terms.decode_model(row))
    graphed = [r for r in steps if r["graph"]]
    assert len(graphed) >= 10 and any(not r["graph"] for r in steps)
    # the model's graphed decode steps at the log's own batches and KV tokens: within 10 % of the log's in sum
    assert sum(r["model_ms"] for r in graphed) == pytest.approx(sum(r["measured_ms"] for r in graphed), rel=0.10)


def test_qwen3_decode_terms_splits_every_lone_grid_step_into_parts_that_add_up(capsys):
    """benchmarks/qwen3_decode_terms.py's lone-H100 table: one row per measured grid point, each the planner's step
    split into reads and floors that sum to it (the script asserts the sum), experts at the measured stream share."""
    from benchmarks import qwen3_decode_terms
    from orchestrator.perfmodel.calibration_lookup import expert_stream_share
    from orchestrator.perfmodel.profile import shipped_profiles

    qwen3_decode_terms.lone_grid()
    out = capsys.readouterr().out
    raw = json.loads(read_text(ROOT / qwen3_decode_terms.LONE[0]))["runs"][0]["decode"]
    rows = [line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert len(rows) == len(raw) == 24
    assert f"routed experts read at {expert_stream_share('H100-SXM', shipped_profiles()):.3f}" in out


def test_tp16_caps_terms_split_every_forward_of_a_row_into_terms_that_add_up_to_the_planners_run():
    """benchmarks/tp16_caps_terms.py on the published batch-caps row: the prefill and decode phases (every forward the
    planner ran, each split into reads, collectives, fixed costs and a rest) add up to the planner's run, and no term
    it names is larger than the forward it is part of (the rest is never negative)."""
    import re

    from benchmarks import tp16_caps_terms
    from orchestrator.plan.backtest.dataset import load_dataset

    data = load_dataset()
    row = next(r for r in data["runs"] if r["id"] == "h100x16-r1-tp16-batch-caps-1024")
    lines = tp16_caps_terms.row_report(row, data["batches"])
    model_s = float(re.search(r"model ([\d.]+) s", lines[0]).group(1))
    phases = {m.group(1): float(m.group(2)) for line in lines if (m := re.match(r"\s+(prefill|decode)\s+([\d.]+) s =", line))}
    assert set(phases) == {"prefill", "decode"} and sum(phases.values()) == pytest.approx(model_s, abs=0.1)
    rests = [float(x) for line in lines for x in re.findall(r"compute / roofline rest ([-\d.]+)", line)]
    assert len(rests) == 2 and min(rests) >= -0.005
    assert any("KV pool 325,496 tokens" in line and "graphs to 1024" in line for line in lines)
