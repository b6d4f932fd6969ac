"""scripts/device/calibrate.sh pd's model choice without a GPU (lease 18, issue 25): PD_MODEL=qwen3 writes the Qwen3-235B-A22B
FP8 layer (GQA: 4 KV heads, no MLA latent) at PD_LAYERS layers, the printed harness command parses as `calibrate pd`, and
a bad PD_MODEL / PD_LAYERS is one line naming the setting."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.calibrate.command import add_arguments

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/calibrate.sh"


def _dry(**env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PD_")}
    return subprocess.run(["bash", str(SCRIPT), "pd"], capture_output=True, text=True, cwd=ROOT,
                          env={**full, "DRY_RUN": "1", **env})


def _harness(stdout: str) -> argparse.Namespace:
    (line,) = [s for s in stdout.splitlines() if s.startswith("harness: ")]
    argv = shlex.split(line.removeprefix("harness: "))
    assert argv[:3] == ["python3", "-m", "orchestrator.calibrate"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args([a if a != "<budget>" else "500" for a in argv[3:]])


def test_qwen3_at_twelve_layers_with_fa3_on_two_gpus() -> None:
    done = _dry(PD_MODEL="qwen3", PD_LAYERS="12", PAGE_SIZES="1,64,16", PD_MODES="base,shard", PD_LOADS="2",
                PD_ARGS="--no-agg --prefill-gpu 0 --decode-gpu 1 --flag=--attention-backend --flag=fa3")
    assert done.returncode == 0, done.stderr
    assert "model: Qwen3MoeForCausalLM 12 layers, KV heads 4 , kv_lora_rank None" in done.stdout
    a = _harness(done.stdout)
    assert (a.cmd, a.page_sizes, a.modes, a.loads_per_mode) == ("pd", "1,64,16", "base,shard", 2)
    assert (a.prefill_gpu, a.decode_gpu, a.no_agg, a.flag) == (0, 1, True, ["--attention-backend", "fa3"])


def test_the_default_stays_v2_lite() -> None:
    done = _dry()
    assert done.returncode == 0, done.stderr
    assert "model: DeepseekV2ForCausalLM 27 layers" in done.stdout
    assert _harness(done.stdout).modes == "base,coalesce,shard,coalesce+shard"


@pytest.mark.parametrize(("env", "named"), [({"PD_MODEL": "qwen2"}, "PD_MODEL='qwen2'"),
                                            ({"PD_MODEL": "qwen3", "PD_LAYERS": "0"}, "PD_LAYERS='0'"),
                                            ({"PD_MODEL": "qwen3", "PD_LAYERS": "six"}, "PD_LAYERS='six'")])
def test_a_bad_setting_is_one_line_naming_it(env: dict, named: str) -> None:
    done = _dry(**env)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr
