"""Concurrency sweep: arguments, per-level metrics, table/plot/JSON outputs, and the accuracy gate stopping it."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.run import sweep
from orchestrator.run.accuracy import AccuracyGateSpec
from tests.support import config_file, default_sim_config, mini_sharegpt, sim_server

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
    cfg = default_sim_config(tmp_path, ["layout.prefill.0.count=2", "layout.prefill.0.tp=4", "layout.decode.0.tp=8"])
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


@pytest.mark.slow
def test_sweep_reports_every_level_of_every_pair(clean, tmp_path):
    cfg = default_sim_config(tmp_path)
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


@pytest.mark.slow
def test_accuracy_gate_stops_sweep_when_sim_corrupts_outputs(clean, tmp_path):
    with sim_server(faults={"corrupt_rate": 1.0}) as corrupt:
        out = tmp_path / "gated"
        rc = main(["sweep", "--config", str(config_file(default_sim_config(tmp_path), tmp_path)), "--url", corrupt,
                   "--isl-osl", "48/12", "--concurrency", "2", "--num-prompts-per-level", "4", "--warmup", "0",
                   "--dataset-path", mini_sharegpt(tmp_path), "--accuracy", "token-match",
                   "--accuracy-reference", clean, "--out", str(out)])
    assert rc == 1
    report = json.loads((out / "sweep.json").read_text())
    assert report["accuracy_gate"]["passed"] is False
    assert report["aborted"].startswith("accuracy gate failed")
    assert report["pairs"] == [] and not list(out.glob("sweep_*"))


@pytest.mark.slow
def test_same_command_runs_when_outputs_are_right(clean, tmp_path):
    # no --accuracy-reference: the gate starts its own aggregated sim server (another process, other ports) and
    # compares `clean`'s greedy tokens with that one's, so the gate passes only if two servers agree
    out = tmp_path / "ok"
    rc = main(["sweep", "--config", str(config_file(default_sim_config(tmp_path), tmp_path)), "--url", clean,
               "--isl-osl", "48/12", "--concurrency", "2", "--num-prompts-per-level", "4", "--warmup", "0",
               "--dataset-path", mini_sharegpt(tmp_path), "--accuracy", "token-match", "--out", str(out)])
    report = json.loads((out / "sweep.json").read_text())
    gate = report["accuracy_gate"]
    assert rc == 0, gate
    assert gate["passed"] is True and gate["metrics"]["reference"] == "local aggregated sim server"
    assert len(report["pairs"]) == 1


# ------------------------------------------------------------------------------------------ through the PD router
# The router's ingress app (uvicorn on loopback, as Serve wraps it) in front of one sim prefill + one sim
# decode: the gate compares PD output with an aggregated sim server's, token for token.

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
