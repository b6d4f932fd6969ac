"""`pd-orchestrator serve` as a user runs it on the 2026 preset (configs/qwen3-pd-2026.yaml: 2 prefill TP4 + 2 decode
TP4 EP4, simulated, short start-up) on the session's local Ray cluster: every PD pair warmed, one ready line, the
real AIPerf through the gateway (`goodput` at N=2,4), an OpenAI chat streamed through it, SIGTERM mid-stream ->
drained, clean exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cluster.ports import free_port
from orchestrator.config import dump_config, load_config

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


def counter(url: str, name: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_serve_qwen3_preset_goodput_chat_and_drain_on_sigterm(ray_cluster, tmp_path):
    cfg = load_config(ROOT / "configs" / "qwen3-pd-2026.yaml", [
        "engine.sim.startup_s=0", "engine.sim.time_scale=0.05", f"router.port={free_port()}",
        "benchmark.deadline_s=300", f"benchmark.result_dir={tmp_path}"])
    path = tmp_path / "serve.yaml"
    path.write_text(dump_config(cfg))
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.gcs_address, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve", "--config", str(path), "--drain-s", "60"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("ready: ") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)
        ready = next(line for line in lines if line.startswith("ready: "))
        gateway = ready.split("OpenAI gateway ", 1)[1].split()[0].removesuffix("/v1")
        warm = [line for line in lines if line.startswith("pair warm-up ")]
        assert len(warm) == 4 and not any("FAILED" in w for w in warm), lines  # 2 prefill x 2 decode
        workers = dict(item.split() for item in next(
            line for line in lines if line.startswith("workers ready")).split(": ", 1)[1].split(", "))
        prefills = [url for name, url in workers.items() if name.startswith("prefill")]
        assert len(prefills) == 2 and len(workers) == 4, workers

        # the real AIPerf through the gateway, as the contest measures it (short)
        before = {u: (counter(u, "sglang:num_requests_total"), counter(u, "sglang:prompt_tokens_total"))
                  for u in prefills}
        out = tmp_path / "goodput"
        goodput = subprocess.run(
            [sys.executable, "-m", "orchestrator", "goodput", "--config", str(path), "--url", gateway,
             "--concurrency", "2,4", "--isl", "64", "--osl", "8", "--warmup-s", "0", "--window-s", "2",
             "--grace-s", "10", "--num-dataset-entries", "16", "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert goodput.returncode == 0, goodput.stdout + goodput.stderr
        rows = json.loads((out / "goodput.json").read_text())["rows"]
        assert [r["concurrency"] for r in rows] == [2, 4] and all(r["errors"] == 0 for r in rows), rows
        requests = sum(counter(u, "sglang:num_requests_total") - before[u][0] for u in prefills)
        prompt_tokens = sum(counter(u, "sglang:prompt_tokens_total") - before[u][1] for u in prefills)
        assert requests >= sum(r["requests"] for r in rows)
        # the gateway applied Qwen's chat template with Qwen's tokenizer: AIPerf's prompt + 8 template tokens
        assert prompt_tokens / requests == pytest.approx(rows[0]["input_tokens_avg"] + 8, abs=1)

        # a streamed chat still decoding when SIGTERM lands: the drain lets it finish whole
        chunks: list[str] = []
        with httpx.stream("POST", f"{gateway}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 2000,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                if len(chunks) == 5:
                    proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out_text = "\n".join(lines)
    assert chunks[-1] == "[DONE]", out_text
    assert json.loads(chunks[-2])["usage"]["completion_tokens"] == 2000, out_text
    assert rc == 0, out_text
    assert "stopping (received SIGTERM)" in out_text and "drained: no request in flight" in out_text, out_text
