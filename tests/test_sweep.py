"""Concurrency sweep: arguments, per-level metrics, table/plot/JSON outputs, and the accuracy gate stopping it."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchestrator.cli import main
from orchestrator.cluster.ports import free_port
from orchestrator.config import RunConfig, load_config
from orchestrator.run import sweep
from orchestrator.run.accuracy import AccuracyGateSpec

# ------------------------------------------------------------------------------------------ helpers
# Shared with test_accuracy.py and test_mlperf.py: real sim servers on loopback, a small ShareGPT file.

REPO = Path(__file__).resolve().parents[1]
FAST_SIM = ["engine.sim.profile=cpu-fast", "engine.sim.time_scale=0.05", "engine.sim.startup_s=0"]


def sim_config(tmp_path: Path, overrides: list[str] | None = None, path_only: bool = False) -> RunConfig | Path:
    """The embedded default with the fast test profile (and any overrides), or its path for the CLI."""
    lines = (REPO / "configs" / "default.yaml").read_text()
    path = tmp_path / "sim.yaml"
    path.write_text(lines)
    cfg = load_config(path, FAST_SIM + list(overrides or []))
    if path_only:
        from orchestrator.config import dump_config

        path.write_text(dump_config(cfg))
        return path
    return cfg


@contextlib.contextmanager
def sim_server(faults: dict | None = None) -> Iterator[str]:
    """One aggregated (null-mode) sim server, launched exactly as a worker would launch it."""
    from orchestrator.config import WorkerGroup
    from orchestrator.engines.base import EngineProcess, WorkerPlacement
    from orchestrator.engines.registry import backend_for

    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        extra = [f"engine.sim.faults={json.dumps({'aggregated': faults})}"] if faults else []
        cfg = sim_config(Path(tmp), extra)
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


# ------------------------------------------------------------------------------------------ tests


def test_pairs_and_levels_parse():
    assert sweep.parse_pairs("1024/1024, 8192/1024") == [(1024, 1024), (8192, 1024)]
    assert sweep.parse_concurrencies("4,8,16") == [4, 8, 16]


@pytest.mark.parametrize("text", ["1024", "1024/", "a/b", "0/16", ""])
def test_bad_pair_names_the_flag_and_form(text):
    with pytest.raises(sweep.SweepError, match="--isl-osl.*ISL/OSL|at least one"):
        sweep.parse_pairs(text)


@pytest.mark.parametrize("text", ["4,x", "0", ""])
def test_bad_levels_name_the_flag(text):
    with pytest.raises(sweep.SweepError, match="--concurrency"):
        sweep.parse_concurrencies(text)


def test_gpu_count_covers_every_group(tmp_path):
    cfg = sim_config(tmp_path, ["layout.prefill.0.count=2", "layout.prefill.0.tp=4", "layout.decode.0.tp=8"])
    assert sweep.gpu_count(cfg) == 2 * 4 + 8


def test_default_prompts_per_level_is_ten_times_concurrency():
    plan = sweep.SweepPlan(pairs=[(8, 8)], concurrencies=[4])
    assert plan.prompts_for(4) == 40
    assert sweep.SweepPlan(pairs=[(8, 8)], concurrencies=[4], num_prompts_per_level=3).prompts_for(4) == 3


@pytest.fixture(scope="module")
def clean():
    with sim_server() as url:
        yield url


def _plan(dataset: str) -> sweep.SweepPlan:
    return sweep.SweepPlan(pairs=[(48, 12), (96, 6)], concurrencies=[1, 4], range_ratio=0.5,
                           num_prompts_per_level=6, warmup=2, dataset_path=dataset)


def test_sweep_reports_every_level_of_every_pair(clean, tmp_path):
    cfg = sim_config(tmp_path)
    out = tmp_path / "out"
    report = sweep.run_sweep(cfg, clean, _plan(mini_sharegpt(tmp_path)), AccuracyGateSpec(mode="off"), out,
                             log=lambda *_: None)
    assert report["aborted"] is None and report["simulated"] is True
    assert report["num_gpus"] == sweep.gpu_count(cfg)
    saved = json.loads((out / "sweep.json").read_text())
    assert [(p["isl"], p["osl"]) for p in saved["pairs"]] == [(48, 12), (96, 6)]
    for pair in saved["pairs"]:
        assert [lvl["concurrency"] for lvl in pair["levels"]] == [1, 4]
        for lvl in pair["levels"]:
            assert lvl["completed"] == 6 and lvl["failed"] == 0
            # range_ratio 0.5: every output length lies in [osl/2, osl], so does the total
            assert 6 * pair["osl"] // 2 <= lvl["total_output_tokens"] <= 6 * pair["osl"]
            assert lvl["output_throughput_per_gpu"] == pytest.approx(lvl["output_throughput"] / report["num_gpus"])
            for stat in ("ttft", "tpot", "itl", "e2e"):
                assert lvl[stat]["median_ms"] is not None and lvl[stat]["median_ms"] > 0
            assert lvl["ttft"]["median_ms"] <= lvl["e2e"]["median_ms"]
        table = (out / f"sweep_{pair['isl']}x{pair['osl']}.md").read_text()
        assert "SIMULATED" in table and table.count("\n| ") == 3  # header + one row per level
        assert (out / f"sweep_{pair['isl']}x{pair['osl']}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accuracy_gate_stops_sweep_when_sim_corrupts_outputs(clean, tmp_path):
    with sim_server(faults={"corrupt_rate": 1.0}) as corrupt:
        out = tmp_path / "gated"
        rc = main(["sweep", "--config", str(sim_config(tmp_path, path_only=True)), "--url", corrupt,
                   "--isl-osl", "48/12", "--concurrency", "2", "--num-prompts-per-level", "4", "--warmup", "0",
                   "--dataset-path", mini_sharegpt(tmp_path), "--accuracy", "token-match",
                   "--accuracy-reference", clean, "--out", str(out)])
    assert rc == 1
    report = json.loads((out / "sweep.json").read_text())
    assert report["accuracy_gate"]["passed"] is False
    assert report["aborted"].startswith("accuracy gate failed")
    assert report["pairs"] == [] and not list(out.glob("sweep_*"))


def test_same_command_runs_when_outputs_are_right(clean, tmp_path):
    out = tmp_path / "ok"
    rc = main(["sweep", "--config", str(sim_config(tmp_path, path_only=True)), "--url", clean,
               "--isl-osl", "48/12", "--concurrency", "2", "--num-prompts-per-level", "4", "--warmup", "0",
               "--dataset-path", mini_sharegpt(tmp_path), "--accuracy", "token-match",
               "--accuracy-reference", clean, "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["accuracy_gate"]["passed"] is True and len(report["pairs"]) == 1


# ------------------------------------------------------------------------------------------ through the PD router
# The router's ingress app (uvicorn on loopback, as Serve wraps it) in front of one sim prefill + one sim
# decode: the gate compares PD output with an aggregated sim server's, token for token.

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


@pytest.fixture(scope="module")
def pd_cfg(tmp_path_factory) -> RunConfig:
    from tests.conftest import sim_config as pd_sim_config

    return pd_sim_config(tmp_dir=tmp_path_factory.mktemp("pd"))


@pytest.fixture(scope="module")
def pd_workers(pd_cfg):
    with sim_pd_pair(pd_cfg) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def pd_router(pd_cfg, pd_workers):
    from orchestrator.router.core import RouterCore
    from tests.test_router_http import Ingress

    core = RouterCore(pd_cfg, run_id="sweep-test")
    core.follow(1, pd_workers)
    ingress = Ingress(core)
    yield ingress.url
    ingress.stop()


def _decode_faults(workers, spec: dict) -> None:
    import httpx

    decode = next(e for e in workers if e.role == "decode")
    httpx.post(f"{decode.url}/sim/faults", json=spec, timeout=10).raise_for_status()


def test_sweep_through_pd_router_after_pd_equals_aggregated(pd_cfg, pd_router, tmp_path):
    plan = sweep.SweepPlan(pairs=[(48, 12)], concurrencies=[2], num_prompts_per_level=4, warmup=1,
                           dataset_path=mini_sharegpt(tmp_path))
    gate = AccuracyGateSpec(num_prompts=4, max_new_tokens=8)  # auto -> token-match vs a local aggregated sim
    report = sweep.run_sweep(pd_cfg, pd_router, plan, gate, tmp_path / "out", log=lambda *_: None)
    assert report["accuracy_gate"]["passed"], report["accuracy_gate"]["detail"]
    assert report["accuracy_gate"]["metrics"]["reference"] == "local aggregated sim server"
    (level,) = report["pairs"][0]["levels"]
    assert level["completed"] == 4 and level["ttft"]["median_ms"] > 0


def test_gate_stops_sweep_through_pd_router_when_decode_corrupts(pd_cfg, pd_router, pd_workers, tmp_path):
    plan = sweep.SweepPlan(pairs=[(48, 12)], concurrencies=[2], num_prompts_per_level=4, warmup=0,
                           dataset_path=mini_sharegpt(tmp_path))
    _decode_faults(pd_workers, {"corrupt_rate": 1.0})
    try:
        report = sweep.run_sweep(pd_cfg, pd_router, plan, AccuracyGateSpec(num_prompts=4, max_new_tokens=8),
                                 tmp_path / "out", log=lambda *_: None)
    finally:
        _decode_faults(pd_workers, {})
    assert report["accuracy_gate"]["passed"] is False
    assert report["aborted"].startswith("accuracy gate failed: 4/4 prompts differ")
    assert report["pairs"] == []


# ------------------------------------------------------------------------------------------ whole deployment on Ray


@pytest.mark.ray
def test_sweep_brings_up_the_config_deployment_without_url(ray_driver, make_sim_config, tmp_path):
    from orchestrator.config import dump_config

    config = tmp_path / "deploy.yaml"
    config.write_text(dump_config(make_sim_config()))
    out = tmp_path / "deployed"
    rc = main(["sweep", "--config", str(config), "--isl-osl", "48/12", "--concurrency", "2",
               "--num-prompts-per-level", "4", "--warmup", "1", "--dataset-path", mini_sharegpt(tmp_path),
               "--accuracy-prompts", "3", "--accuracy-tokens", "6", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "sweep.json").read_text())
    assert report["accuracy_gate"]["passed"] is True
    assert report["url"].startswith("http://127.0.0.1:")
    assert report["pairs"][0]["levels"][0]["completed"] == 4
