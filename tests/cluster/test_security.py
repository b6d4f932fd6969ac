"""Security: every service of ours listens on loopback unless configured, the ingress API key is enforced,
and secrets never reach the run manifest or the logs.

Listening sockets are read from /proc (the kernel's own table, mapped to processes by socket inode), so
the checks see exactly what a port scan from another machine would find, for exactly the processes we
started: the local cluster's `ray start` trees and the engine processes under them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cluster.listening import ListeningSocket, listening_sockets
from orchestrator.cluster.local import LocalClusterState
from tests.support import cluster_pids, pid_listening_on, process_tree


# ---- the local embedded cluster -------------------------------------------------------------------------


@pytest.mark.ray
def test_local_cluster_listens_only_on_loopback(ray_cluster: LocalClusterState) -> None:
    sockets = listening_sockets(cluster_pids(ray_cluster))
    assert sockets, "found no listening sockets under the local cluster's processes; is /proc readable?"
    exposed = [str(s) for s in sockets if not s.loopback_only]
    print(f"local cluster: {len(sockets)} listening sockets, {len(exposed)} not on loopback")
    assert not exposed, (
        "the local embedded cluster must bind loopback only (cluster.local.bind_host=127.0.0.1), but:\n  "
        + "\n  ".join(exposed)
    )


# ---- a deployment: engines, bootstrap servers, router ingress and exporter ----------------------------

API_KEY_ENV = "PDO_SECURITY_TEST_API_KEY"
API_KEY = "key-" + "7f3a9c1e5b"  # a made-up test key


@pytest.fixture
def keyed_deployment(ray_driver, make_sim_config):
    """1P1D sim workers and a router whose ingress requires an API key (the key only in the router's env).

    `deploy()` cannot hand the router an environment, and the session cluster started before this test
    could export the key, so the router gets it the way a job would: the replica's runtime_env.
    """
    from ray import serve
    from ray.serve.api import RunTarget

    from deployments.app import ROUTER_APP, build_worker_apps, expected_workers, start_serve
    from deployments.router import PDRouter

    cfg = make_sim_config(overrides={"name": "security", "router.api_key_env": API_KEY_ENV,
                                     "metrics.exporter_port": 0})
    run_id = "security-test"
    start_serve(cfg)
    router_app = PDRouter.options(
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": {API_KEY_ENV: API_KEY}}}
    ).bind(cfg, run_id)
    targets = [*build_worker_apps(cfg, run_id), RunTarget(target=router_app, name=ROUTER_APP, route_prefix="/")]
    try:
        serve.run_many(targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=True)
        router = serve.get_app_handle(ROUTER_APP)
        endpoints = router.wait_ready.remote(expected_workers(cfg), 120).result(timeout_s=150)
        yield cfg, router, endpoints
    finally:
        serve.shutdown()


@pytest.mark.ray
def test_every_service_of_a_run_listens_on_loopback(ray_driver, keyed_deployment) -> None:
    cfg, router, endpoints = keyed_deployment
    from urllib.parse import urlsplit

    pids = cluster_pids(ray_driver)
    sockets = listening_sockets(pids)
    by_port = {s.port: s for s in sockets}
    ours: list[tuple[str, ListeningSocket]] = []

    proxy = by_port.get(cfg.router.port)
    assert proxy is not None, f"nothing of the cluster listens on router.port={cfg.router.port}"
    ours.append(("router HTTP ingress (Serve proxy)", proxy))

    exporter = router.metrics_address.remote().result(timeout_s=30)
    assert exporter, "the router runs no metrics exporter"
    ours.append(("router metrics exporter", by_port[int(exporter.rsplit(":", 1)[1])]))

    for e in endpoints:
        engine_pid = pid_listening_on(urlsplit(e.url).port, pids)
        assert engine_pid is not None, f"no process listens on {e.url} ({e.name})"
        # every socket of the engine process: HTTP, bootstrap server, KV transfer agents
        for s in listening_sockets(process_tree(engine_pid)):
            ours.append((f"engine {e.name}", s))

    for what, s in ours:
        print(f"  {what}: {s.host}:{s.port}")
    exposed = [f"{what}: {s}" for what, s in ours if not s.loopback_only]
    assert not exposed, "services of ours must listen on loopback unless configured:\n  " + "\n  ".join(exposed)

    # and nothing else of the cluster either, now that Serve's controller, proxies and replicas run
    # (a Serve replica's own inter-deployment gRPC server binds [::] unless the setup hook moves it)
    anything = [str(s) for s in sockets if not s.loopback_only]
    print(f"cluster with a deployment: {len(sockets)} listening sockets, {len(anything)} not on loopback")
    assert not anything, "the local cluster must listen on loopback only:\n  " + "\n  ".join(anything)


@pytest.mark.ray
def test_router_ingress_requires_the_api_key(keyed_deployment) -> None:
    import httpx

    cfg, _router, _endpoints = keyed_deployment
    url = f"http://{cfg.router.host}:{cfg.router.port}"
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}
    with httpx.Client(base_url=url, timeout=60) as http:
        missing = http.post("/v1/completions", json=body)
        wrong = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        right = http.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert missing.status_code == 401, missing.text
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    assert API_KEY not in missing.text  # the error names where the key lives, never the key
    assert wrong.status_code == 401, wrong.text
    assert right.status_code == 200, right.text
    assert right.json()["usage"]["completion_tokens"] == 2


# ---- secrets in the run manifest and the logs ----------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf_" + "SeCrEt0123456789",
    "PD_GRAFANA_PASSWORD": "pw-" + "SeCrEt9876",
    "PD_ROUTER_API_KEY": "rk-" + "SeCrEt5555",
}
CONFIG_SECRET = "cfg-" + "SeCrEt4242"  # a token put in the config (transfer.env), as users do


@pytest.mark.ray
def test_secrets_never_reach_the_result_json_or_the_logs(ray_driver, make_sim_config, tmp_path) -> None:
    import subprocess
    import sys

    from orchestrator.config import dump_config

    cfg = make_sim_config(overrides={"name": "secrets", "benchmark.num_prompts": 8,
                                     "transfer.env": {"HF_TOKEN": CONFIG_SECRET}})
    config_path = tmp_path / "secrets.yaml"
    config_path.write_text(dump_config(cfg))
    result_dir = tmp_path / "results"
    env = {**os.environ, **SECRETS, "RAY_ADDRESS": ray_driver.gcs_address}
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "--config", str(config_path), "--result-dir", str(result_dir)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    [result_path] = result_dir.glob("*/result.json")
    manifest = result_path.read_text()
    doc = json.loads(manifest)
    engine_logs = [Path(w["log_path"]) for w in doc["metadata"]["workers"] if w.get("log_path")]
    assert engine_logs, "result.json links no engine logs"

    places = {"result.json": manifest, "bench output": output}
    places.update({f"engine log {p.name}": p.read_text(errors="replace") for p in engine_logs if p.exists()})
    leaks = [f"{name} in {place}" for place, text in places.items()
             for name, value in [*SECRETS.items(), ("transfer.env.HF_TOKEN", CONFIG_SECRET)] if value in text]
    print(f"checked {len(places)} places for {len(SECRETS) + 1} secrets")
    assert not leaks, "secrets leaked:\n  " + "\n  ".join(leaks)
    env_seen = doc["metadata"]["env"]
    assert env_seen.get("HF_TOKEN") == "<redacted>", "the run's secret-named env vars are listed, redacted"


# ---- where engines listen on a real (multi-node) cluster -------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "engine", "transfer", "expected"),
    [
        ({"address": "local", "local": {"bind_host": "127.0.0.1"}}, {}, {}, ("127.0.0.1", "127.0.0.1")),
        ({"address": "10.1.0.1:6379"}, {}, {}, ("10.1.0.7", "10.1.0.7")),
        ({"address": "10.1.0.1:6379"}, {}, {"host_ip": "192.168.50.7"}, ("192.168.50.7", "192.168.50.7")),
        ({"address": "10.1.0.1:6379"}, {"bind_host": "0.0.0.0"}, {}, ("0.0.0.0", "10.1.0.7")),
    ],
    ids=["local-loopback", "cluster-node-ip", "cluster-transfer-host-ip", "cluster-all-interfaces-when-configured"],
)
def test_engines_listen_on_the_configured_address_never_all_interfaces_by_default(cluster, engine, transfer, expected):
    from orchestrator.config import config_from_dict
    from orchestrator.engines.base import engine_addresses

    layout = {"mode": "pd", "prefill": [{"tp": 1}], "decode": [{"tp": 1}]}
    cfg = config_from_dict({"cluster": cluster, "engine": engine, "transfer": transfer, "layout": layout}, "test")
    assert engine_addresses(cfg, node_ip="10.1.0.7") == expected


# ---- Ray token auth on a cluster we start --------------------------------------------------------------


@pytest.mark.ray
def test_token_auth_cluster_admits_only_drivers_and_job_clients_with_the_token(tmp_path) -> None:
    """RAY_AUTH_MODE=token in the user's environment carries into the local cluster `cluster up` starts
    (our `disabled` default does not override it), and only clients holding the token get in."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    token = "pdo-test-" + "3b9e" * 8  # a made-up token
    user_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    state_path = tmp_path / "token-cluster.json"

    def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
        full = {k: v for k, v in {**user_env, **env}.items() if v}
        return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=240, cwd=repo)

    cli = [sys.executable, "-m", "orchestrator", "cluster"]
    up = run([*cli, "up", "--local", "--state", str(state_path)])
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    try:
        state = LocalClusterState.load(state_path)
        assert state is not None
        attach = ("import ray, sys; from orchestrator.cluster.connect import init_driver; init_driver(sys.argv[1]); "
                  "print('alive nodes:', sum(n['Alive'] for n in ray.nodes()))")
        driver = [sys.executable, "-c", attach, state.gcs_address]
        job_list = [str(Path(sys.executable).parent / "ray"), "job", "list", "--address", state.dashboard_url]
        clients = {
            "cluster up": up,
            "driver with the token": run(driver),
            "driver without a token": run(driver, RAY_AUTH_TOKEN=""),
            "driver with a wrong token": run(driver, RAY_AUTH_TOKEN="pdo-wrong-" + "0" * 32),
            "job client with the token": run(job_list),
            "job client without a token": run(job_list, RAY_AUTH_TOKEN=""),
        }
    finally:
        down = run([*cli, "down", "--state", str(state_path)])
    assert down.returncode == 0, down.stderr[-2000:]
    for what, r in clients.items():
        print(f"TOKEN AUTH {what}: exit {r.returncode}")
        assert token not in r.stdout + r.stderr, f"{what}: the token was echoed"
    assert "RAY_AUTH_MODE=token" in up.stdout, up.stdout
    assert clients["driver with the token"].returncode == 0, clients["driver with the token"].stderr[-2000:]
    assert "alive nodes: 2" in clients["driver with the token"].stdout
    assert clients["job client with the token"].returncode == 0, clients["job client with the token"].stderr[-2000:]
    for refused in ("driver without a token", "driver with a wrong token", "job client without a token"):
        assert clients[refused].returncode != 0, f"{refused} got in:\n{clients[refused].stdout}"
    assert "AuthenticationError" in clients["driver without a token"].stderr
