"""Faults mid-run through the real Ray path: a benchmark batch keeps its promises while workers break.

One 2P2D simulated deployment (worker apps + registry + PDRouter on the session's local 2-node cluster)
serves every test; each test streams a batch through the router's `generate_batch` handle and, once the
first results are back (so requests are in flight), breaks something for real:
- kills a decode engine process (SIGKILL by PID, found from the worker's URL port),
- kills a prefill engine process,
- makes a prefill hang its KV transfers (`POST /sim/faults {"hang": "transfer"}`),
- makes every engine answer 5% of requests with HTTP 500 (`error_rate: 0.05`).

Each test asserts the promises of issue 6: completed + failed = batch size, no prompt reported twice,
the run ends before its deadline, and (a spare pair being there) every prompt completes. Killed workers
must come back: Serve restarts the replica, the router's worker view follows, and the next test again
starts from 2 healthy prefills and 2 healthy decodes. Each test prints one `FAULT ...` summary line;
docs/reliability.md quotes them.

Graceful shutdown is tested first, before the module's deployment exists (its `bench` subprocess
deploys and shuts down Serve on the same cluster): SIGINT / SIGTERM to a running `pd-orchestrator bench`
must abort the in-flight requests on both legs, stop the engines and write the partial result.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

from orchestrator.cluster.local import LocalClusterState
from orchestrator.config import RunConfig, dump_config
from orchestrator.process import pid_alive
from orchestrator.records import BenchRequest, RequestResult, WorkerEndpoint
from tests.faultcheck import assert_fault_hit_prompts, hit_line
from tests.support import cluster_pids, engine_metric, pid_listening_on, sim_config, sim_engines_finished, wait_until

pytestmark = pytest.mark.ray

BATCH_SIZE = 32
MAX_IN_FLIGHT = 8
DEADLINE_S = 90.0  # the whole batch, faults and retries included
LEG_TIMEOUT_S = 4.0  # router.request_timeout_s: a hung leg is given up after this
INJECT_AFTER = 4  # results seen before the fault: by then MAX_IN_FLIGHT requests are in flight
RECOVERY_S = 150.0  # Serve health check (10 s period) + replica restart + engine start; 40-50 s seen under load


@dataclass
class Deployment:
    """The module's 2P2D deployment: its config, the cluster it runs on, the router handle."""

    cfg: RunConfig
    cluster: LocalClusterState
    router: object  # Serve DeploymentHandle of PDRouter
    expected: dict[str, int]

    def workers(self) -> list[WorkerEndpoint]:
        return self.router.workers.remote().result(timeout_s=30)

    def worker(self, name: str) -> WorkerEndpoint:
        return next(w for w in self.workers() if w.name == name)

    def wait_all_healthy(self) -> list[WorkerEndpoint]:
        return self.router.wait_ready.remote(self.expected, RECOVERY_S).result(timeout_s=RECOVERY_S + 30)

    def settled(self) -> bool:
        """The router sees exactly the expected workers per role and every one of them answers /health."""
        try:
            view = self.workers()
        except Exception:  # the router replica itself is down or restarting: not settled
            return False
        return Counter(w.role for w in view) == self.expected and all(answers_health(w.url) for w in view)


def answers_health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def deploy_2x2(cfg: RunConfig, cluster: LocalClusterState) -> Deployment:
    from ray import serve

    from deployments.app import ROUTER_APP, deploy, expected_workers

    deploy(cfg, f"faults-{uuid.uuid4().hex[:8]}", timeout_s=120)
    dep = Deployment(cfg, cluster, serve.get_app_handle(ROUTER_APP), expected_workers(cfg))
    ready = dep.wait_all_healthy()
    assert Counter(w.role for w in ready) == {"prefill": 2, "decode": 2}
    return dep


# ---- graceful shutdown (must run before `pd2x2` deploys: the bench subprocess shuts Serve down) --------


class BenchProcess:
    """`pd-orchestrator bench` as a user runs it, attached to the session cluster through RAY_ADDRESS."""

    def __init__(self, cfg: RunConfig, tmp_path, gcs_address: str, extra_env: dict[str, str] | None = None):
        config_path = tmp_path / "bench.yaml"
        config_path.write_text(dump_config(cfg))
        self.result_dir = tmp_path / "results"
        env = {**os.environ, "RAY_ADDRESS": gcs_address, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        # as from a terminal: SIGINT raises KeyboardInterrupt even when this test runs in a background job
        # (non-interactive shells start those with SIGINT ignored, and the ignore is inherited)
        as_from_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                              "sys.argv[0] = 'pd-orchestrator'; runpy.run_module('orchestrator', run_name='__main__')")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", as_from_a_terminal, "bench", "--config", str(config_path),
             "--result-dir", str(self.result_dir)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(needle in line for line in self.lines):
            if self.proc.poll() is not None:
                raise AssertionError(f"bench exited ({self.proc.returncode}) before {needle!r}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"bench printed no {needle!r} within {timeout_s:.0f}s:\n{self.output}")
            time.sleep(0.2)

    def result_json(self) -> dict:
        paths = list(self.result_dir.glob("*/result.json"))
        assert len(paths) == 1, f"expected one result.json under {self.result_dir}, found {paths}:\n{self.output}"
        return json.loads(paths[0].read_text())


# SIGINT under load: 192 streams in flight, the signal once the decode has finished 150 (the router, reading
# ~190 streams on a loaded box, lags the engine: what the engine finished but the router had not yet read
# must stay completed too). SIGTERM: 16 in flight, the signal once each engine has finished 2.
SIGNAL_CASES = [(signal.SIGINT, 600, 192, 150, 5.0), (signal.SIGTERM, 200, 16, 2, 20.0)]


@pytest.mark.parametrize("sig,num_prompts,in_flight,signal_after,time_scale", SIGNAL_CASES,
                         ids=["SIGINT-192-in-flight", "SIGTERM-16-in-flight"])
def test_signal_mid_run_aborts_both_legs_stops_engines_and_writes_partial_result(
        ray_driver, tmp_path, sig, num_prompts, in_flight, signal_after, time_scale):
    import ray

    from orchestrator.cluster.registry import get_registry

    cfg = sim_config({"name": "shutdown", "engine.sim.time_scale": time_scale, "benchmark.num_prompts": num_prompts,
                      "benchmark.max_in_flight": in_flight, "benchmark.deadline_s": 60.0}, tmp_dir=tmp_path)
    bench = BenchProcess(cfg, tmp_path, ray_driver.gcs_address)
    try:
        bench.wait_for_line("measured run", timeout_s=150)
        # the bench's own workers, as its router sees them (it cleared the registry before deploying)
        _, endpoints = ray.get(get_registry().snapshot.remote())
        engines = {e.name: e for e in endpoints}
        assert {e.role for e in endpoints} == {"prefill", "decode"}, endpoints
        pids = {name: pid_listening_on(urlsplit(e.url).port, cluster_pids(ray_driver)) for name, e in engines.items()}
        assert all(pids.values()), f"engine processes not found: {pids}"
        # mid-run: both engines have finished requests (so the batch is flowing) and the batch is not done
        wait_until(lambda: all((engine_metric(e.url, "sglang:num_requests_total") or 0) >= signal_after
                               for e in engines.values()), 60)
        aborted_before = {n: engine_metric(e.url, "sglang:num_aborted_requests_total") for n, e in engines.items()}

        bench.proc.send_signal(sig)
        signalled_at, signalled_wall = time.monotonic(), time.time()
        # follow each engine's abort counter until the engine is stopped
        aborted_seen = dict(aborted_before)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(engine_metric(e.url, "sglang:num_requests_total") is not None
                                                  for e in engines.values()):
            for n, e in engines.items():
                value = engine_metric(e.url, "sglang:num_aborted_requests_total")
                if value is not None:
                    aborted_seen[n] = value
        engines_gone_s = time.monotonic() - signalled_at
        rc = bench.proc.wait(timeout=90)
        print(f"engines unreachable {engines_gone_s:.1f}s after {sig.name}, bench exited after "
              f"{time.monotonic() - signalled_at:.1f}s")
    finally:
        if bench.proc.poll() is None:
            bench.proc.kill()
            bench.proc.wait()

    print(f"SHUTDOWN {sig.name}: rc {rc}; aborted per engine {aborted_before} -> {aborted_seen}; "
          f"last line: {bench.lines[-1] if bench.lines else ''}")
    print("\n".join("  | " + line for line in bench.lines if line.startswith("[")))
    assert rc != 0, "an interrupted run must not exit 0"
    assert "interrupted" in bench.lines[-1], f"the reason must be the last line:\n{bench.output}"

    # engines stopped: no simulated server process of this run is left
    left = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    assert not left, f"engine processes left running after {sig.name}: {left}"

    # the partial result, with the reason
    doc = bench.result_json()
    assert doc["verdict"] == "INVALID"
    assert "interrupted during measured run" in doc["reason"], doc["reason"]
    assert len(doc["results"]) == num_prompts
    assert sorted(r["index"] for r in doc["results"]) == list(range(num_prompts))
    counts = doc["counts"]
    assert counts["completed"] + counts["failed"] == num_prompts
    assert counts["failed"] > 0, "a run interrupted mid-way cannot have finished every prompt"
    # nothing lost: every prompt the decode engine finished is completed, with its timings; every other
    # prompt failed with a reason naming the phase and the signal
    engine_finished = sim_engines_finished(doc, "decode")
    written_s = (bench.result_dir / doc["run_id"] / "result.json").stat().st_mtime - signalled_wall
    print(f"KEPT {sig.name}: result.json completed {counts['completed']} / failed {counts['failed']} of "
          f"{num_prompts}, written {written_s:.2f}s after the signal; the decode engine's own tally: "
          f"{engine_finished} finished (not aborted)")
    assert counts["completed"] > 0, f"the prompts finished before {sig.name} were dropped: {counts}"
    assert counts["completed"] == engine_finished, "result.json and the decode engine disagree"
    ok = [r for r in doc["results"] if r["status"] == "ok"]
    assert all(r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] and r["completion_tokens"] == r["output_len"]
               for r in ok), ok[:3]
    reasons = {r["error"] for r in doc["results"] if r["status"] == "failed"}
    assert all(f"interrupted during measured run: received {sig.name}" in reason for reason in reasons), reasons
    summary = doc["summary"]  # throughput over the time the run ran, not zero
    assert summary["successful_requests"] == counts["completed"] and summary["output_throughput"] > 0
    assert re.search(rf"prompts\s+{counts['completed']}/{num_prompts}\b", bench.output), "the live view's last frame"
    report = (bench.result_dir / doc["run_id"] / "report.html").read_text()
    assert f"{counts['completed']} / {counts['failed']}" in report, "the HTML report shows the partial run"

    # in-flight requests aborted (each engine counted aborts before it was stopped). Every in-flight
    # request has a live decode leg, so the decode must count aborts; a prefill leg ends once its KV is
    # sent, so at the signal every in-flight request may already be past prefill (its count is printed).
    not_aborted = [n for n in engines if n.startswith("decode")
                   and (aborted_seen[n] or 0) <= (aborted_before[n] or 0)]
    assert not not_aborted, (f"no in-flight request was aborted on {not_aborted} "
                             f"(sglang:num_aborted_requests_total {aborted_before} -> {aborted_seen})")


@pytest.fixture(scope="module")
def pd2x2_module(ray_driver, tmp_path_factory) -> list[Deployment]:
    """2 prefill + 2 decode sim workers (cpu-fast, slowed x20 so a batch takes seconds) and the router."""
    from ray import serve

    cfg = sim_config(
        {
            "name": "faults",
            "engine.sim.time_scale": 20.0,
            "router.request_timeout_s": LEG_TIMEOUT_S,
            "router.max_attempts": 4,
        },
        prefill=[{"count": 2, "tp": 1}],
        decode=[{"count": 2, "tp": 1}],
        tmp_dir=tmp_path_factory.mktemp("faults"),
    )
    holder: list[Deployment] = []
    try:
        holder.append(deploy_2x2(cfg, ray_driver))
        yield holder
    finally:
        serve.shutdown()


@pytest.fixture
def pd2x2(pd2x2_module: list[Deployment]) -> Deployment:
    """The module's deployment as every test expects it: 2 prefills and 2 decodes in the router's view, all
    answering, none other. A test that failed mid-recovery (a killed worker not yet replaced) must not hand its
    dead worker to the next test: if the view does not settle within RECOVERY_S, everything is deployed afresh."""
    from ray import serve

    dep = pd2x2_module[0]
    try:
        wait_until(dep.settled, RECOVERY_S, poll_s=1.0, what="2 live prefills + 2 live decodes in the router's view")
    except AssertionError as exc:
        print(f"  deployment not settled before the test ({exc}); deploying it afresh")
        serve.shutdown()
        pd2x2_module[0] = dep = deploy_2x2(dep.cfg, dep.cluster)
    return dep


def make_batch(n: int = BATCH_SIZE) -> list[BenchRequest]:
    """Prompts of 40..160 tokens, 24..56 output tokens: varied like ShareGPT, small enough for CI."""
    return [
        BenchRequest(index=i, input_ids=[(7 * i + j) % 1000 + 1 for j in range(40 + (i * 37) % 121)],
                     output_len=24 + (i * 13) % 33)
        for i in range(n)
    ]


@dataclass
class RunOutcome:
    """One batch's results and when it started, was faulted, ended and had to end (wall clock, time.time())."""

    results: list[RequestResult]
    deadline_at: float
    ended_at: float
    started_at: float
    fault_at: float

    @property
    def completed(self) -> int:
        return sum(r.status == "ok" for r in self.results)

    @property
    def failed(self) -> int:
        return sum(r.status == "failed" for r in self.results)

    @property
    def retried(self) -> int:
        return sum(r.attempts > 1 for r in self.results)

    def summary(self, fault: str) -> str:
        reasons = Counter((r.error or "").split(":")[0] for r in self.results if r.status == "failed")
        return (
            f"FAULT {fault}: batch {len(self.results)}, completed {self.completed}, failed {self.failed}"
            f"{' ' + dict(reasons).__repr__() if reasons else ''}, retried {self.retried}, "
            f"max attempts {max(r.attempts for r in self.results)}, "
            f"took {self.ended_at - self.started_at:.1f}s of a {DEADLINE_S:.0f}s deadline"
        )


def run_batch_with_fault(dep: Deployment, inject, batch: list[BenchRequest] | None = None) -> RunOutcome:
    """Stream a batch through the router; call `inject()` once INJECT_AFTER results are back."""
    batch = batch or make_batch()
    started = time.time()
    deadline_at = started + DEADLINE_S
    stream = dep.router.options(stream=True).generate_batch.remote(batch, MAX_IN_FLIGHT, deadline_at)
    results: list[RequestResult] = []
    fault_at = None
    for result in stream:
        results.append(result)
        if len(results) == INJECT_AFTER:
            fault_at = time.time()
            inject()
    assert fault_at is not None, f"the batch ended after {len(results)} results, before the fault was injected"
    return RunOutcome(results, deadline_at, time.time(), started, fault_at)


def assert_every_prompt_accounted_for_once(out: RunOutcome, batch_size: int = BATCH_SIZE) -> None:
    indices = [r.index for r in out.results]
    assert len(indices) == len(set(indices)), f"reported twice: {[i for i, c in Counter(indices).items() if c > 1]}"
    assert sorted(indices) == list(range(batch_size)), "some prompts were never reported"
    assert out.completed + out.failed == batch_size
    assert out.ended_at < out.deadline_at, "the run ended after its deadline"


def assert_every_prompt_completed(out: RunOutcome) -> None:
    failed = {r.index: r.error for r in out.results if r.status != "ok"}
    assert not failed, f"with a spare pair every prompt should complete; failed: {failed}"
    short = [r.index for r in out.results if r.completion_tokens != r.output_len]
    assert not short, f"completed prompts with the wrong number of output tokens: {short}"


def kill_engine(dep: Deployment, endpoint: WorkerEndpoint) -> int:
    """SIGKILL the engine process serving `endpoint` (found by its listening port); returns its PID."""
    port = urlsplit(endpoint.url).port
    pid = pid_listening_on(port, cluster_pids(dep.cluster))
    assert pid is not None, f"no process of the local cluster listens on {endpoint.url} ({endpoint.name})"
    os.kill(pid, signal.SIGKILL)
    return pid


def post_faults(url: str, spec: dict) -> None:
    r = httpx.post(url + "/sim/faults", json=spec, timeout=10)
    assert r.status_code == 200, r.text


def wait_replaced(dep: Deployment, killed: WorkerEndpoint) -> float:
    """Serve restarted the killed worker and the router's view follows: the dead URL is gone, all healthy.

    Returns the seconds it took (printed, quoted in docs/reliability.md).
    """
    start = time.monotonic()
    view: list[WorkerEndpoint] = []
    while time.monotonic() - start < RECOVERY_S:
        view = dep.workers()
        if killed.url not in {w.url for w in view} and Counter(w.role for w in view) == dep.expected:
            dep.wait_all_healthy()
            took = time.monotonic() - start
            print(f"  {killed.name} replaced by Serve and back in the router's view after {took:.1f}s")
            return took
        time.sleep(1.0)
    import ray
    from ray import serve

    from orchestrator.cluster.registry import get_registry

    version, registered = ray.get(get_registry().snapshot.remote(), timeout=30)
    replicas = {name: {d: dict(st.replica_states) for d, st in app.deployments.items()}
                for name, app in serve.status().applications.items()}
    raise AssertionError(
        f"{killed.name} ({killed.url}) was killed {RECOVERY_S:.0f}s ago but the router still sees: "
        + ", ".join(f"{w.name}={w.url}" for w in sorted(view, key=lambda w: w.name))
        + f"; registry v{version}: " + ", ".join(f"{w.name}={w.url}" for w in sorted(registered, key=lambda w: w.name))
        + f"; Serve replicas: {replicas}"
    )


def kill_mid_run_and_recover(dep: Deployment, role: str) -> None:
    """SIGKILL the first engine of `role` mid-batch: every prompt still completes, and Serve replaces it."""
    victim = dep.worker(sorted(w.name for w in dep.workers() if w.role == role)[0])
    killed: list[int] = []
    out = run_batch_with_fault(dep, lambda: killed.append(kill_engine(dep, victim)))
    print(out.summary(f"{role} engine {victim.name} SIGKILLed (pid {killed[0]})"))
    assert_every_prompt_accounted_for_once(out)
    assert_every_prompt_completed(out)
    # in flight at the kill on the victim: retried elsewhere, or (a prefill whose KV was already sent) finished
    met = assert_fault_hit_prompts(out.results, out.fault_at, on_path=lambda r: r.attempts > 1 or victim.name in (
        r.prefill_worker, r.decode_worker))
    print(hit_line(f"{role} engine SIGKILLed", met, 0.0))
    assert out.retried >= 1, f"no request was in flight on the killed {role}; the test did not test anything"
    wait_replaced(dep, victim)


def test_decode_killed_mid_run(pd2x2: Deployment) -> None:
    kill_mid_run_and_recover(pd2x2, "decode")


def test_prefill_killed_mid_run(pd2x2: Deployment) -> None:
    kill_mid_run_and_recover(pd2x2, "prefill")


def test_hung_kv_transfer_is_timed_out_and_retried(pd2x2: Deployment) -> None:
    victim = pd2x2.worker(sorted(w.name for w in pd2x2.workers() if w.role == "prefill")[0])
    try:
        out = run_batch_with_fault(pd2x2, lambda: post_faults(victim.url, {"hang": "transfer"}))
    finally:
        post_faults(victim.url, {})
    print(out.summary(f"prefill {victim.name} never sends KV (hang=transfer), leg timeout {LEG_TIMEOUT_S:g}s"))
    assert_every_prompt_accounted_for_once(out)
    assert_every_prompt_completed(out)
    # the hang lasts from the injection to the end of the batch (reset in `finally`)
    met = assert_fault_hit_prompts(out.results, out.fault_at, out.ended_at,
                                   on_path=lambda r: r.attempts > 1 or r.prefill_worker == victim.name)
    print(hit_line("KV transfer hangs", met, out.ended_at - out.fault_at))
    assert out.retried >= 1, "no request met the hung prefill; the test did not test anything"
    slowest = max(r.e2e_s or 0.0 for r in out.results)
    # one attempt per request may wait out the leg timeout, never SGLang's 300 s
    assert slowest < DEADLINE_S


def test_five_percent_random_500s(pd2x2: Deployment) -> None:
    workers = pd2x2.workers()
    # Seeded streams (5% of 64 requests over 4 servers ~ 6 errors expected): one errs early, so "at least
    # one 500 happened" is certain whatever order requests arrive in, and no two engines err in lockstep.
    specs = {w.url: {"error_rate": 0.05, "seed": seed} for w, seed in zip(sorted(workers, key=lambda w: w.name),
                                                                          _seeds_with_spread_errors(len(workers)))}
    batch = make_batch(64)
    try:
        out = run_batch_with_fault(pd2x2, lambda: [post_faults(url, s) for url, s in specs.items()], batch)
    finally:
        for url in specs:
            post_faults(url, {})
    print(out.summary("5% of /generate answered HTTP 500 on every engine (error_rate=0.05)"))
    assert_every_prompt_accounted_for_once(out, len(batch))
    assert_every_prompt_completed(out)
    met = assert_fault_hit_prompts(out.results, out.fault_at, out.ended_at)  # every engine errs until the end
    print(hit_line("5% random HTTP 500", met, out.ended_at - out.fault_at))
    assert out.retried >= 1, "no 500 was met; the test did not test anything"


def _seeds_with_spread_errors(n: int, draws: int = 48, first_within: int = 6, apart: int = 4,
                              rate: float = 0.05) -> list[int]:
    """`n` seeds for FaultInjector's stream: the first errs within `first_within` requests (so a 500 surely
    happens), and no error of one engine falls within `apart` requests of another engine's.

    Engines of a role see about the same number of requests, so streams that err at the same counts
    (seeds 6, 9, 12 and 15 all err on their 5th request) answer 500 together: a request retried on the
    other engines meets their errors too and can fail every attempt. Real 5% faults are independent.
    """
    import random

    def errors(seed: int) -> list[int]:
        rng = random.Random(seed)
        return [i for i in range(draws) if rng.random() < rate]

    seeds: list[int] = []
    taken: list[int] = []
    seed = 0
    while len(seeds) < n:
        found = errors(seed)
        early_enough = bool(seeds) or (found and found[0] < first_within)
        if found and early_enough and all(abs(i - j) >= apart for i in found for j in taken):
            seeds.append(seed)
            taken.extend(found)
        seed += 1
    return seeds


def test_router_follows_a_registry_that_was_lost(pd2x2: Deployment) -> None:
    """The registry actor dies (an OOM kill, its node lost): the replicas re-register with a new one at their next
    health check, and the router must follow the new registry, not keep its last view for good (then a replaced
    worker would never reach it and its dead predecessor would stay listed)."""
    import ray

    from orchestrator.cluster.registry import get_registry

    ray.kill(get_registry())
    probe = WorkerEndpoint(role="decode", name="probe/0", url="http://127.0.0.1:9")  # registered after the loss

    def registered_in_a_new_registry() -> bool:
        try:
            ray.get(get_registry().register.remote(probe), timeout=10)
        except ray.exceptions.RayError:  # the killed one may still answer to its name for a moment
            return False
        return True

    wait_until(registered_in_a_new_registry, 30, poll_s=0.5, what="a new registry to take a registration")
    try:
        wait_until(lambda: probe.name in {w.name for w in pd2x2.workers()}, 30, poll_s=0.5,
                   what="the router to follow the new registry")
        wait_until(lambda: Counter(w.role for w in pd2x2.workers() if w.name != probe.name) == pd2x2.expected,
                   60, poll_s=1.0, what="every live worker re-registered with the new registry")
    finally:
        ray.get(get_registry().unregister.remote(probe.name), timeout=10)
    print("  registry lost and re-created: the router followed the new one")
