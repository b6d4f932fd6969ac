"""`serve` across the two namespace hosts, the flow of tests/run/test_serve.py with the decode on the second host:
`serve --detach` of the 2026 preset's layout as a driver on node-a (prefill TP4 x2 on node-a, decode TP4 EP4 on
node-b, short simulated start-up, KV by NIXL over TCP on eth0) -> `serve status` -> `goodput` from the client host
with the real AIPerf (short windows at N 8 and 16) -> a live P:D change 2:1 -> 1:2 under load from the client (`serve
apply`: prefill-0/1 drained and removed, decode-0/1 placed on node-b, warmed across the hosts before it gets
traffic) -> `serve down` while a chat streams: drained, torn down on both hosts, nothing lost.

The workers take `engine.allow_from: [cluster]`: the client host gets the gateway and no answer from any worker
port (HTTP API, PD bootstrap; the added decode's too), while the gateway's host and the peer workers' reach them.

Runs after test_hosts.py on the session cluster (file order) and before the link faults end it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.cluster.ports import free_port
from orchestrator.config import dump_config, load_config
from orchestrator.run.serving.control import find_service, service_status
from tests.multihost.benchjob import REPO, engine_pids, router_pids
from tests.multihost.lab import HostCluster
from tests.support import ChatLoad, assert_one_live_change, engine_metric, wait_until

pytestmark = pytest.mark.ray
NODES = ("node-a", "node-b")


def bootstrap_port(prefill_url: str) -> int:
    return httpx.get(f"{prefill_url}/server_info", timeout=10).json()["disaggregation_bootstrap_port"]


def unanswered(lab, host: str, urls: list[str], timeout_s: float = 1.5) -> list[str]:
    """The URLs whose TCP port does not accept a connection from `host` within `timeout_s`."""
    def probe() -> list[str]:
        silent = []
        for url in urls:
            address, port = url.removeprefix("http://").rsplit(":", 1)
            try:
                socket.create_connection((address, int(port)), timeout_s).close()
            except OSError:
                silent.append(url)
        return silent

    return lab.call(host, probe)


def test_serve_across_hosts_goodput_live_pd_change_under_load_and_down(hosts: HostCluster, tmp_path: Path) -> None:
    lab = hosts.lab
    a, b = lab.hosts["node-a"].ip, lab.hosts["node-b"].ip
    gateway_port = lab.call("node-a", free_port, a)
    cfg = load_config(REPO / "configs" / "qwen3-pd-2026.yaml", [
        f"cluster.address={hosts.state.gcs_address}", "engine.sim.startup_s=1", "engine.sim.time_scale=0.05",
        "engine.sim.kv_transfer=nixl", "transfer.ucx.net_devices=eth0", "transfer.ucx.tls=tcp",
        "layout.decode.0.count=1",  # room on node-b for the decode `serve apply` adds there
        "engine.allow_from=[cluster]",  # workers answer node-a and node-b only, not the client host
        f"router.host={a}", f"router.port={gateway_port}", "benchmark.deadline_s=300",
        f"benchmark.result_dir={tmp_path}"])
    path = tmp_path / "serve.yaml"
    path.write_text(dump_config(cfg))
    state_dir = tmp_path / "svc"
    env = {**hosts.env(), "PD_ORCHESTRATOR_SERVE_DIR": str(state_dir)}

    def cli(host: str, *argv: str, timeout_s: float = 600):
        return lab.run(host, [sys.executable, "-m", "orchestrator", *argv], env=env, cwd=REPO, timeout_s=timeout_s)

    def workers() -> dict[str, dict]:
        return {w["name"]: w for w in service_status(find_service(state_dir, cfg.name))["workers"]}

    down = None
    up = cli("node-a", "serve", "--config", str(path), "--detach", "--drain-s", "60")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        warm = [line for line in up.stdout.splitlines() if line.startswith("pair warm-up ")]
        assert len(warm) == 2 and not any("FAILED" in w for w in warm), up.stdout  # 2 prefill x 1 decode
        shown = cli("node-a", "serve", "status", "--json", timeout_s=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        before = json.loads(shown.stdout)
        gateway = before["gateway"]
        assert gateway == f"http://{a}:{gateway_port}", gateway
        where = {w["name"]: (w["state"], w["url"].rsplit(":", 1)[0]) for w in before["workers"]}
        assert where == {"prefill-0/0": ("routed", f"http://{a}"), "prefill-0/1": ("routed", f"http://{a}"),
                         "decode-0/0": ("routed", f"http://{b}")}, before["workers"]
        assert all(s == "RUNNING" for s in before["applications"].values()), before["applications"]
        decode_url = before["workers"][-1]["url"]
        prefill_urls = [w["url"] for w in before["workers"] if w["role"] == "prefill"]
        bootstrap = [f"http://{a}:{lab.call('node-a', bootstrap_port, u)}" for u in prefill_urls]
        # the allow-list: no answer to the client host, while the gateway's host and the peers reach every port
        assert unanswered(lab, "client", [*prefill_urls, *bootstrap, decode_url]) == [*prefill_urls, *bootstrap,
                                                                                      decode_url]
        assert unanswered(lab, "node-b", [*prefill_urls, *bootstrap]) == []  # the decode's host
        assert unanswered(lab, "node-a", [decode_url]) == []  # the gateway's (and the prefills') host

        # the contest's closed-loop command from the client host, real AIPerf, short windows at N 8 and 16
        decoded = lab.call("node-a", engine_metric, decode_url, "sglang:num_requests_total")
        assert decoded is not None, f"node-b's decode {decode_url} does not answer node-a"
        out = tmp_path / "goodput"
        goodput = lab.run("client", [sys.executable, "-m", "orchestrator", "goodput", "--config", str(path),
                                     "--url", gateway, "--concurrency", "8,16", "--isl", "1000", "--osl", "64",
                                     "--warmup-s", "2", "--window-s", "10", "--grace-s", "5",
                                     "--num-dataset-entries", "64", "--out", str(out)],
                          env=hosts.env(), cwd=REPO, timeout_s=900)
        print(f"GOODPUT across hosts:\n{goodput.stdout}")
        assert (out / "goodput.json").is_file(), goodput.stdout + goodput.stderr
        rows = json.loads((out / "goodput.json").read_text())["rows"]
        assert [r["concurrency"] for r in rows] == [8, 16], goodput.stdout + goodput.stderr
        assert all(r["errors"] == 0 and r["requests"] > 0 and r["output_tok_s"] > 0 for r in rows), rows
        # every AIPerf request was decoded on node-b (AIPerf's warm-up and grace requests count there too)
        on_b = (lab.call("node-a", engine_metric, decode_url, "sglang:num_requests_total") or 0.0) - decoded
        assert on_b >= sum(r["requests"] for r in rows), (on_b, rows)

        # P:D 2:1 -> 1:2 under load from the client: prefill-0/1 out, decode-0/1 in on node-b
        load = ChatLoad(gateway, users=8)
        lab.call("client", load.__enter__)  # its threads start inside the client's namespace
        try:
            apply = cli("node-a", "serve", "apply", "--set", "layout.prefill.0.count=1",
                        "--set", "layout.decode.0.count=2")
            assert apply.returncode == 0, apply.stdout + apply.stderr
            wait_until(lambda: not load.failed and (workers()["decode-0/1"]["requests"] or 0) >= 20 or load.failed,
                       120, poll_s=0.5, what="20 requests decoded by the added decode-0/1")
        finally:
            load.__exit__(None, None, None)
        print(f"APPLY across hosts:\n{apply.stdout}")
        assert not load.failed and load.completed > 0, (load.failed, apply.stdout)
        after = service_status(find_service(state_dir, cfg.name))
        # the new decode answered its one pair warm-up (prefill-0/0 on node-a -> decode-0/1 on node-b) and nothing
        # else before it was admitted
        assert_one_live_change(after, ("2PxTP4/1DxTP4", "1PxTP4/2DxTP4"), "prefill-0/1", "decode-0/1", apply.stdout)
        placed = {w["name"]: (w["state"], w["node_ip"], w["url"].rsplit(":", 1)[0]) for w in after["workers"]}
        assert placed == {"prefill-0/0": ("routed", a, f"http://{a}"), "decode-0/0": ("routed", b, f"http://{b}"),
                          "decode-0/1": ("routed", b, f"http://{b}")}, after["workers"]
        assert len(engine_pids(lab, "node-a")) == 1 and len(engine_pids(lab, "node-b")) == 2
        added_url = next(w["url"] for w in after["workers"] if w["name"] == "decode-0/1")
        assert unanswered(lab, "client", [added_url]) == [added_url] and unanswered(lab, "node-a", [added_url]) == []

        # `serve down` while a long chat streams from the client: it finishes whole, then everything goes
        def chat_through_down() -> list[str]:
            nonlocal down
            chunks: list[str] = []
            with httpx.stream("POST", f"{gateway}/v1/chat/completions", timeout=120, json={
                    "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 1000,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
                    if len(chunks) == 5 and down is None:
                        down = lab.popen("node-a", [sys.executable, "-m", "orchestrator", "serve", "down"], env=env,
                                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return chunks

        chunks = lab.call("client", chat_through_down)
        assert down is not None
        finished, _ = down.communicate(timeout=300)
    finally:
        if down is None:  # the test failed before `serve down`: stop the service anyway
            cli("node-a", "serve", "down", timeout_s=300)
    assert chunks[-1] == "[DONE]" and json.loads(chunks[-2])["usage"]["completion_tokens"] == 1000, chunks[-3:]
    log = state_dir / f"{cfg.name}.log"
    assert down.returncode == 0, finished + (log.read_text() if log.exists() else "")
    assert "drained: no request in flight" in finished and "serve: stopped" in finished, finished
    left = {role: (engine_pids(lab, role), router_pids(lab, role)) for role in NODES}
    assert left == {role: (set(), set()) for role in NODES}, f"engines/router left after serve down: {left}"
    with pytest.raises(httpx.ConnectError):  # the gateway is closed
        lab.call("client", httpx.get, f"{gateway}/v1/models", timeout=5)
