"""Start, wait for, query and stop one real SGLang server (stdlib only: runs on the bare GPU machine).

The server is an `orchestrator.process.ManagedProcess` (its own session, its log in a file, `stop()` ends its
whole process tree), the same supervisor the product's engines, raylets and Prometheus run under.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from orchestrator.process import ManagedProcess

# Flags every calibration server gets: dummy weights, token ids in and out (no tokenizer), the Triton
# attention backend (FA3 is stripped from the carried sgl-kernel), metrics, a decode log line every 10 steps.
BASE_FLAGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "triton",
              "--sampling-backend", "pytorch", "--enable-metrics", "--decode-log-interval", "10",
              "--log-level", "info"]


class ServerDied(RuntimeError):
    pass


class SglangServer:
    def __init__(self, name: str, model_path: str, port: int, log_path: Path, flags: list[str],
                 env: dict[str, str] | None = None, python: str = sys.executable, host: str = "127.0.0.1"):
        self.name, self.port, self.host = name, port, host
        self.url = f"http://{host}:{port}"
        self.log_path = Path(log_path)
        self.argv = [python, "-m", "sglang.launch_server", "--model-path", model_path, "--host", host,
                     "--port", str(port), *BASE_FLAGS, *flags]
        self.env = {**os.environ, **(env or {})}
        self.proc: ManagedProcess | None = None
        self.launched_at: float | None = None
        self.ready_after_s: float | None = None

    def start(self) -> "SglangServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")  # a fresh log per start: wait_log must not find an earlier run's line
        self.proc = ManagedProcess(self.argv, self.log_path, self.env, what=self.name)
        self.proc.start()
        self.launched_at = self.proc.started_at
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def wait_log(self, needle: str, timeout_s: float) -> float:
        """Seconds from launch until `needle` appears in the server's log (raises if it exits or times out)."""
        assert self.proc is not None and self.launched_at is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return round(time.time() - self.launched_at, 2)
            if not self.alive():
                raise ServerDied(f"{self.name} exited with {self.proc.returncode} before {needle!r}; log tail:\n"
                                 + "\n".join(self.log_text().splitlines()[-25:]))
            time.sleep(0.5)
        raise TimeoutError(f"{self.name}: no {needle!r} in its log after {timeout_s:.0f}s")

    def wait_ready(self, timeout_s: float) -> float:
        """Poll /health until 200 (SGLang answers 503 until its warm-up request went through)."""
        assert self.proc is not None and self.launched_at is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerDied(f"{self.name} exited with {self.proc.returncode} before ready; log tail:\n"
                                 + "\n".join(self.log_text().splitlines()[-25:]))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_after_s = round(time.time() - self.launched_at, 2)
                        return self.ready_after_s
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s")

    def get_json(self, path: str, timeout_s: float = 10.0) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as r:
            return json.loads(r.read())

    def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as r:
            return r.read().decode(errors="replace")

    def flush_cache(self) -> str:
        """POST /flush_cache (SGLang refuses while requests are in flight); what it answered, for the record."""
        try:
            req = urllib.request.Request(self.url + "/flush_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                return f"{r.status}"
        except urllib.error.HTTPError as exc:
            return f"{exc.code}: {exc.read()[:200]!r}"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None:
            self.proc.stop(grace_s)


def derived_limits(info: dict) -> dict:
    """What SGLang derived (or was told): the fields of /server_info the cost model needs."""
    internal = (info.get("internal_states") or [{}])[0]
    graph = (info.get("cuda_graph_config") or {}).get("decode") or {}
    keys = ("mem_fraction_static", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
            "page_size", "context_length", "cuda_graph_max_bs", "cuda_graph_max_bs_decode",
            "disable_radix_cache", "attention_backend", "dtype", "kv_cache_dtype", "quantization",
            "tp_size", "dp_size", "pp_size", "ep_size", "enable_dp_attention", "disaggregation_mode")
    out = {k: info.get(k) for k in keys}
    out["cuda_graph_decode_max_bs"] = graph.get("max_bs")
    out["cuda_graph_decode_bs"] = graph.get("bs")
    out["effective_max_running_requests_per_dp"] = internal.get("effective_max_running_requests_per_dp")
    out["max_total_num_tokens"] = info.get("max_total_num_tokens") or internal.get("max_total_num_tokens")
    out["memory_usage_gb"] = internal.get("memory_usage")
    out["startup_time_s"] = internal.get("startup_time")
    out["version"] = info.get("version")
    return out
