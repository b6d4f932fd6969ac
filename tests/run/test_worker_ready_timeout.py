"""deployments/worker on a Ray cluster: a real-SGLang replica waits for its engine as long as engine_ready_timeout says
(the job's start-up budget, unless engine.sglang.startup_timeout_s sets another) and one that runs out of it ends in
the one-line error naming the timeout's source, the phase the engine's log shows and the field to raise.

The engine is a stand-in for SGLang's interpreter (engine.sglang.python): a script that logs SGLang's weight-loading
line and never answers, so the worker's own path (argv, process, readiness polling, log phase) runs for real."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest
import ray
from ray import serve

from deployments.app import deploy, worker_groups
from orchestrator.cluster.registry import WorkersFailedToStart, get_registry
from orchestrator.plan.closedloop.startup_budget import TIMEOUT_FIELD, startup_budget
from orchestrator.run.deployment import Deployment
from tests.support import sim_config, wait_until

pytestmark = pytest.mark.ray

NEVER_READY_SGLANG = """#!/bin/sh
# SGLang's interpreter as the worker calls it: `-c` (its version probe) finds no sglang; anything else is the server,
# which logs SGLang's weight-loading line and never answers
case "$1" in -c) exit 1 ;; esac
echo "[2026-11-28 00:00:00] Load weight begin. avail mem=79.10 GB"
exec /bin/sleep 600
"""


def _sglang_config(tmp_path: Path, overrides: dict | None = None):
    fake = tmp_path / "python-never-ready"
    fake.write_text(NEVER_READY_SGLANG)
    fake.chmod(0o755)
    return sim_config({"engine.kind": "sglang", "engine.sglang.python": str(fake),
                       "engine.sglang.compile_cache_dir": str(tmp_path / "cc"), **(overrides or {})}, tmp_dir=tmp_path)


def _workers_info(cfg) -> list[dict]:
    infos = []
    for spec in worker_groups(cfg):
        handle = serve.get_deployment_handle(spec.deployment, app_name=spec.app_name)
        infos.append(handle.endpoint_info.remote().result(timeout_s=30))
    return infos


def _stop_workers(cfg) -> None:
    """Serve deletes each worker application (a replica's __del__ stops its engine), then Serve goes."""
    for spec in worker_groups(cfg):
        serve.delete(spec.app_name)
    serve.shutdown()
    ray.get(get_registry().clear.remote())


def test_a_real_engine_replica_waits_the_start_up_budget_and_a_set_timeout_ends_in_one_line(
        ray_driver, clean_serve, tmp_path):
    # unset engine.sglang.startup_timeout_s: each running replica holds the config's whole start-up budget
    cfg = _sglang_config(tmp_path)
    budget = startup_budget(cfg)
    deploy(cfg, f"ready-budget-{uuid.uuid4().hex[:6]}", timeout_s=120, with_router=False)
    infos = _workers_info(cfg)
    assert sorted(i["role"] for i in infos) == ["decode", "prefill"]
    for info in infos:
        assert not info["ready"] and info["error"] is None
        assert info["ready_timeout_s"] == budget.total_s
        assert info["ready_timeout_source"].startswith(f"the start-up budget {budget.total_s:g} s (Ray bring-up")
    _stop_workers(cfg)

    # a small timeout set: the engine, still loading weights by its log, outlives it and the replica says so in one line
    cfg = _sglang_config(tmp_path, {"engine.sglang.startup_timeout_s": 3})
    deploy(cfg, f"ready-timeout-{uuid.uuid4().hex[:6]}", timeout_s=120, with_router=False)
    infos = wait_until(lambda: [i for i in _workers_info(cfg) if i["error"]] or None, timeout_s=60,
                       what="a replica's start-up error")
    for info in infos:
        line = info["error"]
        assert "\n" not in line and not info["ready"] and info["ready_timeout_s"] == 3
        assert line == (f"{info['name']}: engine not ready after 3 s, {TIMEOUT_FIELD} 3 s; it was loading weights "
                        f"(log {info['log_path']}); raise {TIMEOUT_FIELD} (--set {TIMEOUT_FIELD}=SECONDS)")
    _stop_workers(cfg)


def test_the_driver_s_wait_for_the_workers_ends_on_the_replica_s_one_line_not_at_its_deadline(
        ray_driver, clean_serve, tmp_path):
    # what bench, prepare and serve wait on: the router's readiness wait, through the driver's Deployment. A replica
    # that runs out of its ready timeout reports its line, and the wait ends with it (before: it polled on until the
    # job's deadline, then said only "workers not ready ... see the engine logs")
    cfg = _sglang_config(tmp_path, {"engine.sglang.startup_timeout_s": 3})
    run_id = f"ready-driver-{uuid.uuid4().hex[:6]}"
    deploy(cfg, run_id, timeout_s=120)
    deadline_s = 600
    started = time.monotonic()
    with pytest.raises(WorkersFailedToStart) as failed:
        Deployment(cfg, run_id, time.time() + deadline_s).wait_ready()
    waited_s = time.monotonic() - started
    message = str(failed.value)
    print(f"wait ended after {waited_s:.1f} s of a {deadline_s} s deadline: {message}")
    assert "\n" not in message and waited_s < deadline_s
    one_line = (rf"[^\s:;]+: engine not ready after 3 s, {re.escape(TIMEOUT_FIELD)} 3 s; it was loading "
                rf"weights \(log [^)]+\); raise {re.escape(TIMEOUT_FIELD)} \(--set {re.escape(TIMEOUT_FIELD)}=SECONDS\)")
    assert re.fullmatch(rf"{one_line}(; {one_line})*", message), message
    _stop_workers(cfg)
