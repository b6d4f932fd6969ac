"""Helpers of the multi-host tests: a benchmark submitted with `ray job submit` from the client host and
watched while it runs, the run config for the namespace cluster, the listening-socket census of one
host, and a Prometheus on the client host."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

from orchestrator.cluster.listening import ListeningSocket
from orchestrator.cluster.ports import free_port, port_free
from orchestrator.config import RunConfig, dump_config
from orchestrator.cluster.netns.lab import NetnsLab
from tests.support import sim_config, wait_until

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
UPLOAD_EXCLUDES = [".venv*/", ".device/", "build/", "runs/", ".hypothesis/", "*.egg-info/", "benchmarks/results/"]
API_KEY_ENV = "PDO_MULTIHOST_API_KEY"
API_KEY = "mh-" + "9c4e1f7a2b"  # a made-up test key
EXPORTER_PORT = 19464  # the bench driver's exporter, on 127.0.0.1 of the host the job's driver runs on


def host_config(hosts, tmp_path: Path, name: str, num_prompts: int = 160, overrides: dict | None = None) -> RunConfig:
    """A 1P1D sim run on the namespace cluster: engines on their node's address, KV by NIXL over TCP on eth0.

    Slowed x20 with 8 prompts in flight, 160 prompts of 64 output tokens take ~20 s of wall time: long
    enough to look at the running deployment or break something mid-run, short enough for CI.
    """
    return sim_config({
        "name": name,
        "cluster.address": hosts.state.gcs_address,
        "engine.sim.kv_transfer": "nixl",
        "engine.sim.time_scale": 20.0,
        "transfer.ucx.net_devices": "eth0",
        # Both hosts are one machine to UCX, so with every transport allowed it moves the KV by CMA
        # (process_vm_writev), past the link; TCP only is what a 2-node cluster without RDMA would use.
        "transfer.ucx.tls": "tcp",
        # UCX prints the protocols it chose (to the engine log): the transport that really moved the KV
        "transfer.env": {"UCX_PROTO_INFO": "y"},
        # the router replica is not pinned to a node and serves HTTP itself: every interface of its node
        "router.host": "0.0.0.0",
        "router.api_key_env": API_KEY_ENV,
        "router.port": router_port(hosts.lab),
        "router.request_timeout_s": 8.0,  # per leg: a leg cut off by a fault fails in 8 s, not at the deadline
        "router.max_attempts": 2,
        "metrics.exporter_port": EXPORTER_PORT,
        "benchmark.num_prompts": num_prompts,
        "benchmark.fixed_output_len": 64,
        "benchmark.max_in_flight": 8,
        "benchmark.deadline_s": 8.0,  # x time_scale 20 = 160 s wall, every phase included
        "benchmark.result_dir": str(tmp_path / "results"),
        **(overrides or {}),
    })


def router_port(lab: NetnsLab) -> int:
    """A port free on both node hosts: the router replica binds 0.0.0.0 on whichever node it lands on, and a
    number picked in the test's own namespace says nothing about the ports the lab's Ray daemons hold there."""
    while True:
        port = lab.call("node-a", free_port, "0.0.0.0")
        if lab.call("node-b", port_free, "0.0.0.0", port):
            return port


class BenchJob:
    """`ray job submit ... -- python -m orchestrator bench` on the client host; its output is collected."""

    def __init__(self, hosts, cfg: RunConfig, tmp_path: Path, extra_env: dict[str, str] | None = None,
                 entrypoint_resources: dict[str, float] | None = None):
        self.hosts = hosts
        self.lab: NetnsLab = hosts.lab
        self.cfg = cfg
        self.job_id = f"pdo-multihost-{uuid.uuid4().hex[:8]}"
        self.config_path = config_path = tmp_path / f"{self.job_id}.yaml"
        config_path.write_text(dump_config(cfg))
        # the router's API key reaches its replica the way a user passes it: the job's runtime_env
        runtime_env = {"excludes": UPLOAD_EXCLUDES, "env_vars": {API_KEY_ENV: API_KEY, **(extra_env or {})}}
        argv = [RAY, "job", "submit", "--address", hosts.state.dashboard_url, "--working-dir", str(REPO),
                "--submission-id", self.job_id, "--runtime-env-json", json.dumps(runtime_env)]
        if entrypoint_resources:  # where the job's driver runs (default: the head node)
            argv += ["--entrypoint-resources", json.dumps(entrypoint_resources)]
        argv += ["--", sys.executable, "-m", "orchestrator", "bench", "--config", str(config_path)]
        self.started_at = time.monotonic()
        self.started_at_wall = time.time()
        self.proc = self.lab.popen("client", argv, env=hosts.env(), cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def progress(self) -> int:
        """Requests the decode engine(s) finished so far (sglang:num_requests_total); 0 before they answer."""
        done = 0
        for url in engine_urls(self.lab, "node-b"):
            try:
                text = self.lab.call("client", lambda url=url: httpx.get(url + "/metrics", timeout=2).text)
            except httpx.HTTPError:
                continue
            done += int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith("sglang:num_requests_total")))
        return done

    def wait_measuring(self, done_at_least: int = 4, timeout_s: float = 200) -> None:
        """Until the measured run is under way: `done_at_least` prompts decoded, others in flight."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended ({self.proc.returncode}) before its run did:\n{self.output[-3000:]}"
                                     f"\nerrors in the cluster's Serve logs:\n{self.serve_errors()}")
            measuring = any("measured run" in line for line in self.lines) or "measured run" in self.driver_log()
            return measuring and self.progress() >= done_at_least

        try:
            wait_until(ready, timeout_s, what=f"job {self.job_id} measuring with {done_at_least} prompts done")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; progress {self.progress()}; output:\n{self.output[-2500:]}\n"
                                 f"errors in the cluster's Serve logs:\n{self.serve_errors()}") from None

    def serve_errors(self, limit: int = 4000) -> str:
        """ERROR lines and tracebacks of the Serve controller and replicas on both nodes."""
        lines: list[str] = []
        for log in sorted(Path(self.hosts.state.root_dir).glob("*/session_latest/logs/serve/*.log")):
            text = log.read_text(errors="replace").splitlines()
            for line in text:  # error lines and the exception line of each traceback (not its frames)
                if " ERROR " in line or (line and not line[0].isspace() and ("Error" in line or "Exception" in line)):
                    lines.append(f"{log.name}: {line[:400]}")
        return "\n".join(lines)[-limit:] or "(none)"

    def wait(self, timeout_s: float = 300) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"job {self.job_id} still running after {timeout_s:.0f}s:\n{self.output[-3000:]}") from None
        self.reader.join(timeout=30)  # the rest of the output, up to EOF
        return rc, self.output

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.lab.run("client", [RAY, "job", "stop", "--address", self.hosts.state.dashboard_url, self.job_id],
                         env=self.hosts.env(), timeout_s=60)
            self.proc.kill()
            self.proc.wait()

    def driver_pids(self) -> dict[str, list[int]]:
        """PIDs of this job's driver (`python -m orchestrator bench --config <this job's config>`) per host."""
        return {role: [p for p in self.lab.pids(role) if str(self.config_path) in _argv(p)]
                for role in ("node-a", "node-b")}

    def driver_host(self) -> str | None:
        return next((role for role, pids in self.driver_pids().items() if pids), None)

    def wait_driver_exit(self, timeout_s: float) -> None:
        wait_until(lambda: not any(self.driver_pids().values()), timeout_s, what=f"job {self.job_id}'s driver to exit")

    def driver_log(self) -> str:
        """The driver's output as Ray's job supervisor wrote it, on the node that ran it (Ray's job API
        tails only the head's copy of this file: a driver elsewhere shows nothing through it)."""
        logs = list(Path(self.hosts.state.root_dir).glob(f"*/session_latest/logs/job-driver-{self.job_id}.log"))
        return max((log.read_text(errors="replace") for log in logs), key=len, default="")

    def result_json(self) -> dict:
        paths = list(Path(self.cfg.benchmark.result_dir).glob("*/result.json"))
        assert len(paths) == 1, (f"expected one result.json, found {paths}:\n{self.output[-2000:]}\n"
                                 f"driver log:\n{self.driver_log()[-2500:]}")
        return json.loads(paths[0].read_text())


def engine_urls(lab: NetnsLab, role: str) -> list[str]:
    """URLs of the simulated engine servers running on host `role` (from their command lines)."""
    urls = []
    for pid in engine_pids(lab, role):
        argv = _argv(pid)
        urls.append(f"http://{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}")
    return urls


CENSUS = ("import json; from orchestrator.cluster.listening import all_pids, listening_sockets; "
          "print(json.dumps([s.__dict__ for s in listening_sockets(all_pids())]))")


def census(lab: NetnsLab, role: str) -> list[ListeningSocket]:
    """Every listening TCP socket on host `role` (the kernel's table of that namespace) and its process.

    Read by a process inside the namespace: /proc/net/tcp shows the reader's own namespace only.
    """
    done = lab.run(role, [sys.executable, "-c", CENSUS], cwd=REPO, timeout_s=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return [ListeningSocket(**s) for s in json.loads(done.stdout)]


def engine_pids(lab: NetnsLab, role: str) -> set[int]:
    """PIDs of the simulated engine servers on host `role`."""
    return {pid for pid in lab.pids(role) if "orchestrator.engines.sim.server" in _argv(pid)}


ROUTER_TITLE = "PDRouter"  # in the process title Ray gives the router's Serve replica (ray::ServeReplica:...)


def router_pids(lab: NetnsLab, role: str) -> set[int]:
    """PIDs of the router's Serve replica on host `role` (found by its process title, not by a port number)."""
    return {pid for pid in lab.pids(role) if any(ROUTER_TITLE in arg for arg in _argv(pid))}


def held_by(sockets: list[ListeningSocket], pids: set[int], port: int) -> list[str]:
    """The addresses on which one of `pids` listens on `port` (sorted): which process, not only which number.

    Hosts are separate port spaces: another host's process (a Ray agent, say) may listen on the same number."""
    return sorted({s.host for s in sockets if s.pid in pids and s.port == port})


def process_line(pid: int) -> str:
    """The command line of `pid` (its process title for a Ray worker), for messages."""
    return " ".join(_argv(pid)).strip()[:160]


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def run_prometheus(lab: NetnsLab, role: str, targets: list[str], tmp_path: Path, timeout_s: float = 60) -> dict:
    """Prometheus on host `role` scraping `targets` once a second: {target: up} once it has them all."""
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "ray-nodes", "static_configs": [{"targets": targets}]}],
    }))
    listen = "127.0.0.1:9090"
    proc = lab.popen(role, ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                            f"--web.listen-address={listen}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> dict | None:
        try:
            r = httpx.get(f"http://{listen}/api/v1/query", params={"query": "up"}, timeout=2)
            seen = {s["metric"]["instance"]: float(s["value"][1]) for s in r.json()["data"]["result"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return seen if set(seen) >= set(targets) and all(seen.values()) else None

    try:
        return wait_until(lambda: lab.call(role, up), timeout_s, what=f"Prometheus on {role} scraping {targets}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
