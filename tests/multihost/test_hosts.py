"""The product across two real hosts: network namespaces node-a (head, role prefill) and node-b (role
decode) with their own addresses, a client host that submits the benchmark with `ray job submit`, Ray
token auth on every node and client, the simulated engines binding and advertising their node's address,
and NIXL/UCX moving KV between the namespaces over TCP on the veth (`transfer.ucx.net_devices: eth0`).

Tests run in file order on one session cluster: the lab itself, the cluster, a reference run (with the
socket census, the API key and the secrets checked while and after it runs), then `serve` across the hosts
(tests/multihost/test_hosts_serve.py), then the faults (tests/multihost/test_link_faults.py).
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.transfer.preflight import parse_ucx_transports
from tests.multihost.benchjob import (API_KEY, API_KEY_ENV, EXPORTER_PORT, REPO, BenchJob, census, engine_pids,
                                      engine_urls, held_by, host_config, process_line, router_pids)
from tests.multihost.lab import HostCluster

pytestmark = pytest.mark.ray


def test_hosts_reach_each_other_and_nothing_outside_the_lab(lab) -> None:
    a, b = lab.hosts["node-a"], lab.hosts["node-b"]
    server = lab.call("node-b", socket.create_server, (b.ip, 0))
    port = server.getsockname()[1]
    try:
        conn = lab.call("node-a", socket.create_connection, (b.ip, port), 5)
        assert conn.getsockname()[0] == a.ip, "node-a reached node-b from another address than its own"
        conn.close()
    finally:
        server.close()
    with pytest.raises(OSError) as unreachable:  # no route out of the lab (addresses outside 198.18.0/24)
        lab.call("node-a", socket.create_connection, ("192.0.2.1", 80), 2)
    assert "unreachable" in str(unreachable.value).lower()
    root = Path("/proc/net/fib_trie").read_text()
    assert a.ip not in root and b.ip not in root, "lab addresses leaked into the machine's own namespace"


def test_each_raylet_runs_on_its_own_host_and_only_token_holders_get_in(hosts: HostCluster) -> None:
    lab = hosts.lab
    attach = ("import ray, json, sys; ray.init(sys.argv[1], log_to_driver=False); "
              "print(json.dumps(sorted((n['NodeManagerAddress'], n['Labels'].get('role')) "
              "for n in ray.nodes() if n['Alive'])))")
    driver = [sys.executable, "-c", attach, hosts.state.gcs_address]
    ok = lab.run("client", driver, env=hosts.env(), timeout_s=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    nodes = json.loads(ok.stdout.strip().splitlines()[-1])
    assert nodes == [[lab.hosts["node-a"].ip, "prefill"], [lab.hosts["node-b"].ip, "decode"]]

    refused = lab.run("client", driver, env=hosts.env(with_token=False), timeout_s=120)
    assert refused.returncode != 0 and "AuthenticationError" in refused.stderr, refused.stderr[-1000:]
    jobs = lab.run("client", [str(Path(sys.executable).parent / "ray"), "job", "list", "--address",
                              hosts.state.dashboard_url], env=hosts.env(with_token=False), timeout_s=120)
    assert jobs.returncode != 0, "a job client without the token listed the cluster's jobs"
    for r in (ok, refused, jobs):
        assert hosts.token not in r.stdout + r.stderr


def test_a_driver_on_a_host_attaches_to_that_hosts_raylet(hosts: HostCluster) -> None:
    """Both raylets are in the machine's one process table, where Ray looks for "local" raylets (and then
    prefers the head's): a driver on node-b must still get node-b's raylet, or it advertises the head's
    address and replies to it are lost. The client host has no raylet: Ray's own choice stands."""
    lab = hosts.lab
    probe = [sys.executable, "-c", "from orchestrator.cluster.connect import own_node_ip; print(own_node_ip())"]
    seen = {role: lab.run(role, probe, cwd=REPO, timeout_s=60).stdout.strip()
            for role in ("node-a", "node-b", "client")}
    assert seen == {"node-a": lab.hosts["node-a"].ip, "node-b": lab.hosts["node-b"].ip, "client": "None"}


PREFLIGHT_RATE_MBIT = 200.0  # 25 MB/s: 8 MiB of KV per transfer takes ~0.3 s


def test_fabric_preflight_measures_the_shaped_link(hosts: HostCluster, tmp_path) -> None:
    """`pd-orchestrator preflight --mode ray` run on node-a (a driver needs a raylet on its own host) with
    node-b's link shaped by tc tbf: NIXL/UCX writes KV pages prefill -> decode over tcp/eth0 between the
    hosts, and the report gives the GB/s it measured next to the configured link rate
    (transfer.expected_link_gb_s = the tbf rate). Unshaped, this veth moves GB/s: a rate inside the band
    shows the bytes crossed the shaped link."""
    from orchestrator.config import dump_config
    from orchestrator.transfer.nixl import NIXL_MISSING, load_nixl_api

    if load_nixl_api() is None:
        pytest.skip(NIXL_MISSING)
    lab = hosts.lab
    rate_gb_s = PREFLIGHT_RATE_MBIT / 8 / 1000
    cfg = host_config(hosts, tmp_path, name="preflight", overrides={"transfer.expected_link_gb_s": rate_gb_s})
    config_path = tmp_path / "preflight.yaml"
    config_path.write_text(dump_config(cfg))
    report_path = tmp_path / "preflight.json"
    lab.shape("node-b", PREFLIGHT_RATE_MBIT)
    try:
        done = lab.run("node-a", [sys.executable, "-m", "orchestrator", "preflight", "--config", str(config_path),
                                  "--mode", "ray", "--memory", "cpu", "--mib", "8", "--iterations", "4",
                                  "--timeout-s", "60", "--json", str(report_path)],
                       env=hosts.env(), cwd=REPO, timeout_s=240)
    finally:
        lab.unshape("node-b")
    print(f"PREFLIGHT across node-b's link shaped to {PREFLIGHT_RATE_MBIT:g} Mbit/s:\n{done.stdout}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    a, b = lab.hosts["node-a"].ip, lab.hosts["node-b"].ip
    assert report["prefill"]["node_ip"] == a and report["decode"]["node_ip"] == b
    assert report["bytes_verified"] and report["link_kind"] == "network, host memory"
    assert report["transports"] and all("inter-node" in t and "tcp/eth0" in t for t in report["transports"])
    assert report["expected_link_gb_s"] == pytest.approx(rate_gb_s)
    ratio = report["best_gb_s"] / rate_gb_s
    assert 0.5 <= ratio <= 1.1, f"measured {report['best_gb_s']:.4f} GB/s = {ratio:.2f} x the shaped {rate_gb_s} GB/s"
    assert f"expected link (network, host memory): {rate_gb_s:.3g} GB/s -> best is" in done.stdout


def test_bench_job_from_the_client_runs_across_hosts(hosts: HostCluster, tmp_path) -> None:
    """The reference run: VALID, engines on their node's address, KV over TCP on eth0, the router on the node
    router.host names (node-b, not the head), and meanwhile the census of listeners per host and the
    router's API key.

    The census names processes, not only port numbers: each host is its own port space, and a port an engine
    took on node-b may be taken on node-a by an unrelated process (it happened: Ray's dashboard agent, which
    listens on its node's address and on 127.0.0.1, had the decode's number on node-a)."""
    from orchestrator.cluster.ports import free_port

    lab = hosts.lab
    a, b = lab.hosts["node-a"].ip, lab.hosts["node-b"].ip
    # the router ingress on node-b's address (its replica must run there, not on the head, to bind it), on a
    # port free there: a number picked in the test's own namespace says nothing about node-b's ports
    cfg = host_config(hosts, tmp_path, name="hosts",
                      overrides={"router.host": b, "router.port": lab.call("node-b", free_port, b)})
    job = BenchJob(hosts, cfg, tmp_path, extra_env={API_KEY_ENV: API_KEY})
    try:
        job.wait_measuring()
        sockets = {role: census(lab, role) for role in ("node-a", "node-b", "client")}
        engines = {role: engine_pids(lab, role) for role in ("node-a", "node-b")}
        engine_at = {role: engine_urls(lab, role) for role in ("node-a", "node-b")}
        routers = {role: router_pids(lab, role) for role in ("node-a", "node-b")}
        drivers = {role: set(pids) for role, pids in job.driver_pids().items()}
        titles = {pid: process_line(pid) for role in ("node-a", "node-b") for pid in {s.pid for s in sockets[role]}}
        router_host = next((role for role, pids in routers.items() if pids), "node-b")
        ingress = f"http://{lab.hosts[router_host].ip}:{cfg.router.port}/v1/completions"
        body = {"model": cfg.model.name, "prompt": [1, 2, 3], "max_tokens": 2}

        def post(headers: dict[str, str]) -> httpx.Response:
            return httpx.post(ingress, json=body, headers=headers, timeout=60)

        missing = lab.call("client", post, {})
        right = lab.call("client", post, {"Authorization": f"Bearer {API_KEY}"})
        rc, out = job.wait()
    finally:
        job.stop()
    doc = job.result_json()
    print(f"HOSTS reference run: rc {rc}, {doc['counts']}, last line: {out.strip().splitlines()[-1]}")
    assert rc == 0, out[-3000:]
    assert doc["verdict"] == "VALID", doc.get("reason")

    # every engine on its own node's address, advertising it (URL, bootstrap host)
    workers = doc["metadata"]["workers"]
    by_role = {w["role"]: w for w in workers}
    assert by_role["prefill"]["node_ip"] == a and by_role["prefill"]["url"].startswith(f"http://{a}:")
    assert by_role["decode"]["node_ip"] == b and by_role["decode"]["url"].startswith(f"http://{b}:")

    # NIXL/UCX moved the KV over TCP on the veth, as UCX itself reported it (UCX_PROTO_INFO)
    transports = [t for w in workers for t in parse_ucx_transports(Path(w["log_path"]).read_text(errors="replace"))]
    print("UCX transports:\n  " + "\n  ".join(transports))
    assert transports and all("tcp/eth0" in t for t in transports), transports

    # the census: our services listen where the config says, on their own host only (by process: which
    # engine runs on which host is read from its command line, which sockets are its from the kernel)
    for role in ("node-a", "node-b"):
        print(f"CENSUS {role}: " + ", ".join(sorted({f'{s.pid}@{s.host}:{s.port}' for s in sockets[role]})))
        print("  " + "\n  ".join(sorted({f"{pid}: {titles[pid]}" for pid in {s.pid for s in sockets[role]}})))
    prefill_url, decode_url = by_role["prefill"]["url"], by_role["decode"]["url"]
    assert engine_at == {"node-a": [prefill_url], "node-b": [decode_url]}, engine_at
    prefill_port, decode_port = int(prefill_url.rsplit(":", 1)[1]), int(decode_url.rsplit(":", 1)[1])
    assert held_by(sockets["node-a"], engines["node-a"], prefill_port) == [a]
    assert held_by(sockets["node-b"], engines["node-b"], decode_port) == [b]
    assert held_by(sockets["node-a"], engines["node-a"], decode_port) == []
    assert held_by(sockets["node-b"], engines["node-b"], prefill_port) == []
    assert router_host == "node-b" and not routers["node-a"], \
        "the router replica is not (only) on the node whose address router.host names"
    assert held_by(sockets["node-b"], routers["node-b"], cfg.router.port) == [b], \
        "the router ingress is not where router.host says"
    client_listeners = [str(s) for s in sockets["client"]]
    assert not client_listeners, f"the client host runs no service, yet: {client_listeners}"
    for role, ip in (("node-a", a), ("node-b", b)):
        ours = [s for s in sockets[role] if s.pid in engines[role]]  # HTTP API, bootstrap, NIXL/UCX listeners
        assert engines[role] and ours, f"no engine process found listening on {role}"
        elsewhere = [str(s) for s in ours if s.host != ip]
        assert not elsewhere, f"{role}: engine sockets off the node's address {ip}: {elsewhere}"
        exporter = held_by(sockets[role], drivers[role], EXPORTER_PORT)
        assert exporter in ([], ["127.0.0.1"]), f"{role}: the driver exporter listens on {exporter}"

    # the router's API key across hosts
    assert missing.status_code == 401, missing.text
    assert API_KEY not in missing.text
    assert right.status_code == 200, right.text

    # secrets: neither the Ray token nor the API key in result.json, the job's output or the engine logs
    places = {"result.json": json.dumps(doc), "job output": out}
    places.update({Path(w["log_path"]).name: Path(w["log_path"]).read_text(errors="replace") for w in workers})
    leaks = [f"{what} in {place}" for place, text in places.items()
             for what, secret in (("Ray token", hosts.token), ("API key", API_KEY)) if secret in text]
    assert not leaks, leaks


def test_prometheus_scrapes_both_hosts(hosts: HostCluster, tmp_path) -> None:
    import shutil

    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    from tests.multihost.benchjob import run_prometheus

    targets = [f"{hosts.lab.hosts[h].ip}:{n.metrics_export_port}"
               for h, n in (("node-a", hosts.state.nodes[0]), ("node-b", hosts.state.nodes[-1]))]
    up = run_prometheus(hosts.lab, "client", targets, tmp_path)
    print(f"PROMETHEUS from the client host: {up}")
    assert up == {t: 1.0 for t in targets}
