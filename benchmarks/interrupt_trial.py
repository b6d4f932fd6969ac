"""`python benchmarks/interrupt_trial.py [N]`: trial of issue 22's first promise as a user meets it: `pd-orchestrator bench --config configs/default.yaml`
(the embedded 1000-prompt simulated run, its own local Ray cluster), Ctrl-C (SIGINT to the bench process,
whose SIGINT is not ignored, as from a terminal) once the driver's own exporter says >= 800 prompts are done;
then result.json's counts against the decode engine's own tally (its log's last line)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.cluster.ports import free_port  # noqa: E402
from tests.support import sim_engines_finished  # noqa: E402

AT = int(sys.argv[1]) if len(sys.argv) > 1 else 800
out_dir = Path(tempfile.mkdtemp(prefix="trial-"))
code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'pd-orchestrator'; runpy.run_module('orchestrator', run_name='__main__')")
port = free_port()  # the driver's exporter, read to know how far the run got
proc = subprocess.Popen([sys.executable, "-c", code, "bench", "--config", "configs/default.yaml", "--quiet",
                         "--result-dir", str(out_dir), "--set", f"metrics.exporter_port={port}",
                         "--set", f"metrics.file_sd_path={out_dir / 'targets.json'}"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

def done_prompts():
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except Exception:
        return None
    m = re.search(r"^pdorch_bench_done_prompts\{[^}]*\} (\S+)", text, re.M)
    return float(m.group(1)) if m else None

while (n := done_prompts()) is None or n < AT:
    if proc.poll() is not None:
        sys.exit(f"bench ended first:\n{proc.stdout.read()[-3000:]}")
    time.sleep(0.05)
proc.send_signal(signal.SIGINT)
print(f"TRIAL: SIGINT sent when the driver's exporter said {n:.0f} prompts done")
out, _ = proc.communicate(timeout=300)
print("\n".join(out.splitlines()[-32:]))
print(f"exit code {proc.returncode}")
doc = json.loads(next(out_dir.glob("*/result.json")).read_text())
c = doc["counts"]
print(f"TRIAL result.json: completed {c['completed']}, failed {c['failed']} of {c['num_prompts']}; "
      f"reason {doc['reason']!r}; decode engine's own tally: {sim_engines_finished(doc, 'decode')} finished; "
      f"failure reasons {doc['failure_reasons']}; report.html written: {any(out_dir.glob('*/report.html'))}")
