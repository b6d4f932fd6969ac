"""The host probe every lease runs before its engines (scripts/device/host_probe.py, site_lib.sh's host_probe_once):
what it reads from lscpu and nvidia-smi, how it summarises windows, and that it writes its JSON on a machine without
CUDA and runs once per call only where nvidia-smi answers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("host_probe", ROOT / "scripts/device/host_probe.py")
assert SPEC and SPEC.loader
host_probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(host_probe)
SMI_LINE = "NVIDIA H200, 580.159.04, P0, 1980 MHz, 1980 MHz, 3201 MHz, 79.10 W, 37, 0x0000000000000001"


def test_lscpu_essentials_come_from_a_lease_s_own_lscpu() -> None:
    text = (ROOT / "benchmarks/results/2026-11-26-two-gpu-lease5-h200x2/call3-eager-ab/host.txt").read_text()
    got = host_probe.parse_lscpu(text)
    assert got["Model name"] == "Intel(R) Xeon(R) Processor" and got["CPU(s)"] == "32"
    assert got["BogoMIPS"] == "4200.00" and got["Hypervisor vendor"] == "KVM" and got["Thread(s) per core"] == "1"
    assert "Flags" not in got


def test_nvidia_smi_rows_are_named_by_field_and_a_short_row_names_the_fields() -> None:
    rows = host_probe.parse_smi_csv(SMI_LINE + "\n" + SMI_LINE.replace("37,", "38,") + "\n")
    assert len(rows) == 2 and rows[0]["clocks.max.sm"] == "1980 MHz" and rows[1]["temperature.gpu"] == "38"
    with pytest.raises(ValueError, match="expected 9 .*clocks.sm"):
        host_probe.parse_smi_csv("NVIDIA H200, 580.159.04")


def test_window_stats_give_the_spread_and_refuse_one_window() -> None:
    s = host_probe.window_stats([100.0] * 18 + [50.0, 200.0])
    assert s["median"] == 100.0 and s["min"] == 50.0 and s["max"] == 200.0 and s["windows"] == 20
    assert s["p5"] < 100.0 < s["p95"] and s["p95_over_p5"] == s["p95"] / s["p5"]
    with pytest.raises(ValueError, match="--python-s or --launches"):
        host_probe.window_stats([1.0])


def test_the_probe_writes_its_json_without_cuda(tmp_path: Path, capsys) -> None:
    out = tmp_path / "probe.json"
    assert host_probe.main(["--out", str(out), "--cpus", "0", "--python-s", "0.2", "--window-s", "0.02"]) == 0
    record = json.loads(out.read_text())
    loop = record["python"]["0"]
    assert loop["windows"] >= 2 and loop["min"] <= loop["median"] <= loop["max"] and loop["median"] > 0
    assert "skipped" in record["cuda"] and record["host"]["nproc"] == os.cpu_count()
    assert "python loop on CPU 0" in capsys.readouterr().out


def test_a_cpu_the_process_may_not_use_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--cpus: \\[4096\\]"):
        host_probe.main(["--out", str(tmp_path / "p.json"), "--cpus", "4096"])


def _unpack(tmp_path: Path, path_dirs: str) -> subprocess.CompletedProcess:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "x").write_text("x")
    with tarfile.open(tmp_path / "site.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "tree" / "x", arcname="x")
    env = {**os.environ, "PATH": path_dirs, "OUT": str(tmp_path / "out"), "SITE_ARCHIVE": str(tmp_path / "site.tar.xz"),
           "HOST_PROBE_ARGS": "--cpus 0 --python-s 0.1 --window-s 0.02 --no-cuda"}
    (tmp_path / "out").mkdir()
    script = f". {ROOT}/scripts/device/site_lib.sh; unpack_site {tmp_path}/site; echo rc=$?"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env)


def test_unpack_site_runs_the_probe_where_nvidia_smi_answers(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a GPU-less stand-in for the device's nvidia-smi, its query's CSV only
    smi.write_text(f"#!/bin/sh\necho '{SMI_LINE}'\n")
    smi.chmod(0o755)
    r = _unpack(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    assert "rc=0" in r.stdout, r.stdout + r.stderr
    record = json.loads((tmp_path / "out" / "host-probe.json").read_text())
    assert record["host"]["gpus"][0]["name"] == "NVIDIA H200" and "[host-probe] host probe:" in r.stdout


def test_unpack_site_skips_the_probe_without_nvidia_smi(tmp_path: Path) -> None:
    r = _unpack(tmp_path, "/usr/bin:/bin")
    assert "rc=0" in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "out" / "host-probe.json").exists() and (tmp_path / "site" / "x").exists()


def _probe(started: str, eager_us: float, loop_rate: float) -> dict:
    rate = {"median": 1e6 / eager_us, "p5": 1e6 / eager_us, "p95": 1e6 / eager_us, "p95_over_p5": 1.0}
    return {"started_at": started, "python": {"0": {"median": loop_rate}},
            "cuda": {"cpu": 0, "eager_us_per_launch": eager_us, "graph_us_per_kernel": 1.0,
                     "eager_launches_per_s": rate, "graph_kernels_per_s": rate}}


def test_the_read_calls_a_launch_rate_that_follows_the_vcpu_swings(tmp_path: Path) -> None:
    from benchmarks import host_probe_read

    (tmp_path / "probes").mkdir()
    for i, (eager, loop) in enumerate([(5.0, 1000.0), (8.0, 600.0), (5.5, 950.0), (7.0, 700.0)], 1):
        (tmp_path / "probes" / f"probe-{i:02d}.json").write_text(json.dumps(_probe(f"t{i}", eager, loop)))
    with tarfile.open(tmp_path / "probes.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "probes", arcname="probes")
    lines = host_probe_read.report(host_probe_read.load_probes(tmp_path / "probes.tar.xz"))
    assert any(line.startswith("Q-stable: eager us max / min over probes x1.600 -> SWINGS") for line in lines)
    assert any("Spearman vs eager launches/s +1.00 -> TRACKS" in line for line in lines)
    assert host_probe_read.stable_verdict(1.05) == "STABLE" and host_probe_read.stable_verdict(1.3) == "MIXED"
    assert host_probe_read.track_verdict(None) == "not testable"
