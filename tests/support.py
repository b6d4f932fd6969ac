"""What several test modules share: small sim configs, sim engine servers on loopback (one launcher), the
router's ingress on loopback, a sim scheduler, a mini ShareGPT file, closed-loop chat load on a gateway, and the case log the bad-input and fuzz
suites report into (printed once at the end of the session by conftest).

Fixtures live in conftest.py files; plain helpers live here, so no test module imports another one
(tests/test_layering.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterator

import httpx

from orchestrator.cluster.ports import free_port
from orchestrator.config import RunConfig, config_from_dict, dump_config, load_config
from orchestrator.records import Role
from orchestrator.transfer.nixl import load_nixl_api

HAVE_NIXL = load_nixl_api() is not None

REPO = Path(__file__).resolve().parents[1]

# SGLang 0.5.17's installed source: from the wheel scripts/dev-setup.sh downloads, else from the device's site
# archive where one was built (both git-ignored; their files are byte-identical)
SGLANG_SITE_ARCHIVE = REPO / ".device/site/site.tar.xz"
SGLANG_WHEELS = sorted((REPO / ".whl-sglang").glob("sglang-0.5.17-*.whl"))
HAVE_SGLANG_SOURCE = SGLANG_SITE_ARCHIVE.is_file() or bool(SGLANG_WHEELS)
NO_SGLANG_SOURCE = ("SGLang 0.5.17's source is not here: run scripts/dev-setup.sh (downloads its wheel to "
                    ".whl-sglang/) or build the device site archive")


def copy_sglang_source(targets, dest: Path) -> None:
    """Copy SGLang 0.5.17's files `targets` (paths like sglang/srt/...) under `dest`, keeping their paths."""
    import tarfile
    import zipfile

    # the wheel first: a zip reads one member directly, the .tar.xz decompresses everything before it
    archive: zipfile.ZipFile | tarfile.TarFile
    if SGLANG_WHEELS:
        archive, read = zipfile.ZipFile(SGLANG_WHEELS[0]), lambda a, t: a.read(t)
    else:
        archive, read = tarfile.open(SGLANG_SITE_ARCHIVE), lambda a, t: a.extractfile("./" + t).read()
    with archive:
        for target in targets:
            (dest / target).parent.mkdir(parents=True, exist_ok=True)
            (dest / target).write_bytes(read(archive, target))

# suite -> outcome -> cases: filled by the tests as they run, so the summary counts what really ran
CASE_LOG: dict[str, Counter] = defaultdict(Counter)


def run_device_script(script: Path, tmp_path: Path, *args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    """A scripts/device/ probe script run without a GPU: this interpreter as its PYTHON, its OUT and WORK_DIR under tmp_path."""
    full = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "WORK_DIR": str(tmp_path / "work"), **env}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, cwd=cwd, env=full)


def log_case(suite: str, outcome: str) -> None:
    """Count one case of `suite` (e.g. 'bad input: config', 'rejected with one line')."""
    CASE_LOG[suite][outcome] += 1


# ---- configs -----------------------------------------------------------------------------------------------------

def sim_config(overrides: dict | None = None, prefill: list[dict] | None = None, decode: list[dict] | None = None,
               tmp_dir: Path | None = None) -> RunConfig:
    """A small simulated PD config: cpu-fast profile, R1 shapes, 1 prefill + 1 decode TP1, free router port.

    `overrides` maps dotted keys to values (e.g. {"benchmark.num_prompts": 8}).
    """
    data: dict = {
        "name": "test",
        # cluster.gpu cpu-fast: the memory preflight checks the target GPU, and R1's own tokenizer
        # (the packaged fallback) must match the model's vocabulary
        "cluster": {"address": "local", "gpu": "cpu-fast", "gpus_per_node": 8, "num_nodes": 2},
        "model": {"preset": "DeepSeek-R1", "quantization": "w4a8"},
        "engine": {"kind": "sim", "sim": {"profile": "cpu-fast", "startup_s": 0.0, "time_scale": 1.0}},
        "layout": {"mode": "pd", "prefill": prefill or [{"count": 1, "tp": 1}],
                   "decode": decode or [{"count": 1, "tp": 1}]},
        "benchmark": {"num_prompts": 16, "deadline_s": 300, "warmup": {"policy": "none"},
                      "result_dir": str(tmp_dir or "runs")},
        "router": {"port": free_port()},
    }
    for key, value in (overrides or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config_from_dict(data, "tests/support.py")


FAST_SIM = ["engine.sim.profile=cpu-fast", "engine.sim.time_scale=0.05", "engine.sim.startup_s=0"]


def default_sim_config(tmp_path: Path, overrides: list[str] | None = None) -> RunConfig:
    """configs/default.yaml (the embedded 1P1D sim run) with the fast test profile and `--set` overrides."""
    path = tmp_path / "sim.yaml"
    path.write_text((REPO / "configs" / "default.yaml").read_text())
    return load_config(path, FAST_SIM + list(overrides or []))


def sim_engine_config(mode: str = "pd", kv_transfer: str = "auto", extra_args: tuple[str, ...] = (),
                      kv_payload: str = "sample") -> RunConfig:
    """sim_config for engine-level tests: R1 fp8 on H100-shaped TP8 servers, cpu-fast pace at time scale 0.05."""
    group = {"tp": 8, "extra_args": list(extra_args)}
    layout = {"mode": "pd", "prefill": [group], "decode": [group]} if mode == "pd" else {
        "mode": "aggregated", "aggregated": [group]}
    return sim_config({"cluster.gpu": "H100-SXM", "model.quantization": "fp8", "layout": layout,
                       "engine.sim.time_scale": 0.05, "engine.sim.kv_transfer": kv_transfer,
                       "engine.sim.kv_payload": kv_payload})


def config_file(cfg: RunConfig, tmp_path: Path, name: str = "sim.yaml") -> Path:
    """`cfg` written out in full, for commands that take --config."""
    path = tmp_path / name
    path.write_text(dump_config(cfg))
    return path


def mini_sharegpt(tmp_path: Path, conversations: int = 60) -> str:
    """A small ShareGPT-format file: enough distinct prompts for SGLang's random dataset in tests."""
    words = ("harbour lighthouse bakery market ferry island monastery cliffs birds teacher bees "
             "watercolour cinema storm roof carpenter road landslide fuel flour clinic battery").split()
    items = []
    for i in range(conversations):
        human = " ".join(words[(3 * i + k) % len(words)] for k in range(8 + i % 13))
        gpt = " ".join(words[(5 * i + k) % len(words)] for k in range(5 + i % 7))
        items.append({"id": str(i), "conversations": [{"from": "human", "value": f"Question {i}: {human}?"},
                                                      {"from": "gpt", "value": gpt}]})
    path = tmp_path / "mini_sharegpt.json"
    path.write_text(json.dumps(items))
    return str(path)


# ---- simulated engine servers on loopback, and a sim scheduler ---------------------------------------------------

class SimServer:
    """One simulated engine server launched from `cfg` as a worker launches it (backend build_launch ->
    EngineProcess), on free loopback ports; a prefill also gets a bootstrap port."""

    def __init__(self, cfg: RunConfig, role: Role, log_dir: Path, group=None):
        from orchestrator.engines.base import EngineProcess, WorkerPlacement
        from orchestrator.engines.registry import backend_for

        self.role = role
        group = group if group is not None else getattr(cfg.layout, role)[0]
        placement = WorkerPlacement(role=role, group_index=0, replica_index=0, host="127.0.0.1",
                                    advertise_host="127.0.0.1", port=free_port(),
                                    bootstrap_port=free_port() if role == "prefill" else None)
        launch = backend_for(cfg).build_launch(cfg, group, placement)
        self.url = launch.url
        self.bootstrap_port = launch.bootstrap_port
        self.proc = EngineProcess(launch, log_dir / f"{role}-{placement.port}.log")
        self.proc.start()

    def wait(self, timeout_s: float = 180) -> "SimServer":
        """Until /health answers (generous: the shared CI box can be heavily loaded)."""
        self.proc.wait_healthy(timeout_s)
        return self

    def stop(self) -> None:
        self.proc.stop(grace_s=2)

    def endpoint(self):
        """This server as the router's WorkerEndpoint (name sim-<role>)."""
        from orchestrator.records import WorkerEndpoint

        return WorkerEndpoint(role=self.role, name=f"sim-{self.role}", url=self.url,
                              bootstrap_host="127.0.0.1" if self.role == "prefill" else None,
                              bootstrap_port=self.bootstrap_port)


def start_servers(cfg: RunConfig, roles: list[Role], log_dir: Path) -> list[SimServer]:
    """One SimServer per role, started together, returned once all are healthy (stopped if one is not)."""
    servers = [SimServer(cfg, role, log_dir) for role in roles]
    try:
        return [s.wait() for s in servers]
    except BaseException:
        for s in servers:
            s.stop()
        raise


@contextlib.contextmanager
def sim_server(faults: dict | None = None, overrides: list[str] | None = None) -> Iterator[str]:
    """One aggregated (null-mode) sim server of the default config, launched as a worker launches it."""
    from orchestrator.config import WorkerGroup

    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        extra = [f"engine.sim.faults={json.dumps({'aggregated': faults})}"] if faults else []
        cfg = default_sim_config(Path(tmp), extra + list(overrides or []))
        server = SimServer(cfg, "aggregated", Path(tmp), group=WorkerGroup(tp=8))
        try:
            yield server.wait(60).url
        finally:
            server.stop()


@contextlib.contextmanager
def sim_pd_pair(cfg: RunConfig) -> Iterator[list]:
    """One sim prefill + one sim decode launched from `cfg` by the sim backend, as WorkerEndpoints."""
    with tempfile.TemporaryDirectory(prefix="sim-pd-") as tmp:
        servers = start_servers(cfg, ["prefill", "decode"], Path(tmp))
        try:
            yield [s.endpoint() for s in servers]
        finally:
            for s in servers:
                s.stop()


async def pd_generate(prefill: SimServer, decode: SimServer, body: dict,
                      timeout_s: float = 60) -> tuple[httpx.Response, httpx.Response]:
    """What mini_lb does: add bootstrap host/port/room, post the same body to both legs concurrently."""
    body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": random.randint(1, 2**63 - 1)}
    body.setdefault("rid", f"req-{random.getrandbits(48):x}")
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return tuple(await asyncio.gather(  # type: ignore[return-value]
            client.post(f"{prefill.url}/generate", json=body), client.post(f"{decode.url}/generate", json=body)))


def make_scheduler(max_running: int = 64, kv_tokens: int = 1_000_000, chunk: int = 8192, vocab: int | None = None,
                   eos: int = 1, role: Role = "aggregated"):
    """A started sim Scheduler with R1's cost model (and vocabulary, unless `vocab`) on the cpu-fast profile at
    time scale 0.01."""
    from orchestrator.config.model_presets import DEEPSEEK_R1
    from orchestrator.engines.sim.scheduler import Scheduler, SchedulerLimits
    from orchestrator.perfmodel.costmodel import EngineCostModel
    from orchestrator.perfmodel.gpus import GPU_SPECS

    cost = EngineCostModel(DEEPSEEK_R1, GPU_SPECS["cpu-fast"], tp=8)
    sched = Scheduler(cost, SchedulerLimits(max_running, kv_tokens, chunk, time_scale=0.01, role=role),
                      vocab or DEEPSEEK_R1.vocab_size, eos)
    sched.start()
    return sched


# ---- the router's ingress on loopback ----------------------------------------------------------------------------

class Ingress:
    """The router's ingress app for one RouterCore, served by uvicorn in a thread on a free loopback port."""

    def __init__(self, core):
        import uvicorn

        from orchestrator.router.http_app import build_http_app

        app = build_http_app()
        app.state.core = core
        self.core = core
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 20, 0.05, what="uvicorn serving the ingress")
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def router_core(endpoints, **router):
    """A RouterCore of an R1 sim config with `router` settings, following `endpoints`."""
    from orchestrator.router.core import RouterCore

    cfg = sim_config({"model": {"preset": "DeepSeek-R1", "quantization": "fp8"}, "router": router})
    core = RouterCore(cfg, run_id="test")
    core.follow(1, endpoints)
    return core


# ---- processes and polling ---------------------------------------------------------------------------------------

def process_tree(pid: int) -> list[int]:
    """`pid` and all its live descendants, from /proc (engines leave their parent's process group)."""
    from orchestrator.process import descendants

    return [pid, *descendants(pid)]


def pid_listening_on(port: int, candidates: list[int]) -> int | None:
    """Which of `candidates` listens on TCP `port` (e.g. the engine process behind a worker URL)."""
    from orchestrator.cluster.listening import listening_sockets

    return next((s.pid for s in listening_sockets(candidates) if s.port == port), None)


def cluster_pids(state) -> list[int]:
    """Every live process under a local cluster's `ray start` processes (raylets, workers, engines)."""
    return [pid for node in state.nodes for pid in process_tree(node.pid)]


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.25, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s:.0f}s (last: {value!r:.200})")
        time.sleep(poll_s)


def qwen3_sim_config(mode: str = "aggregated") -> RunConfig:
    """The 2026 model (qwen3-235b-a22b-fp8) on simulated H100 TP4 servers, context 8192, at time scale 0.05."""
    group = {"tp": 4, "ep": 4}
    layout = {"mode": "pd", "prefill": [group], "decode": [group]} if mode == "pd" else {
        "mode": "aggregated", "aggregated": [group]}
    return sim_config({"cluster.gpu": "H100-SXM", "model.preset": "qwen3-235b-a22b-fp8", "model.quantization": "fp8",
                       "model.context_length": 8192, "engine.sglang.mem_fraction_static": 0.9, "layout": layout,
                       "engine.sim.time_scale": 0.05})


def engine_metric(url: str, name: str) -> float | None:
    """Sum of one metric over its label sets on an engine's /metrics; None once the engine is gone."""
    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def sim_engines_finished(doc: dict, role: str) -> int:
    """Requests a run's sim `role` engines finished and did not abort, by each engine's last log line (the sim
    server logs its own tally when it stops): an independent count of what the run's result.json must keep."""
    logs = {name: where.split(":", 1)[1] for name, where in doc["metadata"]["engine_logs"].items()
            if name.startswith(role)}
    assert logs, f"no {role} engine logs in {doc['metadata']['engine_logs']}"
    total = 0
    for name, path in logs.items():
        tally = [line for line in Path(path).read_text().splitlines() if "stopped: " in line]
        assert tally, f"{name}: the engine logged no final tally in {path}"
        counts = re.search(r"(\d+) requests finished, (\d+) of them aborted", tally[-1])
        assert counts, f"{name}: its final tally line is not the engine's: {tally[-1]!r}"
        finished, aborted = counts.groups()
        total += int(finished) - int(aborted)
    return total


def assert_one_live_change(status: dict, layouts: tuple[str, str], removed_name: str, added_name: str,
                           context: str) -> None:
    """`serve status` recorded exactly one P:D change from layouts[0] to layouts[1]: `removed_name` retired and drained
    with nothing cut off, `added_name` admitted after its one pair warm-up and nothing else (`context`: for
    messages, e.g. the apply's output)."""
    (change,) = status["changes"]
    assert (change["from"], change["to"]) == layouts, change
    (removed,) = change["removed"]
    assert removed["name"] == removed_name and removed["cut_off"] == 0, context
    assert removed["requests_at_drained"] >= removed["requests_at_retire"], removed
    (added,) = change["added"]
    assert added["name"] == added_name and len(added["pair_warmups"]) == 1, added
    assert added["requests_before_admission"] == 1, context


class ChatLoad:
    """Closed-loop streamed chats through the gateway; every request ends completed (all its tokens, [DONE]) or
    failed with its reason."""

    def __init__(self, gateway: str, users: int, tokens: int = 32):
        self.gateway = gateway
        self.tokens = tokens
        self.stop = threading.Event()
        self.completed = 0
        self.failed: list[str] = []
        self.threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]

    def _user(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                try:
                    events = []
                    with client.stream("POST", f"{self.gateway}/v1/chat/completions", json={
                            "messages": [{"role": "user", "content": "Count the stars."}], "max_tokens": self.tokens,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
                        if r.status_code != 200:
                            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
                        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                    usage = json.loads(events[-2])["usage"]
                    if events[-1] != "[DONE]" or usage["completion_tokens"] != self.tokens:
                        raise RuntimeError(f"incomplete stream: {events[-2:]}")
                    self.completed += 1
                except Exception as exc:
                    self.failed.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> "ChatLoad":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


class Prom:
    """Prometheus HTTP API calls the dashboards would make (query_range's step: the tests' 0.25 s scrape interval)."""

    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params: dict[str, str | float] = {"query": expr, **({"time": at} if at is not None else {})}
        body = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10).json()
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 0.25) -> list[dict]:
        params: dict[str, str | float] = {"query": expr, "start": start, "end": end, "step": step}
        body = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=10).json()
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        result = self.query(expr, at)
        return float(result[0]["value"][1]) if result else None
