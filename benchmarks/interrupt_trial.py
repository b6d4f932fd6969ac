"""`python benchmarks/interrupt_trial.py [N]`: issue 22's first promise as a user meets it.

`pd-orchestrator cluster up --local`, then `pd-orchestrator bench --config configs/default.yaml` (the
1000-prompt simulated default) attached to it, Ctrl-C (SIGINT to the bench process, whose SIGINT is not
ignored, as from a terminal) once the driver's own exporter says >= N (default 800) prompts are done; then
result.json's counts against the decode engine's own tally (its log's last line, minus the warm-up requests),
and `cluster down`. The cluster is ours so the engine logs outlive the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from orchestrator.cluster.local import LocalClusterState  # noqa: E402
from orchestrator.cluster.ports import free_port  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.workload.batch import bench_first_forwards, warmup_batch  # noqa: E402
from tests.support import sim_engines_finished  # noqa: E402

AT = int(sys.argv[1]) if len(sys.argv) > 1 else 800
CONFIG = "configs/default.yaml"
work = Path(tempfile.mkdtemp(prefix="interrupt-trial-"))
state = work / "local-cluster.json"
cli = [sys.executable, "-m", "orchestrator"]
up = subprocess.run([*cli, "cluster", "up", "--local", "--config", CONFIG, "--state", str(state)], cwd=ROOT,
                    capture_output=True, text=True)
print(up.stdout.strip().splitlines()[0] if up.returncode == 0 else up.stdout + up.stderr)
try:
    cluster = LocalClusterState.load(state)
    assert cluster is not None, f"cluster up wrote no state to {state}"
    gcs = cluster.gcs_address
    port = free_port()  # the driver's exporter, read to know how far the run got
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv[0] = 'pd-orchestrator'; runpy.run_module('orchestrator', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", code, "bench", "--config", CONFIG, "--quiet",
                             "--result-dir", str(work), "--set", f"metrics.exporter_port={port}",
                             "--set", f"metrics.file_sd_path={work / 'targets.json'}"],
                            cwd=ROOT, env={**os.environ, "RAY_ADDRESS": gcs},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def done_prompts() -> float | None:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
        except OSError:
            return None
        m = re.search(r"^pdorch_bench_done_prompts\{[^}]*\} (\S+)", text, re.M)
        return float(m.group(1)) if m else None

    while (n := done_prompts()) is None or n < AT:
        if proc.poll() is not None:
            sys.exit(f"bench ended first:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    print(f"TRIAL: SIGINT sent when the driver's exporter said {n:.0f} prompts done")
    out, _ = proc.communicate(timeout=300)
    print("\n".join(out.splitlines()[-24:]))
    print(f"exit code {proc.returncode}")
    doc = json.loads(next(work.glob("*/result.json")).read_text())
    counts = doc["counts"]
    cfg = load_config(ROOT / CONFIG, paths_from=ROOT)
    # the short prompts, and one first-forward prompt per DP rank of every prefilling server (run/bench_warmup.py)
    warmups = len(warmup_batch(cfg, counts["num_prompts"])) + sum(
        f.ranks * getattr(cfg.layout, f.role)[f.group_index].count for f in bench_first_forwards(cfg))
    engine = sim_engines_finished(doc, "decode") - warmups
    print(f"TRIAL result.json: completed {counts['completed']}, failed {counts['failed']} of "
          f"{counts['num_prompts']}; reason {doc['reason']!r}; failure reasons {doc['failure_reasons']}; "
          f"decode engine's own tally minus {warmups} warm-up requests: {engine}; "
          f"report.html written: {any(work.glob('*/report.html'))}")
finally:
    subprocess.run([*cli, "cluster", "down", "--state", str(state)], cwd=ROOT, capture_output=True, text=True)
