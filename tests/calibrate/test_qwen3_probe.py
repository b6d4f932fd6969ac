"""The Qwen3-shaped probe's one device call (issue 25) without a GPU: scripts/device/qwen3_probe.sh's settings checks,
`--help` and `--dry-run`, its decode-grid plan, and the grid rows `calibrate single` writes from such a plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.calibrate import single

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/qwen3_probe.sh"
PLAN = ROOT / "benchmarks/calibration/plans/qwen3-decode-grid.json"


def _probe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "WORK_DIR": str(tmp_path / "work"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=full)


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
    (["--dry-run"], {"BUDGET": "300"}, "BUDGET=300: the phases count-dummy,profile,count-random need at least 445 s"),
    (["--dry-run"], {"PHASES": "count-dummy,warm"}, "PHASES: unknown phase 'warm'"),
    (["--dry-run"], {"MODEL": "configs"}, "MODEL=configs: no config.json there"),
    (["--dry-run"], {"QWEN3_GPU": "0,1"}, "QWEN3_GPU='0,1': one GPU index"),
])
def test_bad_settings_are_refused_naming_the_setting(tmp_path, args, env, message) -> None:
    done = _probe(tmp_path, *args, **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_shorter_budget_fits_when_a_phase_is_dropped(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", BUDGET="320", PHASES="count-dummy,profile")
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
    monkeypatch.setattr(single, "measure_decode_point", lambda srv, rng, vocab, b, c, max_running=None: {
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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import qwen3_routing_read

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
