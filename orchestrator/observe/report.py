"""Run report: SGLang's "Offline Throughput Benchmark Result" block, our lines after it, and result.json.

The block reproduces `sglang.bench_offline_throughput` (0.5.17) line for line: `{:<40} {:<10}` rows,
floats as `{:<10.2f}`, a leading blank line, duration = the measured run only, total input = sum of
client-side prompt lengths, total output = sum of server-reported completion tokens, "Successful
requests" = completed requests.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from orchestrator.config.benchmark import inter_token_latency_s
from orchestrator.records import RequestResult
from orchestrator.stats import percentile

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE|AUTH)", re.I)
_DURATION = re.compile(r"\d+(\.\d+)?s\b")
ENV_PREFIXES = ("RAY_", "SGLANG_", "UCX_", "NCCL_", "NIXL_", "CUDA_", "HF_", "PD_", "OMP_")


@dataclass
class ThroughputSummary:
    """The numbers of SGLang's block, computed from per-request results exactly as SGLang does."""

    backend: str
    successful_requests: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    last_gen_throughput: float

    @classmethod
    def from_results(
        cls, results: list[RequestResult], duration_s: float, backend: str = "engine", last_gen_throughput: float = 0.0
    ) -> "ThroughputSummary":
        done = [r for r in results if r.status == "ok"]
        return cls(
            backend=backend,
            successful_requests=len(done),
            duration_s=duration_s,
            total_input_tokens=sum(r.prompt_len for r in done),
            total_output_tokens=sum(r.completion_tokens for r in done),
            last_gen_throughput=last_gen_throughput,
        )

    def _rate(self, count: float) -> float:
        return count / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        return self._rate(self.successful_requests)

    @property
    def input_throughput(self) -> float:
        return self._rate(self.total_input_tokens)

    @property
    def output_throughput(self) -> float:
        return self._rate(self.total_output_tokens)

    @property
    def total_throughput(self) -> float:
        return self._rate(self.total_input_tokens + self.total_output_tokens)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "request_throughput": self.request_throughput,
            "input_throughput": self.input_throughput,
            "output_throughput": self.output_throughput,
            "total_throughput": self.total_throughput,
        }


TOTAL_THROUGHPUT_LABEL = "Total token throughput (tok/s):"


def total_throughputs(text: str) -> list[float]:
    """The total tok/s of each result block (ours or SGLang's, `result_block`) in a log, in order."""
    return [float(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith(TOTAL_THROUGHPUT_LABEL)]


def result_block(s: ThroughputSummary) -> str:
    """SGLang's printed block, byte for byte (trailing spaces of the 10-wide fields included)."""
    rows = [
        "\n{s:{c}^{n}}".format(s=" Offline Throughput Benchmark Result ", n=50, c="="),
        "{:<40} {:<10}".format("Backend:", s.backend),
        "{:<40} {:<10}".format("Successful requests:", s.successful_requests),
        "{:<40} {:<10.2f}".format("Benchmark duration (s):", s.duration_s),
        "{:<40} {:<10}".format("Total input tokens:", s.total_input_tokens),
        "{:<40} {:<10}".format("Total generated tokens:", s.total_output_tokens),
        "{:<40} {:<10.2f}".format("Last generation throughput (tok/s):", s.last_gen_throughput),
        "{:<40} {:<10.2f}".format("Request throughput (req/s):", s.request_throughput),
        "{:<40} {:<10.2f}".format("Input token throughput (tok/s):", s.input_throughput),
        "{:<40} {:<10.2f}".format("Output token throughput (tok/s):", s.output_throughput),
        "{:<40} {:<10.2f}".format(TOTAL_THROUGHPUT_LABEL, s.total_throughput),
        "=" * 50,
    ]
    return "\n".join(rows)


LATENCIES = (  # key, label, unit shown; TPOT as bench_serving: (e2e - ttft) / (completion_tokens - 1)
    ("ttft", "TTFT", "s"),
    ("tpot", "TPOT", "ms"),
    ("kv_wait", "KV wait", "s"),
    ("e2e", "E2E latency", "s"),
)
PERCENTILES = (50, 90, 99)


def _field(r, name: str):
    return r.get(name) if isinstance(r, dict) else getattr(r, name, None)


def tpot_s(r) -> float | None:
    """Time per output token after the first: bench_serving's TPOT, AIPerf's inter_token_latency (one definition,
    config/benchmark.py's inter_token_latency_s); None below 2 tokens or without a TTFT."""
    ttft, e2e, tokens = _field(r, "ttft_s"), _field(r, "e2e_s"), _field(r, "completion_tokens") or 0
    if ttft is None or e2e is None:
        return None
    return inter_token_latency_s(ttft, e2e, tokens)


@dataclass
class LatencySummary:
    """Mean and p50/p90/p99 in seconds of TTFT, TPOT, KV wait and e2e over the completed prompts.

    A metric without samples (KV wait of an aggregated run, every metric of a run with no completed
    prompt) has count 0 and None values.
    """

    stats: dict[str, dict[str, float | None]]

    @classmethod
    def from_results(cls, results: Iterable) -> "LatencySummary":
        ok = [r for r in results if _field(r, "status") == "ok"]
        samples = {
            "ttft": [_field(r, "ttft_s") for r in ok],
            "tpot": [tpot_s(r) for r in ok],
            "kv_wait": [_field(r, "kv_wait_s") for r in ok],
            "e2e": [_field(r, "e2e_s") for r in ok],
        }
        stats = {}
        for key, values in samples.items():
            xs = [float(v) for v in values if v is not None]
            stats[key] = {"count": len(xs), "mean": sum(xs) / len(xs) if xs else None,
                          **{f"p{q}": percentile(xs, q) if xs else None for q in PERCENTILES}}
        return cls(stats)

    def get(self, key: str, stat: str) -> float | None:
        return self.stats.get(key, {}).get(stat)

    def text(self, key: str) -> str:
        """'p50 / p90 / p99' in the metric's display unit, '-' without samples."""
        unit = next(u for k, _, u in LATENCIES if k == key)
        scale = 1000.0 if unit == "ms" else 1.0
        values = [v for q in PERCENTILES if (v := self.get(key, f"p{q}")) is not None]
        if len(values) < len(PERCENTILES):
            return "-"
        return " / ".join(f"{v * scale:.{1 if unit == 'ms' else 3}f}" for v in values)

    def lines(self) -> list[str]:
        q = "/".join(f"p{q}" for q in PERCENTILES)
        return ["{:<40} {:<10}".format(f"{label} {q} ({unit}):", self.text(key)) for key, label, unit in LATENCIES]

    def to_dict(self) -> dict:
        return {key: dict(values, unit="s") for key, values in self.stats.items()}


@dataclass
class PhaseTime:
    """One phase of the run, seconds from job start (simulated seconds for a time-scaled sim)."""

    name: str
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class RunVerdict:
    """Deadline verdict and the lines we print after SGLang's block."""

    engine: str  # e.g. "sim (SIMULATED, profile H100-SXM)" or "sglang"
    layout: str
    deadline_s: float
    total_s: float
    phases: list[PhaseTime]
    num_prompts: int
    completed: int
    failed: int
    reason: str | None = None  # why the run is INVALID, if it is
    time_note: str | None = None
    failure_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.reason is None and self.total_s <= self.deadline_s and self.completed == self.num_prompts

    @property
    def verdict(self) -> str:
        return "VALID" if self.valid else "INVALID"

    def why_invalid(self) -> str | None:
        if self.valid:
            return None
        if self.reason:
            return self.reason
        if self.total_s > self.deadline_s:
            return f"took {self.total_s:.1f}s, over the {self.deadline_s:.0f}s deadline"
        return f"{self.failed} of {self.num_prompts} prompts failed"


def our_lines(v: RunVerdict, latency: LatencySummary | None = None, rules: dict | None = None) -> str:
    rows = [
        "{:<40} {:<10}".format("Engine:", v.engine),
        "{:<40} {:<10}".format("Layout:", v.layout),
        "{:<40} {:<10}".format("Prompts completed / failed / total:", f"{v.completed} / {v.failed} / {v.num_prompts}"),
    ]
    if latency is not None:
        rows += latency.lines()
    for phase in v.phases:
        rows.append(
            "{:<40} {:<10}".format(
                f"Phase {phase.name} (s):", f"{phase.duration_s:.2f}  [{phase.start_s:.2f} -> {phase.end_s:.2f}]"
            )
        )
    rows.append("{:<40} {:<10}".format("Total incl. load + warm-up (s):", f"{v.total_s:.2f} of {v.deadline_s:.0f}"))
    for reason, count in sorted(v.failure_reasons.items(), key=lambda kv: -kv[1])[:5]:
        rows.append("{:<40} {:<10}".format("Failed:", f"{count} x {reason}"))
    if v.time_note:
        rows.append(v.time_note)
    verdict = v.verdict if v.valid else f"INVALID: {(v.why_invalid() or '').splitlines()[0]}"
    rows.append("{:<40} {:<10}".format("Deadline verdict:", verdict))
    if rules:
        rows += rules_lines(rules)
    return "\n".join(rows)


def rules_lines(rules: dict) -> list[str]:
    """The run's verdict against its rules profile (orchestrator.rules.RulesVerdict.to_dict()): one line per violation."""
    if rules.get("error"):
        return ["{:<40} {:<10}".format(f"Rules {rules['profile']}:", f"not checked: {rules['error']}")]
    broken = rules.get("violations") or []
    state = "compliant" if not broken else f"NOT COMPLIANT ({len(broken)} violation{'s' if len(broken) > 1 else ''})"
    return ["{:<40} {:<10}".format(f"Rules {rules['profile']}:", state)] + [
        f"  {b['field']}={b['value']!r}: {b['rule']}; {b['fix']}" for b in broken
    ]


def failure_reasons(results: list[RequestResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        if r.status != "ok":
            # "no answer within 222.5s" differs per request; group by the message with times blanked
            key = _DURATION.sub("<t>s", (r.error or "unknown error").splitlines()[0])[:120]
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---- metadata ---------------------------------------------------------------------------------


def redacted_config(data):
    """The config dump with secret-looking string values (e.g. transfer.env.HF_TOKEN) replaced.

    Keys ending in `_env` name a variable that holds a secret, not the secret, and are kept.
    """
    if isinstance(data, dict):
        return {
            k: "<redacted>"
            if isinstance(v, str) and SECRET_NAME.search(str(k)) and not str(k).endswith("_env")
            else redacted_config(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redacted_config(v) for v in data]
    return data


RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # a Ray job's config, with its runtime_env's env_vars


def _redacted_job_config(value: str) -> str:
    """A Ray job's config JSON with every runtime_env env_vars value (any may be a secret) redacted."""
    try:
        config = json.loads(value)
        env_vars = config["runtime_env"].get("env_vars") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return "<redacted>"
    config["runtime_env"]["env_vars"] = {name: "<redacted>" for name in env_vars}
    return json.dumps(config, sort_keys=True)


def redacted_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Run-relevant environment variables, with any secret-looking value replaced by '<redacted>'."""
    env = os.environ if environ is None else environ
    out = {}
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIXES):
            continue
        if name == RAY_JOB_CONFIG_ENV:
            out[name] = _redacted_job_config(value)
            continue
        out[name] = "<redacted>" if SECRET_NAME.search(name) else value
    return out


def git_sha(repo: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo or Path(__file__).resolve().parents[2],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("pd-orchestrator", "ray", "sglang", "nixl", "pydantic"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def write_result_json(path: Path, document: dict) -> Path:
    """Write atomically, so a crash mid-write never leaves a truncated result.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str))
    tmp.replace(path)
    return path

