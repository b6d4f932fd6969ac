"""scripts/device/bench_two_gpu.sh agg-ab / pd-ab (lease 4, issue 25): one config twice in one call, each leg with its
own --set, leg A's timeout leaving leg B its reserved share. Run here with stand-ins for the GPU machine's `python3`
(it records the bench command lines) and `nvidia-smi` (names an H100), the sglang tree marked as unpacked."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_phase(tmp_path: Path, phase: str, env: dict[str, str]) -> tuple[list[str], str]:
    bin_dir, site, pdo = tmp_path / "bin", tmp_path / "site", tmp_path / "pdo"
    for d in (bin_dir, site, pdo):
        d.mkdir()
    for marker in (".installed_site", ".installed_rt", ".nixl_patched_v8"):
        (site / marker).touch()
    calls = tmp_path / "bench-calls.txt"
    _stub(bin_dir / "python3", f'case "$*" in *orchestrator.cli.bench*) echo "$*" >> {calls};; esac\nexit 0\n')
    _stub(bin_dir / "nvidia-smi", 'echo "NVIDIA H100 80GB HBM3"\n')
    done = subprocess.run(["bash", "-x", "scripts/device/bench_two_gpu.sh", phase], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SITE_DIR": str(site),
                               "PDO_DIR": str(pdo), "OUT": str(tmp_path / "out"), **env})
    assert done.returncode == 0, done.stdout + done.stderr
    return calls.read_text().splitlines(), done.stdout + done.stderr


def test_agg_ab_runs_the_aggregated_config_twice_each_leg_with_its_own_sets(tmp_path) -> None:
    benches, log = _run_phase(tmp_path, "agg-ab", {
        "BUDGET": "500", "BENCH_B_RESERVE_S": "240", "BENCH_AB_LABELS": "graphs1024 graphs256",
        "BENCH_AGG_SETS": "--set layout.aggregated.0.cuda_graph_max_bs=1024",
        "BENCH_AGG_SETS_B": "--set layout.aggregated.0.mem_fraction_static=0.80"})
    assert len(benches) == 2
    a, b = benches
    for line in benches:
        assert "--config configs/device-h200x2-local-agg-tp2.yaml" in line and "--set cluster.gpu=H100-SXM" in line
    assert "cuda_graph_max_bs=1024" in a and "agg-tp2-graphs1024/runs" in a and "mem_fraction_static" not in a
    assert "mem_fraction_static=0.80" in b and "agg-tp2-graphs256/runs" in b and "cuda_graph_max_bs" not in b
    # leg A's timeout keeps leg B's 240 s (and the 25 s each bench leaves for its tail) out of the 500 s budget
    timeouts = [int(line.split("timeout ")[1].split()[0]) for line in log.splitlines() if line.startswith("+ timeout ")]
    assert timeouts[0] <= 500 - 25 - 240 and timeouts[1] > timeouts[0]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar.xz")) == ["agg-tp2-graphs1024.tar.xz",
                                                                         "agg-tp2-graphs256.tar.xz"]


def test_pd_ab_sends_each_decode_fraction_to_the_pd_config_only(tmp_path) -> None:
    benches, _ = _run_phase(tmp_path, "pd-ab", {
        "BUDGET": "500", "BENCH_PD_SETS": "--set layout.decode.0.mem_fraction_static=0.65",
        "BENCH_PD_SETS_B": "--set layout.decode.0.mem_fraction_static=0.55"})
    assert [("0.65" in line, "0.55" in line, "pd-a/runs" in line, "pd-b/runs" in line) for line in benches] == [
        (True, False, True, False), (False, True, False, True)]
    assert all("--config configs/device-h200x2-local-1p1d.yaml" in line for line in benches)
