"""The one-GPU dummy-routing probe (issue 25) without a GPU: its arguments, dry run, the expert trace and gate
randomisation of its server hook (on CPU tensors), and the aggregation of the trace."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "scripts/device/dummy_routing_probe.py"
R1S = ROOT / "benchmarks/calibration/r1-shaped"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, cwd=ROOT)


def test_help_and_dry_run_name_every_variant_and_start_nothing(tmp_path) -> None:
    assert "--count-batches" in _probe("--help").stdout
    done = _probe("--model-path", str(R1S), "--out", str(tmp_path / "o"), "--budget-s", "530", "--dry-run")
    assert done.returncode == 0 and not (tmp_path / "o").exists()
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["dummy-graphs", "dummy-eager-count", "random-eager-count", "random-graphs"]
    assert "--cuda-graph-bs-decode 1 8 32 64 128 192 256 384 512" in lines[0] and "PDO_PROBE" not in lines[0]
    assert "--disable-cuda-graph" in lines[2] and "'PDO_PROBE_GATE': 'random'" in lines[2] and "PDO_PROBE_TRACE" in lines[2]


@pytest.mark.parametrize("args, message", [
    (["--variants", "dummy-graphs,nope"], "--variants: unknown ['nope']"),
    (["--count-batches", "1,x"], "--count-batches '1,x': not a comma-separated list of integers"),
    (["--count-batches", "0"], "--count-batches: batch sizes must be >= 1"),
    (["--budget-s", "30"], "--budget-s 30: a server start alone takes about a minute"),
])
def test_bad_arguments_are_refused_naming_the_flag(args, message, tmp_path) -> None:
    base = ["--model-path", str(R1S), "--out", str(tmp_path), "--budget-s", "530", "--dry-run"]
    done = _probe(*base, *args)
    assert done.returncode == 2 and message in done.stderr


def test_the_hook_records_distinct_routed_experts_and_randomises_gates(tmp_path) -> None:
    torch = pytest.importorskip("torch")  # third-party: on the GPU machine torch is always there
    hook = _load(ROOT / "scripts/device/dummy_routing/sitecustomize.py", "pdo_probe_hook")
    trace = tmp_path / "trace.jsonl"
    fake = SimpleNamespace(select_experts=lambda h, logits, cfg, **kw: SimpleNamespace(
        topk_ids=torch.tensor([[3, 5, 256], [3, 7, -1]])))  # 256: a fused shared-expert slot; -1: padding
    hook.patch_topk(fake, str(trace))
    out = fake.select_experts(torch.zeros(2, 4), torch.zeros(2, 256), None, layer_id=4)
    assert out.topk_ids.shape == (2, 3)
    (row,) = [json.loads(line) for line in trace.read_text().splitlines()]
    assert row["tokens"] == 2 and row["distinct"] == 3 and row["layer"] == 4 and row["experts"] == 256

    class MoEGate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((256, 16), 1e-3))
            self.e_score_correction_bias = torch.nn.Parameter(torch.full((256,), 0.5))

    model = torch.nn.Sequential(MoEGate(), torch.nn.Linear(4, 4), MoEGate())
    assert hook.randomise_gates(model, 0.02) == 2
    assert float(model[0].e_score_correction_bias.detach().abs().max()) == 0.0
    assert 0.01 < float(model[2].weight.detach().std()) < 0.03


def test_the_hook_randomises_a_qwen3_router_gate_and_nothing_else(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    hook = _load(ROOT / "scripts/device/dummy_routing/sitecustomize.py", "pdo_probe_hook_qwen3")

    class ReplicatedLinear(torch.nn.Module):   # SGLang's Qwen3MoeSparseMoeBlock.gate: a plain linear router, no bias
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((128, 16), 1e-3))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.other = ReplicatedLinear(), ReplicatedLinear()

    model = torch.nn.Module()
    model.mlp = Block()
    assert hook.randomise_gates(model, 0.02) == 1   # `mlp.gate` only, not another linear of the block
    assert 0.01 < float(model.mlp.gate.weight.detach().std()) < 0.03
    assert float(model.mlp.other.weight.detach().std()) == 0.0


def test_the_probe_takes_the_qwen3_shape_and_refuses_a_dense_model(tmp_path) -> None:
    done = _probe("--model-path", str(ROOT / "models/qwen3-235b-a22b-fp8-l6"), "--out", str(tmp_path / "o"),
                  "--budget-s", "130", "--variants", "dummy-eager-count", "--count-prompt", "250", "--dry-run")
    assert done.returncode == 0 and "250-token prompts" in done.stdout
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"vocab_size": 1000, "hidden_size": 64}))
    done = _probe("--model-path", str(dense), "--out", str(tmp_path / "o"), "--budget-s", "130", "--dry-run")
    assert done.returncode == 2 and "names no routed experts" in done.stderr


def test_the_import_hook_patches_a_module_right_after_it_loads(tmp_path, monkeypatch) -> None:
    hook = _load(ROOT / "scripts/device/dummy_routing/sitecustomize.py", "pdo_probe_hook2")
    (tmp_path / "pdo_fake_topk.py").write_text("def select_experts():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = hook._AfterImport({"pdo_fake_topk": lambda m: setattr(m, "select_experts", lambda: "patched")})
    sys.meta_path.insert(0, finder)
    try:
        import pdo_fake_topk  # noqa: F401 - imported for the hook

        assert sys.modules["pdo_fake_topk"].select_experts() == "patched"
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("pdo_fake_topk", None)


def test_the_trace_is_summarised_per_decode_batch(tmp_path) -> None:
    probe = _load(PROBE, "pdo_probe_driver")
    trace = tmp_path / "t.jsonl"
    rows = [{"tokens": 8, "distinct": d, "experts": 256, "layer": 3} for d in (8, 8, 10)]
    rows += [{"tokens": 2048, "distinct": 200, "experts": 256, "layer": 3}]  # a prefill chunk: not a decode batch
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert probe.distinct_by_batch(trace, [8, 32]) == {"8": {"calls": 3, "mean": 8.67, "min": 8, "max": 10, "median": 8,
                                                             "experts": 256}}
    assert probe.distinct_by_batch(tmp_path / "missing.jsonl", [8]) == {}
