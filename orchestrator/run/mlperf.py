"""`pd-orchestrator mlperf`: MLPerf LoadGen -> `RouterSUT` -> our router's `/generate`; LoadGen logs saved with the run.

LoadGen (`mlcommons-loadgen`, the `mlperf` extra) owns the schedule: Offline issues every query at once,
Server issues them at `--target-qps` (Poisson). `RouterSUT` turns each query into one `/generate` on an
asyncio loop in a background thread and reports completion (output token ids as int32, so LoadGen's
accuracy log holds the tokens) and, in Server mode, the first token for TTFT/TPOT constraints.
Samples: the ShareGPT sample by default, or a user's file (the MLPerf DeepSeek-R1 pandas pickle with
`tok_input` / `text_input`, or JSON of {"input_ids"|"text"} records).
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from orchestrator.api.client import abort_message, generate_body, merge_output_ids
from orchestrator.api.sse import json_events
from orchestrator.records import BenchRequest

ID_COLUMNS = ("tok_input", "input_ids", "input_tokens")
TEXT_COLUMNS = ("text_input", "text", "prompt", "input")
OUTPUT_LEN_COLUMNS = ("output_len", "max_output_len", "max_new_tokens", "tok_ref_output_len")


class MlperfError(ValueError):
    """Bad input to the LoadGen harness; the message names the file/flag and the fix."""


# ---------------------------------------------------------------------------------------------------------
# samples


def _records_from_json(data) -> list[dict]:
    if isinstance(data, list):
        return [r if isinstance(r, dict) else {"input_ids": r} for r in data]
    if isinstance(data, dict):
        # pandas `to_json` default (orient="columns"): {column: {row: value}}; or plain {column: [values]}
        columns = {k: (list(v.values()) if isinstance(v, dict) else list(v)) for k, v in data.items()}
        n = len(next(iter(columns.values()), []))
        return [{k: col[i] for k, col in columns.items()} for i in range(n)]
    raise MlperfError(f"dataset JSON must be a list of records or a column mapping, got {type(data).__name__}")


def _records_from_pickle(path: Path) -> list[dict]:
    try:
        with path.open("rb") as f:
            obj = pickle.load(f)
    except ModuleNotFoundError as exc:
        raise MlperfError(
            f"{path}: unpickling needs the module {exc.name!r} (the MLPerf dataset is a pandas DataFrame); "
            f"install it with `.venv/bin/pip install {exc.name}`"
        ) from None
    if hasattr(obj, "to_dict"):  # a pandas DataFrame
        return obj.to_dict(orient="records")
    return _records_from_json(obj)


def _first(record: dict, names: tuple[str, ...]):
    for name in names:
        value = record.get(name)
        if value is not None and not (isinstance(value, float) and np.isnan(value)):
            return value
    return None


def load_samples(
    path: str | Path, tokenizer=None, max_output_tokens: int = 1024, limit: int | None = None
) -> list[BenchRequest]:
    """Prompts from a pickle/JSON file; token ids from `tok_input`/`input_ids`, else text tokenized here."""
    path = Path(path)
    if not path.exists():
        raise MlperfError(f"--dataset {path}: no such file")
    if path.suffix in (".pkl", ".pickle"):
        records = _records_from_pickle(path)
    else:
        try:
            records = _records_from_json(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise MlperfError(f"--dataset {path}: not JSON ({exc}); give a .pkl or a .json file") from None
    samples: list[BenchRequest] = []
    for i, record in enumerate(records[:limit] if limit else records):
        ids = _first(record, ID_COLUMNS)
        text = _first(record, TEXT_COLUMNS)
        if ids is None and text is None:
            raise MlperfError(
                f"--dataset {path}: record {i} has none of {ID_COLUMNS + TEXT_COLUMNS}; keys are {sorted(record)}"
            )
        if ids is None:
            if tokenizer is None:
                from orchestrator.workload.tokenizer import load_tokenizer

                tokenizer = load_tokenizer(None)
            ids = tokenizer.encode(str(text))
        out_len = _first(record, OUTPUT_LEN_COLUMNS)
        samples.append(BenchRequest(index=i, input_ids=[int(t) for t in ids],
                                    output_len=int(out_len) if out_len else max_output_tokens,
                                    text=str(text) if text is not None else None))
    if not samples:
        raise MlperfError(f"--dataset {path}: no records")
    return samples


def default_samples(cfg, count: int) -> list[BenchRequest]:
    """The run's ShareGPT sample (benchmark.seed, benchmark.dataset_path), as `bench` draws it."""
    from orchestrator.workload.dataset import sample_sharegpt
    from orchestrator.workload.tokenizer import load_tokenizer

    prompts = sample_sharegpt(
        load_tokenizer(cfg.model.path if cfg else None), num_prompts=count,
        seed=cfg.benchmark.seed if cfg else 2025,
        dataset_path=cfg.benchmark.dataset_path if cfg else None,
        fixed_output_len=cfg.benchmark.fixed_output_len if cfg else None,
        context_len=cfg.benchmark.context_len if cfg else None,
    )
    return [p.to_request() for p in prompts]


# ---------------------------------------------------------------------------------------------------------
# system under test


@dataclass
class SutStats:
    """What the SUT saw, next to LoadGen's own summary."""

    issued: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    first_error: str | None = None
    errors: list[str] = field(default_factory=list)


class RouterSUT:
    """LoadGen system under test that forwards each query to the router as one `/generate`."""

    def __init__(self, url: str, samples: list[BenchRequest], stream: bool, max_in_flight: int,
                 timeout_s: float, headers: dict[str, str] | None = None):
        import mlperf_loadgen as lg

        self.lg = lg
        self.url = url.rstrip("/")
        self.samples = samples
        self.stream = stream  # Server scenario: stream, so the first token can be reported
        self.headers = headers or {}
        self.stats = SutStats()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mlperf-sut-loop", daemon=True)
        self._thread.start()
        self._max_in_flight = max_in_flight
        self._timeout_s = timeout_s
        # made on the SUT's loop: an aiohttp session belongs to the loop it was created in
        self._session, self._limit = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        self.sut = lg.ConstructSUT(self.issue_queries, self.flush_queries)
        self.qsl = lg.ConstructQSL(len(samples), len(samples), lambda _ids: None, lambda _ids: None)

    async def _open(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_in_flight),
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
        )
        return session, asyncio.Semaphore(self._max_in_flight)

    def issue_queries(self, query_samples) -> None:
        """LoadGen's callback: hand every query to the loop and return at once."""
        with self._lock:
            self.stats.issued += len(query_samples)
        for q in query_samples:
            asyncio.run_coroutine_threadsafe(self._serve(q.id, q.index), self._loop)

    def flush_queries(self) -> None:
        """Nothing is batched client-side, so there is nothing to flush."""

    async def _serve(self, query_id: int, sample_index: int) -> None:
        req = self.samples[sample_index]
        output_ids: list[int] = []
        error: str | None = None
        async with self._limit:
            try:
                if self.stream:
                    output_ids = await self._stream(query_id, req)
                else:
                    async with self._session.post(self.url + "/generate", json=generate_body(req, False),
                                                  headers=self.headers) as resp:
                        body = await resp.text()
                        if resp.status != 200:
                            raise RuntimeError(f"HTTP {resp.status}: {body[:300]}")
                        output_ids = list(json.loads(body).get("output_ids") or [])
            except Exception as exc:  # every query must be completed for LoadGen, failed or not
                error = f"{type(exc).__name__}: {exc}"
        self._complete(query_id, req, output_ids, error)

    async def _stream(self, query_id: int, req: BenchRequest) -> list[int]:
        ids: list[int] = []
        tokens = 0
        first_sent = False
        async with self._session.post(self.url + "/generate", json=generate_body(req, True),
                                      headers=self.headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
            async for chunk in json_events(resp.content.iter_any()):
                if "error" in chunk:  # the gateway's `event: error` (or SGLang's error event) ends a failed stream
                    raise RuntimeError(f"server error: {chunk['error']}")
                meta = chunk.get("meta_info", {})
                aborted = abort_message(meta)
                if aborted:
                    raise RuntimeError(aborted)
                new_total = int(meta.get("completion_tokens", tokens))
                ids = merge_output_ids(ids, chunk.get("output_ids") or [], new_total)
                if new_total > tokens and not first_sent:
                    first = np.asarray(ids[:1] or [0], dtype=np.int32)
                    self.lg.FirstTokenComplete(
                        [self.lg.QuerySampleResponse(query_id, first.ctypes.data, first.nbytes, 1)]
                    )
                    first_sent = True
                tokens = new_total
        return ids

    def _complete(self, query_id: int, req: BenchRequest, output_ids: list[int], error: str | None) -> None:
        with self._lock:
            if error is None:
                self.stats.completed += 1
                self.stats.input_tokens += req.prompt_len
                self.stats.output_tokens += len(output_ids)
            else:
                self.stats.failed += 1
                self.stats.first_error = self.stats.first_error or error
                if len(self.stats.errors) < 20:
                    self.stats.errors.append(error)
        tokens = np.asarray(output_ids, dtype=np.int32)
        # LoadGen reads the buffer during the call (accuracy log), so `tokens` only has to live until it returns
        response = self.lg.QuerySampleResponse(query_id, tokens.ctypes.data, tokens.nbytes, len(output_ids))
        self.lg.QuerySamplesComplete([response])

    def close(self) -> None:
        async def _close() -> None:
            await self._session.close()

        asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.lg.DestroyQSL(self.qsl)
        self.lg.DestroySUT(self.sut)


# ---------------------------------------------------------------------------------------------------------
# running LoadGen


@dataclass
class MlperfSettings:
    """The LoadGen knobs this command exposes (a user.conf can set any other)."""

    scenario: str = "Offline"  # Offline | Server
    mode: str = "PerformanceOnly"  # PerformanceOnly | AccuracyOnly
    offline_expected_qps: float = 1.0
    server_target_qps: float = 1.0
    server_ttft_latency_ms: float = 2000.0
    server_tpot_latency_ms: float = 80.0
    min_duration_ms: int = 60_000
    min_query_count: int = 1
    max_query_count: int = 0  # 0 = no cap
    user_conf: str | None = None
    model_name: str = "deepseek-r1"


def _test_settings(lg, s: MlperfSettings, total_samples: int):
    settings = lg.TestSettings()
    scenarios = {"Offline": lg.TestScenario.Offline, "Server": lg.TestScenario.Server}
    modes = {"PerformanceOnly": lg.TestMode.PerformanceOnly, "AccuracyOnly": lg.TestMode.AccuracyOnly}
    settings.scenario = scenarios[s.scenario]
    settings.mode = modes[s.mode]
    settings.offline_expected_qps = s.offline_expected_qps
    settings.server_target_qps = s.server_target_qps
    settings.min_duration_ms = s.min_duration_ms
    settings.min_query_count = s.min_query_count
    if s.max_query_count:
        settings.max_query_count = s.max_query_count
    settings.performance_sample_count_override = total_samples
    # LLM rules: results count tokens (n_tokens of each response); Server constrains TTFT and TPOT,
    # which the SUT reports through FirstTokenComplete
    settings.use_token_latencies = True
    if s.scenario == "Server":
        settings.ttft_latency = int(s.server_ttft_latency_ms * 1e6)
        settings.tpot_latency = int(s.server_tpot_latency_ms * 1e6)
    if s.user_conf:  # last, so a submission's user.conf wins over the command's defaults
        settings.FromConfig(s.user_conf, s.model_name, s.scenario)
    return settings


def parse_summary(path: Path) -> dict:
    """The key lines of mlperf_log_summary.txt ("Result is : VALID", "Tokens per second : …", …)."""
    wanted = ("Scenario", "Mode", "Result is", "Samples per second", "Tokens per second",
              "Completed samples per second", "Completed tokens per second", "Min duration satisfied",
              "Min queries satisfied", "Early stopping satisfied", "Performance constraints satisfied")
    found: dict = {}
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in wanted and key not in found:
            found[key] = value.strip()
    return found


def run_loadgen(url: str, samples: list[BenchRequest], settings: MlperfSettings, out_dir: Path,
                max_in_flight: int = 256, timeout_s: float = 3600.0, headers: dict | None = None,
                simulated: bool = False) -> dict:
    """Run one LoadGen test against `url`; LoadGen's logs and mlperf_run.json land in `out_dir`."""
    import mlperf_loadgen as lg

    if settings.scenario not in ("Offline", "Server"):
        raise MlperfError(f"--scenario must be Offline or Server, got {settings.scenario!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    sut = RouterSUT(url, samples, stream=settings.scenario == "Server", max_in_flight=max_in_flight,
                    timeout_s=timeout_s, headers=headers)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(out_dir)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False
    started = time.time()
    try:
        lg.StartTestWithLogSettings(sut.sut, sut.qsl, _test_settings(lg, settings, len(samples)), log_settings)
    finally:
        sut.close()
    wall_s = time.time() - started
    report = {
        "kind": "pd-orchestrator/mlperf/v1",
        "simulated": simulated,
        "url": url,
        "settings": asdict(settings),
        "num_samples": len(samples),
        "wall_s": wall_s,
        "sut": asdict(sut.stats),
        "sut_output_tokens_per_s": sut.stats.output_tokens / max(wall_s, 1e-9),
        "loadgen_summary": parse_summary(out_dir / "mlperf_log_summary.txt"),
        "logs": sorted(p.name for p in out_dir.glob("mlperf_log_*")),
    }
    (out_dir / "mlperf_run.json").write_text(json.dumps(report, indent=2))
    return report


# ---------------------------------------------------------------------------------------------------------
# command


