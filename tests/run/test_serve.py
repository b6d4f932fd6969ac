"""`pd-orchestrator serve` as a user runs it: workers + router placed on the session's local Ray cluster, every
PD pair warmed, one ready line, an OpenAI chat streamed through the gateway, SIGTERM mid-stream -> drained, clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from orchestrator.config import dump_config
from tests.support import sim_config

pytestmark = pytest.mark.ray


def test_serve_warms_pairs_serves_chat_and_drains_on_sigterm(ray_cluster, tmp_path):
    cfg = sim_config({"name": "serve", "engine.sim.time_scale": 1.0, "benchmark.deadline_s": 240.0}, tmp_dir=tmp_path)
    path = tmp_path / "serve.yaml"
    path.write_text(dump_config(cfg))
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.gcs_address, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve", "--config", str(path), "--drain-s", "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("ready: ") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)
        ready = next(line for line in lines if line.startswith("ready: "))
        warm = [line for line in lines if line.startswith("pair warm-up ")]
        assert len(warm) == 1 and "prefill-0/0 -> decode-0/0" in warm[0] and "FAILED" not in warm[0], lines
        gateway = ready.split("OpenAI gateway ", 1)[1].split()[0]

        # a streamed chat long enough (R1 decode on cpu-fast at time scale 1) to be in flight when SIGTERM lands
        chunks: list[str] = []
        with httpx.stream("POST", f"{gateway}/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                if len(chunks) == 5:
                    proc.send_signal(signal.SIGTERM)  # mid-stream
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "\n".join(lines)
    assert chunks[-1] == "[DONE]", out
    usage = json.loads(chunks[-2])["usage"]
    assert usage["completion_tokens"] == 400, (usage, out)  # the request in flight finished whole
    assert rc == 0, out
    assert "drained: no request in flight" in out and "stopping (received SIGTERM)" in out, out
