"""SimBackend: the command line and environment of one simulated server, as the orchestrator launches it."""

from __future__ import annotations

import json

from orchestrator.config import config_from_dict
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.registry import backend_for
from orchestrator.engines.sim.backend import supported_extra_args
from orchestrator.engines.sim.settings import add_server_args, settings_from_args


def config(**sim):
    return config_from_dict({
        "engine": {"kind": "sim", "sim": {"profile": "cpu-fast", **sim}},
        "layout": {"mode": "pd",
                   "prefill": [{"tp": 4, "chunked_prefill_size": 4096,
                                "extra_args": ["--enable-dp-lm-head", "--waiting-timeout-s=30"]}],
                   "decode": [{"name": "dec", "tp": 8, "dp": 2, "dp_attention": True, "max_running_requests": 64}]},
    })


def placement(role: str, **kw) -> WorkerPlacement:
    return WorkerPlacement(role=role, group_index=0, replica_index=1, host="127.0.0.1",
                           advertise_host="10.0.0.5", port=31000, **kw)


def parsed(argv: list[str]):
    import argparse

    p = argparse.ArgumentParser()
    add_server_args(p)
    return settings_from_args(p.parse_args(argv[3:]))


def test_prefill_launch_is_a_sim_server_with_sglang_flags():
    cfg = config(time_scale=0.5)
    launch = backend_for(cfg).build_launch(cfg, cfg.layout.prefill[0], placement("prefill", bootstrap_port=8999))
    assert launch.argv[1:3] == ["-m", "orchestrator.engines.sim.server"]
    s = parsed(launch.argv)
    assert (s.mode, s.spec.parallel.tp, s.bootstrap_port, s.time_scale, s.profile) == ("prefill", 4, 8999, 0.5, "cpu-fast")
    assert s.spec.batching.chunked_prefill_size == 4096 and s.timeouts.waiting_timeout_s == 30
    assert "--enable-dp-lm-head" not in launch.argv  # an SGLang flag the simulator has no use for
    assert launch.url == "http://10.0.0.5:31000" and launch.bootstrap_port == 8999
    assert launch.env["UCX_NET_DEVICES"] == "lo"
    assert launch.worker_name == "prefill-0/1"


def test_decode_launch_carries_parallelism_and_limits():
    cfg = config()
    launch = backend_for(cfg).build_launch(cfg, cfg.layout.decode[0], placement("decode"))
    s = parsed(launch.argv)
    p = s.spec.parallel
    assert (s.mode, p.tp, p.dp, p.dp_attention, s.spec.batching.max_running_requests) == ("decode", 8, 2, True, 64)
    assert launch.bootstrap_port is None


def test_faults_are_picked_by_worker_name_then_group_then_role():
    cfg = config(faults={"dec/1": {"error_rate": 0.5}, "prefill": {"hang": "transfer"}})
    d = backend_for(cfg).build_launch(cfg, cfg.layout.decode[0], placement("decode"))
    p = backend_for(cfg).build_launch(cfg, cfg.layout.prefill[0], placement("prefill", bootstrap_port=1))
    assert json.loads(parsed(d.argv).faults) == {"error_rate": 0.5}
    assert json.loads(parsed(p.argv).faults) == {"hang": "transfer"}


def test_extra_args_filter_keeps_flag_values_together():
    assert supported_extra_args(["--x", "1", "--tp-size", "2", "--flag", "--max-running-requests=9"]) == [
        "--tp-size", "2", "--max-running-requests=9"]


def test_sim_decode_waits_for_kv_as_long_as_real_sglang_is_given():
    """One PdTimeouts for both engines: a quarter of the deadline, within [30 s, 300 s] (105 s for 420 s)."""
    cfg = config()
    s = parsed(backend_for(cfg).build_launch(cfg, cfg.layout.decode[0], placement("decode")).argv)
    assert (s.timeouts.waiting_timeout_s, s.timeouts.bootstrap_timeout_s) == (105, 105)  # SGLang's env gets "105"
    short = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"deadline_s": 60})})
    s = parsed(backend_for(short).build_launch(short, short.layout.decode[0], placement("decode")).argv)
    assert s.timeouts.waiting_timeout_s == 30
