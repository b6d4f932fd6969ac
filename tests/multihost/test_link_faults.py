"""Faults across the link between the two hosts, each mid-run of a benchmark submitted from the client:
the decode host's link down for a few seconds, down for good, throttled to a trickle; the decode node's
raylet killed; the head node's raylet killed. Then `cluster down` must leave no process on either host.

For every fault: every prompt ends completed or failed-with-reason in result.json (none lost), no
request outlives the run's deadline, the exit status and the bench's last line say what happened, and
afterwards the cluster is brought back (or, for the head, stopped) leaving no process behind. Each test
prints one `FAULT ...` line; docs/reliability.md quotes them.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import pytest

from tests.faultcheck import assert_fault_hit_prompts, hit_line
from tests.multihost.benchjob import BenchJob, host_config
from tests.multihost.lab import HostCluster
from tests.support import wait_until

pytestmark = pytest.mark.ray

TIME_SCALE = 10.0
# simulated; x TIME_SCALE = 120 s of wall time for the whole run, start-up included. (A sim engine gets
# deadline_s wall seconds to start, unscaled: 12 s, enough on a loaded 2-core box.)
DEADLINE_S = 12.0
FLAP_S = 4.0  # how long the link is down in the flap test (a fault's length, not a wait for something)
TRICKLE_MBIT = 0.2  # 25 kB/s: one prompt's KV (megabytes) takes minutes
TRICKLE_S = 12.0  # longer than a leg's timeout (router.request_timeout_s = 8 s)
# what a prompt the link or node fault met may fail with: a leg's timeout, a refused/reset connection, or no
# healthy worker left to pair with (error prefixes in result.json)
FAULT_REASONS = ("timeout", "connect", "no_worker")


@dataclass
class FaultRun:
    """One faulted run: the job's exit status and output, its result.json, when the fault happened."""

    name: str
    rc: int
    output: str
    doc: dict
    fault_at: float
    started_at: float

    @property
    def results(self) -> list[dict]:
        return self.doc["results"]

    def bench_last_line(self) -> str:
        """The bench's own last line (Ray's `job submit` prints its status lines after it)."""
        ours = [line for line in self.output.splitlines()
                if line.strip() and not re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s", line)]
        return ours[-1].strip() if ours else ""

    def bench_started_at(self) -> float:
        """Wall clock of the bench's own start (its phases are timed from it, in simulated seconds)."""
        return self.doc["metadata"]["started_at"]

    def ended_after_fault_s(self) -> float:
        """Fault -> end of the measured run (the last prompt accounted for), seconds."""
        measured = next(p for p in self.doc["phases"] if p["name"] == "measured run")
        return self.bench_started_at() + measured["end_s"] * TIME_SCALE - self.fault_at

    def detect_s(self) -> float | None:
        """Fault -> first prompt that met it (failed or retried) ended, seconds; None if none met it."""
        met = [r["done_at"] for r in self.results
               if (r["status"] == "failed" or r["attempts"] > 1) and r.get("done_at") and r["done_at"] >= self.fault_at]
        return min(met) - self.fault_at if met else None

    def assert_hit(self, window_s: float) -> None:
        """Prompts were in flight (1P1D: every prompt's path crosses node-b's link and both nodes) while the
        fault lasted, and each ended completed or failed with a fault's reason; prints the HIT line."""
        met = assert_fault_hit_prompts(self.results, self.fault_at, self.fault_at + window_s, reasons=FAULT_REASONS)
        print(hit_line(self.name, met, window_s))

    def summary(self) -> str:
        counts = self.doc["counts"]
        reasons = Counter((r["error"] or "").split(":")[0] for r in self.results if r["status"] == "failed")
        detect = self.detect_s()
        lost = counts["num_prompts"] - counts["completed"] - counts["failed"]
        return (f"FAULT {self.name}: prompts {counts['num_prompts']}, completed {counts['completed']}, "
                f"failed-with-reason {counts['failed']}{' ' + repr(dict(reasons)) if reasons else ''}, lost {lost}, "
                f"retried {sum(r['attempts'] > 1 for r in self.results)}, "
                f"first prompt met it after {'-' if detect is None else f'{detect:.1f}s'}, "
                f"run ended {self.ended_after_fault_s():.1f}s after the fault, rc {self.rc}, "
                f"job {time.time() - self.started_at:.0f}s; last line: {self.bench_last_line()[:160]}")


def run_with_fault(hosts: HostCluster, tmp_path, name: str, inject: Callable[[], None]) -> FaultRun:
    # router.host 0.0.0.0 puts the router on the driver's node, the head: a fault on node-b's link must not
    # take the router itself away (every prompt failing "actor died", as when Serve once placed it on node-b)
    cfg = host_config(hosts, tmp_path, name="fault", overrides={"engine.sim.time_scale": TIME_SCALE,
                                                             "benchmark.deadline_s": DEADLINE_S})
    job = BenchJob(hosts, cfg, tmp_path)
    try:
        job.wait_measuring()
        assert job.driver_host() == "node-a" and router_hosts(hosts) == ["node-a"], \
            f"driver on {job.driver_host()}, router on {router_hosts(hosts)}: both belong on the head"
        fault_at = time.time()
        inject()
        rc, out = job.wait(timeout_s=DEADLINE_S * TIME_SCALE + 120)
    finally:
        job.stop()
    run = FaultRun(name, rc, out, job.result_json(), fault_at, job.started_at_wall)
    print(run.summary())
    return run


def router_hosts(hosts: HostCluster) -> list[str]:
    """The hosts a router replica process runs on."""
    from tests.multihost.benchjob import _argv

    return [h for h in ("node-a", "node-b") if any("pd-router" in " ".join(_argv(p)) for p in hosts.lab.pids(h))]


def assert_every_prompt_accounted_for(run: FaultRun) -> None:
    n = run.doc["counts"]["num_prompts"]
    indices = sorted(r["index"] for r in run.results)
    assert indices == list(range(n)), "a prompt is missing from result.json or reported twice"
    assert all(r["status"] in ("ok", "failed") for r in run.results)
    no_reason = [r["index"] for r in run.results if r["status"] == "failed" and not r["error"]]
    assert not no_reason, f"failed without a reason: {no_reason}"
    assert run.doc["counts"]["completed"] + run.doc["counts"]["failed"] == n
    deadline_at = run.bench_started_at() + DEADLINE_S * TIME_SCALE
    late = [r["index"] for r in run.results if r.get("done_at") and r["done_at"] > deadline_at + 1.0]
    assert not late, f"prompts ended after the run's deadline: {late}"


def assert_status_says_what_happened(run: FaultRun) -> None:
    last = run.bench_last_line()
    if run.doc["counts"]["failed"]:
        assert run.rc != 0, "a run with failed prompts exited 0"
        assert last.startswith("INVALID:"), f"the last line does not give the reason: {last!r}"
    else:
        assert run.rc == 0, run.output[-3000:]


@pytest.fixture
def decode_host_up(hosts: HostCluster) -> HostCluster:
    """node-b's link up and unshaped and a live decode raylet on it, whatever an earlier test left behind."""
    hosts.lab.link_up("node-b")
    hosts.lab.unshape("node-b")
    decode_node_back(hosts)
    return hosts


def decode_node_back(hosts: HostCluster) -> None:
    """Make sure node-b runs a live decode raylet again (a fault may have killed it or got it declared dead)."""
    from orchestrator.cluster.netns.ray_cluster import alive_node_count

    def alive() -> int:
        return hosts.lab.call("client", alive_node_count, hosts.state.dashboard_url, hosts.token)

    if _raylets(hosts, "node-b") and alive() >= 2:
        return
    hosts.lab.kill("node-b")  # whatever is left of the dead node
    # until the GCS has declared the old node dead, it still counts as alive (and takes jobs' placements)
    wait_until(lambda: alive() <= 1, 120, what="the GCS to declare the old decode node dead")
    hosts.cluster.start_node(hosts.cluster.cluster.roles.decode)


def test_link_down_for_a_few_seconds_then_up(decode_host_up: HostCluster, tmp_path) -> None:
    hosts = decode_host_up
    lab = hosts.lab

    def flap() -> None:
        lab.link_down("node-b")
        threading.Timer(FLAP_S, lab.link_up, args=("node-b",)).start()

    try:
        run = run_with_fault(hosts, tmp_path, f"decode host's link down {FLAP_S:g}s, then up", flap)
    finally:
        lab.link_up("node-b")
    assert_every_prompt_accounted_for(run)
    assert_status_says_what_happened(run)
    run.assert_hit(FLAP_S)  # TCP may carry them through the outage (no retry), but they must have been there
    assert run.doc["counts"]["completed"] > 0


def test_link_throttled_to_a_trickle_mid_run(decode_host_up: HostCluster, tmp_path) -> None:
    hosts = decode_host_up
    lab = hosts.lab

    def trickle() -> None:
        lab.shape("node-b", TRICKLE_MBIT)
        assert lab.shaped_rate_mbit("node-b") == pytest.approx(TRICKLE_MBIT)
        threading.Timer(TRICKLE_S, lab.unshape, args=("node-b",)).start()

    try:
        run = run_with_fault(hosts, tmp_path, f"decode host's link at {TRICKLE_MBIT:g} Mbit/s for {TRICKLE_S:g}s",
                             trickle)
    finally:
        lab.unshape("node-b")
    assert_every_prompt_accounted_for(run)
    assert_status_says_what_happened(run)
    run.assert_hit(TRICKLE_S)
    assert run.detect_s() is not None, "no prompt met the trickle; the test did not test anything"


def test_link_down_for_good(decode_host_up: HostCluster, tmp_path) -> None:
    hosts = decode_host_up
    lab = hosts.lab
    try:
        run = run_with_fault(hosts, tmp_path, "decode host's link down for good",
                             lambda: lab.link_down("node-b"))
    finally:
        lab.link_up("node-b")
    assert_every_prompt_accounted_for(run)
    assert_status_says_what_happened(run)
    run.assert_hit(math.inf)
    assert run.doc["counts"]["failed"] > 0, "every prompt completed with the decode host cut off"


def _raylets(hosts: HostCluster, host: str) -> list[int]:
    from tests.multihost.benchjob import _argv

    return [p for p in hosts.lab.pids(host) if _argv(p)[:1] and _argv(p)[0].endswith("/raylet")]


def _raylet_pid(hosts: HostCluster, host: str) -> int:
    pids = _raylets(hosts, host)
    assert len(pids) == 1, f"expected one raylet on {host}, found {pids}"
    return pids[0]


def test_decode_raylet_killed_mid_run(decode_host_up: HostCluster, tmp_path) -> None:
    import os
    import signal

    hosts = decode_host_up
    killed: list[int] = []

    def kill() -> None:
        killed.append(_raylet_pid(hosts, "node-b"))
        os.kill(killed[0], signal.SIGKILL)

    run = run_with_fault(hosts, tmp_path, "decode node's raylet SIGKILLed", kill)
    assert_every_prompt_accounted_for(run)
    assert_status_says_what_happened(run)
    run.assert_hit(0.0)
    assert run.doc["counts"]["failed"] > 0, "every prompt completed without a decode node"
    left = hosts.lab.kill("node-b")
    print(f"  processes left on node-b after its raylet died: {len(left)} (stopped)")


def test_head_raylet_killed_mid_run(decode_host_up: HostCluster, tmp_path) -> None:
    """The head's raylet SIGKILLed: `ray start --block` takes the GCS, dashboard and job API down with it.

    A driver on the head would die with it, so the job is submitted the way a run that must survive its
    head is: `--entrypoint-resources '{"node:<node-b>": 0.001}'` (every node offers `node:<its IP>`), the
    driver on node-b, and the router there too (router.host = node-b's address). The client's `ray job
    submit` loses its log stream at once; the driver keeps going, fails what the dead head held (the
    prefill engine) with a reason, writes result.json and its last line (to its job log on node-b), all
    before Ray ends a process that lost its GCS (60 s). Runs last: nothing brings a head back; the next
    test stops what is left.
    """
    import os
    import signal

    from orchestrator.cluster.netns.ray_cluster import alive_node_count

    hosts = decode_host_up
    b_ip = hosts.lab.hosts["node-b"].ip
    cfg = host_config(hosts, tmp_path, name="fault", overrides={"engine.sim.time_scale": TIME_SCALE,
                                                             "benchmark.deadline_s": DEADLINE_S,
                                                             "router.host": b_ip})  # the router survives too
    job = BenchJob(hosts, cfg, tmp_path, entrypoint_resources={f"node:{b_ip}": 0.001})
    router_on: list[str] = []
    try:
        job.wait_measuring()
        assert job.driver_host() == "node-b", "the job's driver is not on node-b"
        router_on += router_hosts(hosts)
        fault_at = time.time()
        os.kill(_raylet_pid(hosts, "node-a"), signal.SIGKILL)
        client_rc, client_out = job.wait(timeout_s=60)  # the client's stream from the head breaks at once
        job.wait_driver_exit(timeout_s=DEADLINE_S * TIME_SCALE)
    finally:
        job.stop()
        (tmp_path / "driver.log").write_text(job.driver_log())
        print(f"  router replica on {router_on}; driver log: {tmp_path / 'driver.log'}")
    driver_ended_s = time.time() - fault_at
    run = FaultRun("head node's raylet SIGKILLed (driver on node-b)", client_rc, job.driver_log(), job.result_json(),
                   fault_at, job.started_at_wall)
    print(run.summary())
    print(f"  ray job submit (client): rc {client_rc}, last line: {client_out.strip().splitlines()[-1][:200]}")
    print(f"  the driver on node-b exited {driver_ended_s:.1f}s after the fault")
    assert hosts.lab.call("client", alive_node_count, hosts.state.dashboard_url, hosts.token) == 0, \
        "the head's dashboard still answers after its raylet was killed"
    assert_every_prompt_accounted_for(run)
    run.assert_hit(0.0)
    assert run.doc["counts"]["failed"] > 0, "every prompt completed with the head node gone"
    assert run.bench_last_line().startswith("INVALID:"), f"the driver's last line: {run.bench_last_line()!r}"
    assert client_rc != 0 and "closed unexpectedly" in client_out, client_out[-1500:]


def test_cluster_down_leaves_no_process_on_either_host(hosts: HostCluster) -> None:
    """After the faults (the decode node restarted, the head killed): stopping the cluster stops everything."""
    hosts.cluster.stop()
    from tests.multihost.benchjob import _argv

    left = {h: [f"{p} {' '.join(_argv(p))[:160]}" for p in hosts.lab.pids(h)] for h in ("node-a", "node-b")}
    assert left == {"node-a": [], "node-b": []}, f"`cluster down` left processes: {left}"

