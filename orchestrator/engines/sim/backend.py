"""Sim engine backend: the command line of one simulated SGLang server (orchestrator.engines.sim.server) per worker.

(RunConfig, WorkerGroup, WorkerPlacement) -> EngineLaunch(argv=[python, -m, orchestrator.engines.sim.server,
sim flags..., ServerSpec.to_sim_argv()..., the group's extra_args the simulator knows])
"""

from __future__ import annotations

import argparse
import json
import sys

from orchestrator.config import RunConfig, WorkerGroup
from orchestrator.engines.base import EngineBackend, EngineLaunch, WorkerPlacement
from orchestrator.records import Role
from orchestrator.transfer.env import transport_env


def worker_name(role: Role, group: WorkerGroup, placement: WorkerPlacement) -> str:
    """'<group name>/<replica>', group name defaulting to '<role>-<group index>' (e.g. 'prefill-0/1')."""
    return f"{group.name or f'{role}-{placement.group_index}'}/{placement.replica_index}"


def faults_for(cfg: RunConfig, role: Role, group: WorkerGroup, placement: WorkerPlacement) -> dict | None:
    """engine.sim.faults entry for this worker: by worker name, then group name, then role."""
    faults = cfg.engine.sim.faults
    for key in (worker_name(role, group, placement), group.name or f"{role}-{placement.group_index}", role):
        if key in faults:
            return faults[key]
    return None


def _sim_server_options() -> set[str]:
    from orchestrator.engines.sim.settings import add_server_args

    parser = argparse.ArgumentParser(add_help=False)
    add_server_args(parser)
    return {opt for action in parser._actions for opt in action.option_strings}


def supported_extra_args(extra_args: list[str]) -> list[str]:
    """The group's extra SGLang flags the simulator understands (e.g. --chunked-prefill-size); others dropped."""
    known = _sim_server_options()
    kept: list[str] = []
    i = 0
    while i < len(extra_args):
        arg = extra_args[i]
        takes_value = "=" not in arg and i + 1 < len(extra_args) and not extra_args[i + 1].startswith("--")
        if arg.split("=", 1)[0] in known:
            kept.extend(extra_args[i : i + (2 if takes_value else 1)])
        i += 2 if takes_value else 1
    return kept


class SimBackend(EngineBackend):
    """EngineBackend for engine.kind=sim: one simulated server process models a whole (multi-node) server."""

    name = "sim"

    def build_launch(self, cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement) -> EngineLaunch:
        sim = cfg.engine.sim
        role = placement.role
        bootstrap_port = placement.bootstrap_port or cfg.transfer.bootstrap_port
        argv = [
            sys.executable, "-m", "orchestrator.engines.sim.server",
            "--host", placement.host,
            "--port", str(placement.port),
            "--disaggregation-bootstrap-port", str(bootstrap_port),
            "--served-model-name", cfg.model.name,
            "--quantization", cfg.model.quantization,
            "--profile", cfg.sim_profile,
            "--time-scale", repr(sim.time_scale),
            "--efficiency-prefill", repr(sim.efficiency_prefill),
            "--efficiency-decode", repr(sim.efficiency_decode),
            "--kv-transfer", sim.kv_transfer,
            "--kv-payload", sim.kv_payload,
            "--kv-sample-bytes", str(sim.kv_sample_bytes),
            # two local raylets share 127.0.0.1: the node role tells the cost model which link KV crosses, unless the
            # cluster is one machine (cluster.one_machine: NVLink between every server, as the planner prices it)
            "--sim-node", placement.node_ip if cfg.cluster.one_machine else f"{placement.node_ip}/{cfg.node_role(role, group)}",
        ]
        if cfg.model.preset:
            argv += ["--model-preset", cfg.model.preset]
        if cfg.model.path:
            argv += ["--model-path", cfg.model.path]
        if cfg.model.context_length:
            argv += ["--context-length", str(cfg.model.context_length)]
        if cfg.cluster.gpu_memory_gb and cfg.sim_profile == cfg.cluster.gpu:
            argv += ["--gpu-memory-gb", repr(cfg.cluster.gpu_memory_gb)]
        if sim.startup_s is not None:
            argv += ["--startup-s", repr(sim.startup_s)]
        faults = faults_for(cfg, role, group, placement)
        if faults:
            argv += ["--faults", json.dumps(faults)]
        # the server's SGLang flags as the real server gets them, + the sim-only ones (version, PD waits): the
        # simulated server parses them back into the same ServerSpec and builds the planner's cost model from it
        argv += self.server_spec(cfg, role, group).to_sim_argv()
        argv += supported_extra_args(group.extra_args)

        # the same UCX/NIXL variables as a real server (transfer.ucx.tls, net_devices, ...): KV moves the
        # way the config says; on one machine UCX would otherwise pick shared memory (cma) over the network
        env = {"PYTHONUNBUFFERED": "1", **transport_env(cfg)}
        return EngineLaunch(
            argv=argv,
            env=env,
            url=f"http://{placement.advertise_host}:{placement.port}",
            role=role,
            bootstrap_port=bootstrap_port if role == "prefill" else None,
            bootstrap_url=f"http://{placement.advertise_host}:{bootstrap_port}" if role == "prefill" else None,
            worker_name=worker_name(role, group, placement),
        )
