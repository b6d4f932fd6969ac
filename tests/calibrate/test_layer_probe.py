"""The R1-shaped layer-count probe's device call (issue 25, lease 8) without a GPU: scripts/device/layer_probe.sh's
argument checks, `--help` and `--dry-run` (the model config it writes per layer count, the flags of the 6-layer
profiles, the grid), and the plan file it reads."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.support import run_device_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/layer_probe.sh"
PLAN = ROOT / "benchmarks/calibration/plans/lease8-layer-grid.json"


_probe = functools.partial(run_device_script, SCRIPT, PROBE_TAG="lease13")


def test_help_quotes_both_run_calls_of_the_lease(tmp_path) -> None:
    done = _probe(tmp_path, "--help")
    assert done.returncode == 0
    assert 'run(kind="nvidia-h100-x1", carry=[".device/site-split/site.tar.xz.part00"]' in done.stdout
    assert 'run(carry=[".device/site-split/site.tar.xz.part01"], timeout_s=600' in done.stdout
    assert "BUDGET=560 bash scripts/device/layer_probe.sh 4 6 5 3" in done.stdout


def test_dry_run_starts_one_server_per_count_in_order_on_the_six_layer_profiles_flags(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", "4", "6", "3")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
    heads = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert heads == ["== r1s4-lease13: 4 layers (3 dense + 1 MoE), cold caches", "== r1s6-lease13: 6 layers (3 dense + 3 MoE), warm caches",
                     "== r1s3-lease13: 3 layers (3 dense + 0 MoE), warm caches"]
    servers = [line for line in done.stdout.splitlines() if line.startswith("server layers")]
    assert len(servers) == 3
    for line in servers:
        assert "--load-format dummy" in line and "--attention-backend triton" in line
        assert "--trust-remote-code --triton-attention-split-tile-size 256;" in line
        assert "decode B [1, 2, 4, 8, 16, 32, 64, 128, 192, 256] C=256" in line and "context B=16 C [256, 2048, 8192]" in line


def test_the_plan_keeps_sglangs_defaults_and_measures_graphed_steps_only() -> None:
    (variant,) = json.loads(PLAN.read_text())
    assert variant["flags"] == [] and max(variant["decode_batches"]) <= 256  # SGLang's default graphs reach 256
    assert variant["repeats"] >= 2


@pytest.mark.parametrize("args, env, message", [
    ([], {}, "no layer count given"),
    (["--nope"], {}, "unknown argument '--nope'"),
    (["4x"], {}, "layer count '4x': a whole number"),
    (["0"], {}, "layer count 0: 1..13 fit one H200"),
    (["14"], {}, "layer count 14: 1..13 fit one H200"),
    (["4", "6", "4"], {}, "each count once"),
    (["4"], {"BUDGET": "9m"}, "BUDGET='9m': whole seconds"),
    (["4"], {"BUDGET": "200"}, "BUDGET=200: a cold R1-shaped start"),
    (["4"], {"PROBE_GPU": "0,1"}, "PROBE_GPU='0,1': one GPU index"),
    (["4"], {"PLAN": "nope.json"}, "PLAN=nope.json: no such plan file"),
    (["4"], {"PROBE_TAG": ""}, "PROBE_TAG is not set: name the lease that runs the probe, e.g. PROBE_TAG=lease13"),
    (["4"], {"PROBE_TAG": "lease 13"}, "PROBE_TAG='lease 13': letters and digits only"),
])
def test_bad_arguments_are_refused_naming_the_argument(tmp_path, args, env, message) -> None:
    done = _probe(tmp_path, "--dry-run", *args, **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_qwen3_shape_writes_qwen3_counts_with_the_lone_grids_flags(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", "6", "12", SHAPE="qwen3")
    assert done.returncode == 0, done.stderr
    heads = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert heads == ["== q3l6-lease13: 6 layers (0 dense + 6 MoE), cold caches", "== q3l12-lease13: 12 layers (0 dense + 12 MoE), warm caches"]
    servers = [line for line in done.stdout.splitlines() if line.startswith("server ")]
    assert len(servers) == 2 and all("--trust-remote-code" not in line and "--cuda-graph-bs-decode 1 2 4 8 16 32 64 128 256" in line
                                     for line in servers)
    assert _probe(tmp_path, "--dry-run", "21", SHAPE="qwen3").returncode == 2
    assert "SHAPE='v3': r1" in _probe(tmp_path, "--dry-run", "4", SHAPE="v3").stderr
