"""The Qwen3-shaped probe's one device call (issue 25) without a GPU: scripts/device/qwen3_probe.sh's settings checks,
`--help` and `--dry-run`, its decode-grid plan, and the grid rows `calibrate single` writes from such a plan."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from orchestrator.calibrate import single
from tests.support import run_device_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/qwen3_probe.sh"
PLAN = ROOT / "benchmarks/calibration/plans/qwen3-decode-grid.json"


_probe = functools.partial(run_device_script, SCRIPT)


def test_help_quotes_the_exact_run_call(tmp_path) -> None:
    done = _probe(tmp_path, "--help")
    assert done.returncode == 0
    assert 'run(kind="nvidia-h200-x2", carry=[], timeout_s=480,' in done.stdout
    assert "BUDGET=470 bash scripts/device/qwen3_probe.sh" in done.stdout


def test_dry_run_prints_the_three_phases_in_order_and_starts_nothing(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
    phases = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")]
    assert phases == ["count-dummy", "profile", "count-random"]
    dummy, random_gate = (line for line in done.stdout.splitlines() if "-eager-count: sglang" in line)
    assert "PDO_PROBE_GATE" not in dummy and "'PDO_PROBE_GATE': 'random'" in random_gate
    for line in (dummy, random_gate):
        assert "--disable-cuda-graph" in line and "counts at batches 1,2,4,8,16,32,64,128,256,512, 250-token prompts" in line
    (profile,) = [line for line in done.stdout.splitlines() if line.startswith("server qwen3-graphs")]
    assert "decode B [1, 4, 8, 16, 32, 64, 128, 256] x C [256, 1024, 4096]" in profile
    assert "prefill L [1024, 4096]" in profile and "--cuda-graph-bs-decode 1 4 8 16 32 64 128 256;" in profile


@pytest.mark.parametrize("args, env, message", [
    (["--nope"], {}, "unknown argument '--nope'"),
    (["--dry-run"], {"BUDGET": "4m"}, "BUDGET='4m': whole seconds"),
    (["--dry-run"], {"BUDGET": "300"}, "BUDGET=300: the phases count-dummy,profile,count-random need at least 465 s"),
    (["--dry-run"], {"PHASES": "count-dummy,warm"}, "PHASES: unknown phase 'warm'"),
    (["--dry-run"], {"MODEL": "configs"}, "MODEL=configs: no config.json there"),
    (["--dry-run"], {"QWEN3_GPU": "0,1"}, "QWEN3_GPU='0,1': one GPU index"),
])
def test_bad_settings_are_refused_naming_the_setting(tmp_path, args, env, message) -> None:
    done = _probe(tmp_path, *args, **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_shorter_budget_fits_when_a_phase_is_dropped(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", BUDGET="330", PHASES="count-dummy,profile")
    assert done.returncode == 0, done.stderr
    assert "== profile (155 s)" in done.stdout and "== count-random" not in done.stdout


def test_the_plan_is_a_batch_by_context_grid_of_the_contest_decode_shape() -> None:
    (variant,) = json.loads(PLAN.read_text())
    assert set(variant["measure"]) <= {"prefill", "decode", "context", "beyond"}
    assert variant["decode_batches"] == [1, 4, 8, 16, 32, 64, 128, 256]
    assert variant["decode_contexts"] == [256, 1024, 4096] and variant["prefill_lengths"] == [1024, 4096]
    graphs = variant["flags"][variant["flags"].index("--cuda-graph-bs-decode") + 1:]
    assert [int(b) for b in graphs] == variant["decode_batches"]   # every measured batch replays its own graph


class _FakeServer:
    """Stands in for SglangServer: ready at once, alive, nothing logged."""

    def __init__(self, name, model_path, port, log, flags, env=None):
        self.argv, self.launched_at = ["python", "-m", "sglang.launch_server", *flags], 0.0

    def start(self):
        return self

    def wait_ready(self, timeout_s):
        return 1.0

    def get_json(self, path):
        return {"context_length": 16384, "max_running_requests": 1024}

    def log_text(self):
        return ""

    def alive(self):
        return True

    def stop(self):
        pass


def test_calibrate_single_writes_one_decode_row_per_batch_and_context(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(single, "SglangServer", _FakeServer)
    monkeypatch.setattr(single, "measure_decode_point", lambda srv, rng, vocab, b, c, max_running=None, **_: {
        "batch_size": b, "context_tokens": c, "step_ms_median": 1.0})
    monkeypatch.setattr(single, "measure_prefill", lambda *a, **k: [])
    variant = {**json.loads(PLAN.read_text())[0], "measure": ["decode"]}
    single.run_single(str(ROOT / "models/qwen3-235b-a22b-fp8-l6"), "qwen3-l6", tmp_path, 600, plan=[variant])
    raw = json.loads((tmp_path / "calibration-qwen3-l6.json").read_text())
    assert raw["schema"] == "pdo-calibration-raw/1"
    rows = raw["runs"][0]["decode"]
    # the back-test finds a calibration point by (batch_size, context_tokens) within run[measure]
    assert [(r["batch_size"], r["context_tokens"]) for r in rows] == [
        (b, c) for c in (256, 1024, 4096) for b in (1, 4, 8, 16, 32, 64, 128, 256)]


# ---- the reader of what the probe brings back (benchmarks/qwen3_routing_read.py) ----------------------------------

def _reader():
    from benchmarks import qwen3_routing_read

    return qwen3_routing_read


def _counts(means: dict[int, float]):
    read = _reader()
    return {b: read.Count(b, 36, m, m, int(m), int(m) + 1) for b, m in means.items()}


def test_the_recorded_rule_reads_each_outcome_from_the_count_at_batch_64() -> None:
    read = _reader()
    uniform = {b: read.uniform_distinct(b, 8, 128) for b in (8, 16, 32, 64)}
    assert round(uniform[64], 1) == 125.9   # 128 (1 - (1 - 8/128)^64)
    random_gate = _counts(uniform)
    assert read.outcome({"dummy": _counts({64: 9.0}), "random": random_gate}, 8, 128)[0] == "collapsed"
    assert read.outcome({"dummy": _counts({64: 16.0}), "random": random_gate}, 8, 128)[0] == "collapsed"
    assert read.outcome({"dummy": _counts({64: 60.0}), "random": random_gate}, 8, 128)[0] == "partial"
    assert read.outcome({"dummy": _counts({64: 101.0}), "random": random_gate}, 8, 128)[0] == "uniform"
    # randomised gates that miss the formula by more than 10 % at batch 8..64: the hook is not trusted
    off = _counts({**uniform, 16: uniform[16] * 0.8})
    verdict, why = read.outcome({"dummy": _counts({64: 9.0}), "random": off}, 8, 128)
    assert verdict == "hook-suspect" and "[16]" in why
    assert read.outcome({"dummy": _counts({32: 9.0})}, 8, 128)[0] == "not measured"


def test_a_count_phase_cut_before_its_summary_is_read_from_its_trace(tmp_path) -> None:
    import tarfile

    read = _reader()
    work = tmp_path / "work" / "count-dummy"
    work.mkdir(parents=True)
    rows = [{"tokens": 64, "distinct": d, "experts": 128, "layer": 0} for d in (8, 9, 9)]
    rows += [{"tokens": 64 * 250, "distinct": 120, "experts": 128, "layer": 0}]   # a prefill call: not a decode batch
    (work / "trace-dummy-eager-count.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with tarfile.open(tmp_path / "qwen3-probe.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "work", arcname=".")
    (tmp_path / "routing.json").write_text(json.dumps({"dummy-eager-count": {"error": "KeyboardInterrupt"}}))
    counts = read.load_counts(tmp_path, [1, 64])
    assert list(counts) == ["dummy"] and list(counts["dummy"]) == [64]
    assert counts["dummy"][64].calls == 3 and counts["dummy"][64].median == 9


def test_one_routed_expert_is_its_three_fp8_matrices_in_the_planners_weight_table() -> None:
    read = _reader()
    per_expert, top_k, n, moe_layers = read.expert_bytes_per_layer(str(ROOT / "configs/device-h200x2-qwen3-serve.yaml"), "H200")
    assert (top_k, n, moe_layers) == (8, 128, 6)
    fp8 = 3 * 4096 * 1536   # gate, up and down projections, one byte per weight
    assert fp8 <= per_expert < fp8 * 1.01   # block scales are the rest


def _fake_raw(folder: Path) -> None:
    decode = [{"batch_size": b, "context_tokens": c, "step_ms_median": 3.0, "cuda_graph": True,
               "client": {"input_tokens": b * c, "completion_tokens": b * 100, "wall_s": 0.5 + b * c / 1e5}}
              for c in (256, 1024, 4096) for b in (1, 4, 8, 16, 32, 64, 128, 256) if (b, c) != (256, 4096)]
    prefill = [{"input_tokens": 4096, "concurrency": 1, "latency_s_median": 0.041}]
    (folder / "calibration-qwen3-l6.json").write_text(json.dumps({
        "schema": "pdo-calibration-raw/1", "gpu": {"name": "NVIDIA H200", "memory_total_mib": 143771},
        "runs": [{"variant": "qwen3-graphs", "decode": decode, "prefill": prefill}]}))


def test_the_recorded_backtest_rows_come_out_ready_for_runs_yaml(tmp_path) -> None:
    import yaml

    from orchestrator.plan.backtest.predict import predict_row

    read = _reader()
    _fake_raw(tmp_path)
    text = read.backtest_rows(tmp_path, f"{tmp_path}/", "2026-11-26 test")
    data = yaml.safe_load(text)
    assert [r["id"] for r in data["runs"]] == ["h200-qwen3l6-4x4096-lone", "h200-qwen3l6-16x4096-lone",
                                               "h200-qwen3l6-64x1024-lone", "h200-qwen3l6-256x256-lone",
                                               "h200-qwen3l6-prefill-1x4096-lone"]
    row = data["runs"][1]   # 16 x 4096: (65,536 + 1,600) tokens over the client's wall
    assert row["measured"]["total_tok_s"] == round((16 * 4096 + 1600) / (0.5 + 16 * 4096 / 1e5))
    assert row["raw_point"] == {"variant": "qwen3-graphs", "measure": "decode", "batch_size": 16, "context_tokens": 4096}
    for row in data["runs"]:   # each one predicts through the back-test as a calibration point, out of sample
        predicted = predict_row(row, data["batches"], ROOT / "benchmarks/backtest")
        assert predicted.scope == "point" and predicted.sample == "out" and predicted.predicted > 0
    (tmp_path / "calibration-qwen3-l6.json").write_text(json.dumps({
        **json.loads((tmp_path / "calibration-qwen3-l6.json").read_text()), "runs": [{"variant": "qwen3-graphs", "decode": []}]}))
    assert "# qwen3l6-4x4096: not measured" in read.backtest_rows(tmp_path, "x/", "t")


def test_the_curve_is_written_only_under_an_adopting_outcome_and_matches_the_qwen3_shape(tmp_path) -> None:
    from orchestrator.config import load_config
    from orchestrator.perfmodel.costmodel import cost_model_for
    from orchestrator.perfmodel.profile import RoutingCurve

    read = _reader()
    config = str(ROOT / "configs/device-h200x2-qwen3-serve.yaml")
    uniform = {b: read.uniform_distinct(b, 8, 128) for b in (8, 16, 32, 64)}
    for dummy_64, adopted in ((9.0, True), (110.0, False)):
        routing = {"dummy-eager-count": {"distinct_experts": {"64": {"calls": 36, "mean": dummy_64, "min": 8, "max": 10}}},
                   "random-eager-count": {"distinct_experts": {str(b): {"calls": 36, "mean": u, "min": 1, "max": 128}
                                                               for b, u in uniform.items()}}}
        (tmp_path / "routing.json").write_text(json.dumps(routing))
        rep = read.report(tmp_path, config, "H200")
        if not adopted:
            with pytest.raises(ValueError, match="'uniform'"):
                read.routing_curve(rep, config, "benchmarks/results/x/")
            continue
        curve = RoutingCurve.model_validate(read.routing_curve(rep, config, "benchmarks/results/x/"))
        cfg = load_config(config)
        assert curve.model.matches(cost_model_for(cfg, "decode", cfg.layout.decode[0]).arch, "fp8")
        assert [(x.tokens, x.distinct_experts, x.gate) for x in curve.routing if x.gate == "dummy"] == [(64, 9.0, "dummy")]
