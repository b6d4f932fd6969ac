"""Lease 14's device call without a GPU (issue 25): scripts/device/qwen3_tp4_probe.sh's argument checks, `--dry-run` (the
94-layer model it writes, the organisers' decode flags over four GPUs, the grid), staging of the four site parts, and the
plan file it reads."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support import run_device_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/qwen3_tp4_probe.sh"
PLAN = ROOT / "benchmarks/calibration/plans/lease14-qwen3-tp4-ep4.json"


_probe = functools.partial(run_device_script, SCRIPT)


def test_dry_run_starts_one_94_layer_server_over_four_gpus_with_the_organisers_decode_flags(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
    assert "model: Qwen3MoeForCausalLM 94 layers, 128 experts, top 8" in done.stdout
    (server,) = [line for line in done.stdout.splitlines() if line.startswith("server ")]
    for flag in ("--tp-size 4 --ep-size 4", "--mem-fraction-static 0.90", "--max-running-requests 256",
                 "--context-length 8192", "--chunked-prefill-size 8192", "--load-format dummy",
                 "--enforce-disable-flashinfer-allreduce-fusion", "--cuda-graph-max-bs-decode 256"):
        assert flag in server
    assert "decode B [1, 4, 8, 12, 16, 24, 32, 48, 64] x C [4096, 256]" in server


def test_every_measured_decode_batch_has_its_own_graph_so_none_is_padded() -> None:
    (variant,) = json.loads(PLAN.read_text())
    flags = variant["flags"]
    graphs = {int(x) for x in flags[flags.index("--cuda-graph-bs-decode") + 1:]}
    assert set(variant["decode_batches"]) <= graphs and max(graphs) == 256
    assert variant["measure"][0] == "prefill" and variant["repeats"] == 2


@pytest.mark.parametrize("env, message", [
    ({"BUDGET": "9m"}, "BUDGET='9m': whole seconds"),
    ({"BUDGET": "100"}, "BUDGET=100"),
    ({"LAYERS": "95"}, "LAYERS=95: 1..94"),
    ({"PROBE_GPUS": "0,1"}, "PROBE_GPUS=0,1: 2 GPUs for a plan at --tp-size 4"),
    ({"PROBE_GPUS": "0,,1"}, "PROBE_GPUS='0,,1': GPU indexes separated by commas"),
    ({"PLAN": "nope.json"}, "PLAN=nope.json: no such plan file"),
])
def test_bad_settings_are_refused_naming_the_setting(tmp_path, env, message) -> None:
    done = _probe(tmp_path, "--dry-run", **env)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_fewer_layer_count_names_its_own_server(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", LAYERS="12", BUDGET="200")
    assert done.returncode == 0, done.stderr
    assert "server q3l12-tp4ep4-lease14" in done.stdout and "12 layers," in done.stdout


def test_each_call_stages_one_part_and_exits_0_until_the_last(tmp_path) -> None:
    # a fake site archive in four parts, carried one per call as .device/lease14/ in a copy of the needed scripts
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        data = b"site"
        info = tarfile.TarInfo("marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    quarter = -(-len(blob) // 4)
    repo = tmp_path / "repo"
    (repo / "scripts/device").mkdir(parents=True)
    for name in ("qwen3_tp4_probe.sh", "site_lib.sh"):
        (repo / "scripts/device" / name).write_text((ROOT / "scripts/device" / name).read_text())
    (repo / "benchmarks/calibration/plans").mkdir(parents=True)
    (repo / "benchmarks/calibration/plans" / PLAN.name).write_text(PLAN.read_text())
    (repo / "benchmarks/manifest.py").write_text("")
    env = {"SITE_DIR": str(tmp_path / "site"), "SITE_STAGE": str(tmp_path / "stage")}
    for k in range(3):
        carried = repo / ".device/lease14"
        if carried.exists():
            for old in carried.iterdir():
                old.unlink()
        carried.mkdir(parents=True, exist_ok=True)
        (carried / f"site.tar.xz.part0{k}").write_bytes(blob[k * quarter:(k + 1) * quarter])
        done = _probe(tmp_path, cwd=repo, **env)
        assert done.returncode == 0, done.stderr
        assert f"{k + 1} of 4 parts staged" in done.stdout
    assert len(list((tmp_path / "stage").iterdir())) == 3 and not (tmp_path / "site").exists()


def test_a_tag_that_cannot_name_a_file_is_refused(tmp_path) -> None:
    done = _probe(tmp_path, "--dry-run", TAG="fa3 arm")
    assert done.returncode == 2 and "TAG='fa3 arm': letters, digits and '-' only" in done.stderr, done.stderr


def test_lease16_plans_are_lease14s_points_with_fa3_and_the_fusion_arm_differs_only_by_the_fusion(tmp_path) -> None:
    (base,) = json.loads(PLAN.read_text())
    (fa3,) = json.loads((ROOT / "benchmarks/calibration/plans/lease16-qwen3-tp4-ep4-fa3.json").read_text())
    (fusion,) = json.loads((ROOT / "benchmarks/calibration/plans/lease16-qwen3-tp4-ep4-fa3-fusion.json").read_text())
    assert [f for f in fa3["flags"] if f not in ("--attention-backend", "fa3")] == base["flags"]
    assert {k: v for k, v in fa3.items() if k not in ("name", "flags")} == {k: v for k, v in base.items() if k not in ("name", "flags")}
    assert [f for f in fa3["flags"] if f != "--enforce-disable-flashinfer-allreduce-fusion"] == fusion["flags"]
    done = _probe(tmp_path, "--dry-run", TAG="lease16-fa3", PLAN=str(ROOT / "benchmarks/calibration/plans/lease16-qwen3-tp4-ep4-fa3.json"))
    assert done.returncode == 0 and "q3l94-tp4ep4-lease16-fa3" in done.stdout, done.stderr
    (server,) = [line for line in done.stdout.splitlines() if line.startswith("server ")]
    assert server.rindex("--attention-backend fa3") > server.index("--attention-backend triton")  # the plan's flag wins


def test_lease17_plan_is_lease16s_two_gpu_fa3_server_at_fewer_batches() -> None:
    (lease16,) = json.loads((ROOT / "benchmarks/calibration/plans/lease16-qwen3-tp2-ep2-fa3.json").read_text())
    (lease17,) = json.loads((ROOT / "benchmarks/calibration/plans/lease17-qwen3-tp2-ep2-fa3.json").read_text())
    assert lease17["flags"] == lease16["flags"] and lease17["decode_contexts"] == lease16["decode_contexts"]
    assert set(lease17["decode_batches"]) < set(lease16["decode_batches"]) and lease17["repeats"] == lease16["repeats"]


def test_slim_archive_refuses_an_fa3_wheel_without_flash_ops_before_unpacking_anything(tmp_path) -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts/device/slim_site_archive.sh"), str(tmp_path / "none.tar.xz"),
                           str(tmp_path / "out.tar.xz")], capture_output=True, text=True,
                          env={**os.environ, "FA3_WHEEL": str(tmp_path / "missing.whl")})
    assert done.returncode == 2 and "FA3_WHEEL=" in done.stderr and "flash_ops.abi3.so" in done.stderr
    assert not (tmp_path / "out.tar.xz").exists()
