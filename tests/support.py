"""What several test modules share: small sim configs, a sim server on loopback, a mini ShareGPT file, and
the case log the bad-input and fuzz suites report into (printed once at the end of the session by conftest).

Fixtures live in conftest.py; plain helpers live here, so no test module imports another one.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.cluster.ports import free_port
from orchestrator.config import RunConfig, config_from_dict, dump_config, load_config

REPO = Path(__file__).resolve().parents[1]

# suite -> outcome -> cases: filled by the tests as they run, so the summary counts what really ran
CASE_LOG: dict[str, Counter] = defaultdict(Counter)


def log_case(suite: str, outcome: str) -> None:
    """Count one case of `suite` (e.g. 'bad input: config', 'rejected with one line')."""
    CASE_LOG[suite][outcome] += 1


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


def config_file(cfg: RunConfig, tmp_path: Path, name: str = "sim.yaml") -> Path:
    """`cfg` written out in full, for commands that take --config."""
    path = tmp_path / name
    path.write_text(dump_config(cfg))
    return path


@contextlib.contextmanager
def sim_server(faults: dict | None = None, overrides: list[str] | None = None) -> Iterator[str]:
    """One aggregated (null-mode) sim server of the default config, launched as a worker launches it."""
    from orchestrator.config import WorkerGroup
    from orchestrator.engines.base import EngineProcess, WorkerPlacement
    from orchestrator.engines.registry import backend_for

    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        extra = [f"engine.sim.faults={json.dumps({'aggregated': faults})}"] if faults else []
        cfg = default_sim_config(Path(tmp), extra + list(overrides or []))
        placement = WorkerPlacement(role="aggregated", group_index=0, replica_index=0, host="127.0.0.1",
                                    advertise_host="127.0.0.1", port=free_port())
        launch = backend_for(cfg).build_launch(cfg, WorkerGroup(tp=8), placement)
        proc = EngineProcess(launch, Path(tmp) / "sim.log")
        proc.start()
        try:
            proc.wait_healthy(timeout_s=60)
            yield launch.url
        finally:
            proc.stop()


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


@contextlib.contextmanager
def sim_pd_pair(cfg: RunConfig) -> Iterator[list]:
    """One sim prefill + one sim decode launched from `cfg` by the sim backend, as WorkerEndpoints."""
    from orchestrator.engines.base import EngineProcess, WorkerPlacement
    from orchestrator.engines.registry import backend_for
    from orchestrator.records import WorkerEndpoint

    with tempfile.TemporaryDirectory(prefix="sim-pd-") as tmp:
        procs, endpoints = [], []
        try:
            for role in ("prefill", "decode"):
                group = getattr(cfg.layout, role)[0]
                placement = WorkerPlacement(role=role, group_index=0, replica_index=0, host="127.0.0.1",
                                            advertise_host="127.0.0.1", port=free_port(),
                                            bootstrap_port=free_port() if role == "prefill" else None)
                launch = backend_for(cfg).build_launch(cfg, group, placement)
                proc = EngineProcess(launch, Path(tmp) / f"{role}.log")
                proc.start()
                procs.append(proc)
                endpoints.append(WorkerEndpoint(role=role, name=f"sim-{role}", url=launch.url,
                                                bootstrap_host="127.0.0.1" if role == "prefill" else None,
                                                bootstrap_port=launch.bootstrap_port))
            for proc in procs:
                proc.wait_healthy(timeout_s=60)
            yield endpoints
        finally:
            for proc in procs:
                proc.stop()


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.25, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s:.0f}s")
        time.sleep(poll_s)
